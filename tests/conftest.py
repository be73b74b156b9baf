"""Shared fixtures: a real etcd from the wheel, tiny upstreams."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from kvgate.runtime.children.child import Child
from kvgate.runtime.children.etcd import embedded_etcd, etcd_ready
from tests.support.ports import free_ports
from tests.support.tiers import selects_serial_tier
from tests.support.upstreams import Upstream


def pytest_configure(config: pytest.Config) -> None:
    # Runs before pytest-xdist's own pytest_configure (trylast), which starts the workers only
    # while `dist` is on.
    if selects_serial_tier(config.option.markexpr or ""):
        config.option.dist = "no"
        config.option.tx = []
        config.option.numprocesses = 0


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test under tests/chaos is a chaos test, marked or not: it never slips into the default
    run by a forgotten mark."""
    chaos_dir = Path(__file__).parent / "chaos"
    for item in items:
        if chaos_dir in Path(item.path).parents and item.get_closest_marker("chaos") is None:
            item.add_marker(pytest.mark.chaos)


class EtcdServer:
    def __init__(self, workdir: Path, extra_args: tuple[str, ...] = ()) -> None:
        self.client_port, self.peer_port = free_ports(2)
        self.endpoint = f"127.0.0.1:{self.client_port}"
        self.child: Child = embedded_etcd(
            workdir / "etcd-data", self.client_port, self.peer_port, workdir / "etcd.log"
        )
        self.child.argv.extend(extra_args)

    async def start(self) -> None:
        await self.child.start()
        await self.child.wait_ready(lambda: etcd_ready(self.endpoint), 60)

    async def stop(self) -> None:
        await self.child.stop()


@pytest.fixture
async def etcd(tmp_path: Path) -> AsyncIterator[EtcdServer]:
    server = EtcdServer(tmp_path / "etcd")
    await server.start()
    yield server
    await server.stop()


ETCD_SMALL_QUOTA = 4 * 1024 * 1024


@pytest.fixture
async def small_etcd(tmp_path: Path) -> AsyncIterator[EtcdServer]:
    """A real etcd whose backend quota is only ETCD_SMALL_QUOTA bytes: NOSPACE within seconds."""
    server = EtcdServer(tmp_path / "etcd",
                        ("--quota-backend-bytes", str(ETCD_SMALL_QUOTA)))
    await server.start()
    yield server
    await server.stop()


@pytest.fixture(autouse=True)
def private_runtime_dir(tmp_path_factory: pytest.TempPathFactory,
                        monkeypatch: pytest.MonkeyPatch) -> Path:
    """Operator tokens (kvgate.admin_api.token_file) go to a folder of this test's own, never the
    real user's; child processes inherit it."""
    folder = tmp_path_factory.mktemp("runtime")
    folder.chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    return folder


@pytest.fixture
def prefix() -> str:
    return f"/kvgate/test-{uuid.uuid4().hex[:8]}/"


@pytest.fixture
async def upstreams() -> AsyncIterator[Callable[[int], Awaitable[list[Upstream]]]]:
    started: list[Upstream] = []

    async def start(count: int) -> list[Upstream]:
        batch = [Upstream() for _ in range(count)]
        for upstream in batch:
            await upstream.start()
        started.extend(batch)
        return batch

    yield start
    for upstream in started:
        await upstream.stop()
