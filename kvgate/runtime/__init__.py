"""Running kvgate's parts: ``children`` starts and stops them as child processes (etcd, Envoy,
ext_proc, the emulated fleet; their executables and loopback ports); ``tasks`` runs what lives
inside one process (the event loop, a service's lifetime, its supervised background tasks, a
component's entry point, the garbage collector paused for batch work)."""
