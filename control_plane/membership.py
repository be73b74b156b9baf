"""What a replica says when its file is not the endpoint membership etcd holds (a start never
overwrites etcd's; a reload does)."""

from __future__ import annotations

from kvgate.config import Config
from kvgate.endpoints import membership_digest
from kvgate.endpoints.membership import StoredMembership


def membership_fields(stored: StoredMembership | None) -> dict[str, object]:
    """The log fields of a start whose file differs from etcd's membership."""
    return {"generation": None if stored is None else stored.generation,
            "written_by": None if stored is None else stored.by,
            "hint": "this replica's file was not written to etcd; reload it (kill -HUP or "
                    "edit the file) to make it the fleet's membership"}


def membership_warning(stored: StoredMembership | None, config: Config) -> str | None:
    """`kvgate status`'s warning while `config` is not etcd's membership (None: it is)."""
    if stored is None or stored.digest == membership_digest(config):
        return None
    return (f"this replica's file differs from etcd's endpoint membership (generation "
            f"{stored.generation}, written by {stored.by or '?'}), which is what Envoy and "
            "ext_proc use; reload this replica (kill -HUP or edit its file) to make its "
            "file the fleet's membership")
