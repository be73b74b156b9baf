"""Running kvgate's parts as child processes: etcd, Envoy, ext_proc, the emulated fleet."""
