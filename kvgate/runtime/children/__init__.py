"""Child processes with an explicit lifecycle (``child``), the programs wheels ship
(``executables``), etcd and Envoy started from them, and the loopback ports they listen on."""
