"""Engines found at run time (`pools[].discover`): DNS names and etcd registrations, reconciled
into each pool's engine set (kvgate.discovery.reconcile)."""
