#!/bin/sh
# Certificates for TLS between kvgate and etcd: a private CA, etcd's certificate (server and
# peer), and kvgate's client certificate. POSIX sh + openssl; nothing else.
#
#   deploy/tls/make-etcd-certs.sh OUT_DIR NAME...
#
# NAME: every DNS name or IP address kvgate and the etcd members use to reach etcd (the
# certificate's subjectAltName), e.g. `etcd localhost 127.0.0.1` for docker-compose.yml.
# Writes OUT_DIR/ca.pem, etcd.pem, etcd-key.pem, client.pem, client-key.pem (keys mode 0600).
# The CA's key is thrown away: run it again for new certificates. Does nothing if OUT_DIR
# already holds them. Environment: DAYS (validity, default 825), CLIENT_UID (chown the client
# files to this uid, for a container that runs as another user).
set -eu

if [ "$#" -lt 2 ]; then
    echo "usage: $0 OUT_DIR NAME..." >&2
    exit 2
fi
out=$1
shift
days=${DAYS:-825}

if [ -f "$out/ca.pem" ] && [ -f "$out/etcd.pem" ] && [ -f "$out/client.pem" ]; then
    echo "$out: certificates already there; nothing done"
    exit 0
fi
mkdir -p "$out"
umask 077
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

san=""
for name in "$@"; do
    case $name in
        *:*) entry="IP:$name" ;;  # IPv6
        *[!0-9.]*) entry="DNS:$name" ;;  # anything but digits and dots is a name
        *) entry="IP:$name" ;;
    esac
    san="${san:+$san,}$entry"
done

openssl req -x509 -new -nodes -newkey rsa:2048 -sha256 -days "$days" \
    -keyout "$work/ca-key.pem" -out "$out/ca.pem" -subj "/CN=kvgate etcd CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null

issue() {  # issue NAME CN EXTENDED_KEY_USAGE [SAN]
    openssl req -new -nodes -newkey rsa:2048 -sha256 -keyout "$out/$1-key.pem" \
        -out "$work/$1.csr" -subj "/CN=$2" 2>/dev/null
    {
        echo "basicConstraints=critical,CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        echo "extendedKeyUsage=$3"
        if [ -n "${4:-}" ]; then echo "subjectAltName=$4"; fi
    } > "$work/$1.ext"
    openssl x509 -req -in "$work/$1.csr" -CA "$out/ca.pem" -CAkey "$work/ca-key.pem" \
        -CAcreateserial -CAserial "$work/ca.srl" -days "$days" -sha256 \
        -extfile "$work/$1.ext" -out "$out/$1.pem" 2>/dev/null
}

# etcd's certificate serves clients and peers, and is a client of its peers.
issue etcd etcd serverAuth,clientAuth "$san"
# kvgate's: a client only. With etcd's --client-cert-auth, only certificates this CA signed
# get in; the etcd user (etcd.auth) is what limits it to kvgate's prefix.
issue client kvgate clientAuth
chmod 0644 "$out/ca.pem" "$out/etcd.pem" "$out/client.pem"
chmod 0600 "$out/etcd-key.pem" "$out/client-key.pem"
if [ -n "${CLIENT_UID:-}" ]; then
    chown "$CLIENT_UID" "$out/client.pem" "$out/client-key.pem"
fi
echo "$out: ca.pem, etcd.pem, etcd-key.pem (for $san), client.pem, client-key.pem"
