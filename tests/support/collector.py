"""What the control plane's collector streams (WatchFleetLoad), for tests that check it."""

from __future__ import annotations

import grpc

from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate.admin_api.v1 import admin_pb2_grpc
from kvgate.config.model import HostPort


async def residency_of(admin: HostPort, session: str) -> dict[str, int | None]:
    """What the collector's stream says of ``session``: engine → tokens (None: unknown)."""
    return {e: tokens for e, (tokens, _) in (await stored_of(admin, session)).items()}


async def stored_of(admin: HostPort, session: str) -> dict[str, tuple[int | None, int]]:
    """What the collector's stream says of ``session``: engine → (tokens held, None: unknown;
    tokens it last stored there, 0: not known)."""
    async with grpc.aio.insecure_channel(str(admin)) as channel:
        call = admin_pb2_grpc.AdminStub(channel).WatchFleetLoad(pb.WatchFleetLoadRequest())
        async for frame in call:
            assert frame.residency_full  # a stream's first message carries all of it
            call.cancel()
            return {r.endpoint: (None if r.unknown else int(r.tokens), int(r.stored))
                    for r in frame.residency if r.session == session}
    return {}
