"""Bindings waiting for etcd (degraded mode): a bounded queue, flushed in batches.

A binding is queued when its hot-path write could not be made (etcd away, out of space, or
slower than the write deadline); the request is answered from memory all the same. The queue
is bounded (`ext_proc.max_pending_bindings`): when it is full a new session is not bound at all
(it is routed on Envoy's ring) rather than grow memory without limit while etcd is away.

A write that missed its deadline may still land (etcd applies a proposal the client gave up on,
as the new leader does after an election). The queue remembers what such a try sent: if the
flush finds exactly that in etcd, it is this replica's own write, not a peer's placement, and
the binding queued since (answered from, re-placed on Envoy's ring) replaces it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from kvgate.bindings.model import Binding
from kvgate.bindings.store import Unbound


@dataclass(frozen=True, slots=True)
class PendingWrite:
    binding: Binding
    expected_revision: int  # 0: create if absent; else: replace only if still at this revision


class PendingWrites:
    def __init__(self, limit: int) -> None:
        self._ops: dict[str, PendingWrite] = {}
        self._tries: dict[str, bytes] = {}  # what a try that may have landed sent, by binding
        self.limit = limit

    def __len__(self) -> int:
        return len(self._ops)

    def __contains__(self, key: object) -> bool:
        return key in self._ops

    def __iter__(self) -> Iterator[PendingWrite]:
        return iter(list(self._ops.values()))

    def add(self, op: PendingWrite, tried: bytes | None = None) -> PendingWrite:
        """Queues `op` (replacing a queued write of the same binding, whose expectation it
        keeps: that is what etcd must still hold for the move to apply). `tried`: the value a
        write of it sent that may have landed all the same. Raises Unbound when the queue is
        full."""
        key = op.binding.key
        earlier = self._ops.get(key)
        if earlier is not None:
            op = PendingWrite(op.binding, earlier.expected_revision)
        elif len(self._ops) >= self.limit:
            raise Unbound("pending_full", f"{len(self._ops)} bindings already wait for etcd "
                          f"(ext_proc.max_pending_bindings: {self.limit})")
        self._ops[key] = op
        if tried is not None:
            self._tries[key] = tried
        return op

    def landed_try(self, op: PendingWrite, value: bytes) -> bool:
        """etcd holds `value` where `op` was to go, and that is what this replica's own try of
        it sent (it landed after the try gave up), not a peer's write."""
        return self._ops.get(op.binding.key) is op and self._tries.get(op.binding.key) == value

    def replace_landed(self, op: PendingWrite, revision: int) -> None:
        """`op` stays queued, now replacing its own landed try (at `revision`)."""
        key = op.binding.key
        self._tries.pop(key, None)
        if self._ops.get(key) is op:
            self._ops[key] = PendingWrite(op.binding, revision)

    def oldest(self, count: int) -> list[PendingWrite]:
        found = []
        for op in self._ops.values():
            found.append(op)
            if len(found) == count:
                break
        return found

    def written(self, op: PendingWrite, revision: int | None) -> None:
        """`op` reached etcd (now at `revision`; None: etcd kept another binding). A newer write
        of the same binding queued meanwhile stays, now expecting what `op` left there."""
        key = op.binding.key
        current = self._ops.get(key)
        if current is op:
            del self._ops[key]
            self._tries.pop(key, None)
        elif current is not None and revision is not None:
            self._ops[key] = PendingWrite(current.binding, revision)

    def retry_as_create(self, op: PendingWrite) -> None:
        """The binding `op` was to replace is gone (expired): write it afresh."""
        if self._ops.get(op.binding.key) is op:
            self._ops[op.binding.key] = PendingWrite(op.binding, 0)
