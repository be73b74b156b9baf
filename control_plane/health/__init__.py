"""Active health checking of the engines; states published to etcd for every ext_proc."""

from control_plane.health.checker import HealthChecker
from control_plane.health.tracker import HealthTracker

__all__ = ["HealthChecker", "HealthTracker"]
