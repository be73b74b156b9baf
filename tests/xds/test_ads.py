"""ADS against real Envoy: dynamic resources, ACK/NACK without resend loops, stale nonces."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from prometheus_client import CollectorRegistry

from control_plane.resources.bootstrap import ads_bootstrap, to_json
from control_plane.resources.snapshot import gateway_resources
from control_plane.resources.types import CLUSTER, LISTENER
from control_plane.xds.cache import SnapshotCache
from control_plane.xds.metrics import XdsMetrics
from control_plane.xds.server import AdsServer, NodeRegistry
from kvgate.config import Config
from kvgate.config.model import HostPort
from kvgate.runtime.children.envoy import envoy_child, envoy_ready
from tests.support.polling import eventually
from tests.support.stack import gateway_config, running_stack


async def test_envoy_receives_every_resource_over_ads_and_routes_sticky(
    tmp_path: Path, upstreams, prefix: str
) -> None:
    ups = await upstreams(3)
    config = gateway_config([u.address for u in ups], prefix=prefix)
    async with running_stack(config, tmp_path):
        async with httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=30) as http:
            dump = (await http.get(f"http://{config.envoy_admin}/config_dump")).json()
            text = str(dump)
            for name in ("kvgate_pool_coder", "kvgate_ext_proc", "kvgate_gateway",
                         "kvgate_routes"):
                assert name in text
            kinds = {c["@type"].rsplit(".", 1)[-1]: c for c in dump["configs"]}
            clusters = {c["cluster"]["name"] for c in kinds["ClustersConfigDump"]
                        .get("dynamic_active_clusters", [])}
            assert {"kvgate_pool_coder", "kvgate_ext_proc"} <= clusters
            listeners = kinds["ListenersConfigDump"]["dynamic_listeners"]
            assert [entry["name"] for entry in listeners] == ["kvgate_gateway"]
            routes = kinds["RoutesConfigDump"]["dynamic_route_configs"]
            assert routes[0]["route_config"]["name"] == "kvgate_routes"
            homes = set()
            for _ in range(5):
                reply = await http.get("/v1/x", headers={"x-session-id": "ads-1"})
                homes.add(reply.json()["upstream"])
            assert len(homes) == 1


class InProcessAds:
    def __init__(self) -> None:
        self.cache = SnapshotCache()
        self.registry = NodeRegistry()
        self.metrics = XdsMetrics(CollectorRegistry())
        self.server = grpc.aio.server()
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(
            AdsServer(self.cache, self.metrics, self.registry), self.server
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    def responses(self, kind: str) -> float:
        return self.metrics.responses.labels(kind)._value.get()


@pytest.fixture
async def ads() -> AsyncIterator[InProcessAds]:
    server = InProcessAds()
    await server.server.start()
    yield server
    await server.server.stop(0)


async def test_stale_nonce_is_ignored(ads: InProcessAds, upstreams) -> None:
    ups = await upstreams(1)
    config: Config = gateway_config([ups[0].address])
    await ads.cache.publish(gateway_resources(config))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{ads.port}") as channel:
        stream = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources()
        request = discovery_pb2.DiscoveryRequest(type_url=CLUSTER)
        request.node.id = "raw-client"
        await stream.write(request)
        first = await asyncio.wait_for(stream.read(), 30)
        assert first.nonce == "1" and len(first.resources) == 2
        # A request carrying an old/unknown nonce gets no answer; a real ACK gets none either.
        await stream.write(discovery_pb2.DiscoveryRequest(type_url=CLUSTER, response_nonce="x"))
        await stream.write(discovery_pb2.DiscoveryRequest(
            type_url=CLUSTER, response_nonce="1", version_info=first.version_info))
        await eventually(lambda: ads.metrics.stale._value.get() == 1, what="the stale nonce seen")
        await eventually(lambda: ads.registry.snapshot()[0].acked.get(CLUSTER)
                         == first.version_info, what="the ACK recorded")
        # Both were handled, and answered by nothing: the next response on the stream is the
        # push of a changed snapshot, with a rising nonce and a new version (an answer to either
        # request would have come first, with the old version).
        await ads.cache.publish(gateway_resources(
            gateway_config([ups[0].address, "127.0.0.1:1"])))
        pushed = await asyncio.wait_for(stream.read(), 30)
        assert pushed.nonce == "2" and pushed.version_info != first.version_info
        assert ads.metrics.stale._value.get() == 1
        node = ads.registry.snapshot()[0]
        assert node.node_id == "raw-client" and node.acked[CLUSTER] == first.version_info
        stream.cancel()


async def test_nack_is_recorded_and_not_resent(ads: InProcessAds, upstreams, tmp_path: Path):
    ups = await upstreams(1)
    config = gateway_config([ups[0].address])
    await ads.cache.publish(gateway_resources(config))
    bootstrap = tmp_path / "envoy.json"
    bootstrap.write_text(to_json(ads_bootstrap(config, "nack-test",
                                               xds=[HostPort("127.0.0.1", ads.port)])))
    envoy = envoy_child(bootstrap, tmp_path / "envoy.log")
    await envoy.start()
    try:
        await envoy.wait_ready(lambda: envoy_ready(config.envoy_admin), 30)
        good = ads.cache.current
        assert good is not None
        await eventually(lambda: any(n.acked.get(LISTENER) == good.versions[LISTENER]
                                      for n in ads.registry.snapshot()))
        # A cluster Envoy must reject: a negative connect timeout passes our consistency
        # check (it is not a reference problem) but fails Envoy's validation.
        bad = gateway_resources(config)
        broken = bad[CLUSTER]["kvgate_pool_coder"]
        broken.connect_timeout.seconds = -1  # type: ignore[attr-defined]
        await ads.cache.publish(bad)
        await eventually(lambda: any(n.last_nack for n in ads.registry.snapshot()))
        node = ads.registry.snapshot()[0]
        assert node.nacks == 1 and "Expected positive duration" in (node.last_nack or "")
        assert node.acked[CLUSTER] == good.versions[CLUSTER]  # Envoy kept the good one
        sent = ads.responses("CDS")
        # A new, valid snapshot is sent and accepted...
        fixed = await ads.cache.publish(gateway_resources(
            gateway_config([ups[0].address, "127.0.0.1:1"])))
        await eventually(lambda: ads.registry.snapshot()[0].acked.get(CLUSTER)
                          == fixed.versions[CLUSTER], what="the fixed snapshot ACKed")
        # ... and it is the only CDS response since the NACK: the rejected version was not sent
        # again (a resend loop answers each NACK at once, so it would have shown by now).
        assert ads.responses("CDS") == sent + 1
        assert ads.registry.snapshot()[0].nacks == 1
    finally:
        await envoy.stop()


async def test_many_envoys_at_once(ads: InProcessAds, upstreams, tmp_path: Path) -> None:
    ups = await upstreams(1)
    envoys = []
    try:
        for n in range(3):
            config = gateway_config([ups[0].address])
            if n == 0:
                await ads.cache.publish(gateway_resources(config))
            bootstrap = tmp_path / f"envoy-{n}.json"
            bootstrap.write_text(to_json(ads_bootstrap(
                config, f"gateway-{n}", xds=[HostPort("127.0.0.1", ads.port)])))
            envoy = envoy_child(bootstrap, tmp_path / f"envoy-{n}.log")
            envoys.append(envoy)
            await envoy.start()
            await envoy.wait_ready(lambda c=config: envoy_ready(c.envoy_admin), 30)
        changed = await ads.cache.publish(gateway_resources(
            gateway_config([ups[0].address, "127.0.0.1:1"])))
        await eventually(lambda: sorted(
            n.node_id for n in ads.registry.snapshot()
            if n.acked.get(CLUSTER) == changed.versions[CLUSTER]
        ) == ["gateway-0", "gateway-1", "gateway-2"])
    finally:
        for envoy in envoys:
            await envoy.stop()
