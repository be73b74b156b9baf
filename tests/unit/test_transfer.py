"""The DDR transfer model: fair sharing, fixed cost, node and pool aggregates, traffic records."""

from __future__ import annotations

import math

import pytest

from emulator.transfer import GB, TransferModel, TransferParams


def _run(model: TransferModel) -> dict[int, float]:
    """Every transfer's ready time, letting the model run to the end."""
    ready: dict[int, float] = {}
    while (t := model.next_done()) < math.inf:
        ready.update(model.finish_due(t))
    return ready


def test_a_transfer_alone_takes_its_bytes_over_its_link_plus_the_fixed_cost() -> None:
    model = TransferModel(TransferParams(device_gbps=20, node_gbps=None, fixed_ms=5))
    tid = model.start(10.0, device=3, nbytes=4 * GB)
    assert _run(model) == {tid: pytest.approx(10.0 + 0.2 + 0.005)}
    assert model.bytes_moved == pytest.approx(4 * GB)


def test_transfers_on_one_device_share_it_and_the_survivor_speeds_up() -> None:
    model = TransferModel(TransferParams(device_gbps=20, node_gbps=None, fixed_ms=0))
    small = model.start(0.0, 0, 2 * GB)
    big = model.start(0.0, 0, 6 * GB)
    ready = _run(model)
    # 10 GB/s each until the small one is done at 0.2 s; then the big one's last 4 GB at 20 GB/s.
    assert ready[small] == pytest.approx(0.2)
    assert ready[big] == pytest.approx(0.4)


def test_a_later_transfer_slows_the_one_in_flight() -> None:
    model = TransferModel(TransferParams(device_gbps=10, node_gbps=None, fixed_ms=0))
    first = model.start(0.0, 0, 10 * GB)  # alone: done at 1.0 s
    assert model.next_done() == pytest.approx(1.0)
    second = model.start(0.5, 0, 10 * GB)
    ready = _run(model)
    # first: 5 GB alone, then 5 GB at 5 GB/s -> 1.5 s; second: 5 GB shared, 5 GB alone -> 2.0 s
    assert ready[first] == pytest.approx(1.5)
    assert ready[second] == pytest.approx(2.0)


def test_the_node_aggregate_caps_a_busy_node_and_not_its_neighbour() -> None:
    params = TransferParams(device_gbps=20, node_gbps=80, devices_per_node=8, fixed_ms=0)
    model = TransferModel(params)
    busy = [model.start(0.0, device, 8 * GB) for device in range(8)]  # node 0: 10 GB/s each
    other = model.start(0.0, 8, 8 * GB)  # node 1, alone: 20 GB/s
    ready = _run(model)
    assert all(ready[t] == pytest.approx(0.8) for t in busy)
    assert ready[other] == pytest.approx(0.4)


def test_sharing_is_max_min_fair_across_device_and_node_links() -> None:
    # Device 0 carries two transfers, device 1 one; node cap 40, device cap 20: the pair is held
    # to 10 GB/s each by its device link, and the lone transfer gets the node's rest, 20 GB/s.
    model = TransferModel(TransferParams(device_gbps=20, node_gbps=40, fixed_ms=0))
    pair = [model.start(0.0, 0, 10 * GB), model.start(0.0, 0, 10 * GB)]
    lone = model.start(0.0, 1, 10 * GB)
    ready = _run(model)
    assert ready[lone] == pytest.approx(0.5)
    assert all(ready[t] == pytest.approx(1.0) for t in pair)


def test_a_pool_wide_aggregate_couples_every_node() -> None:
    params = TransferParams(device_gbps=20, node_gbps=None, pool_gbps=20, devices_per_node=1,
                            fixed_ms=0)
    model = TransferModel(params)
    a, b = model.start(0.0, 0, 10 * GB), model.start(0.0, 5, 10 * GB)
    ready = _run(model)
    assert ready[a] == pytest.approx(1.0) and ready[b] == pytest.approx(1.0)


def test_estimate_prices_a_transfer_at_the_share_it_would_get() -> None:
    model = TransferModel(TransferParams(device_gbps=20, node_gbps=None, fixed_ms=2))
    assert model.estimate(0.0, 0, 2 * GB) == pytest.approx(0.102)
    model.start(0.0, 0, 100 * GB)
    assert model.estimate(0.0, 0, 2 * GB) == pytest.approx(0.202)  # half the link
    assert model.estimate(0.0, 9, 2 * GB) == pytest.approx(0.102)  # another device, no node cap
    assert len(model) == 1  # nothing was started


def test_a_reduced_bandwidth_factor_slows_transfers_in_flight() -> None:
    model = TransferModel(TransferParams(device_gbps=10, node_gbps=None, fixed_ms=0))
    tid = model.start(0.0, 0, 10 * GB)
    model.set_factor(0.5, 0.5)  # 5 GB moved; the other 5 at 5 GB/s
    assert _run(model)[tid] == pytest.approx(1.5)
    with pytest.raises(ValueError, match="factor"):
        model.set_factor(2.0, 0.0)


def test_traffic_is_recorded_per_node_and_window() -> None:
    params = TransferParams(device_gbps=10, node_gbps=None, devices_per_node=2, fixed_ms=0)
    model = TransferModel(params, bin_s=1.0)
    model.start(0.5, 0, 10 * GB)  # node 0, 0.5 .. 1.5 s
    model.start(0.0, 2, 20 * GB)  # node 1, 0 .. 2 s
    _run(model)
    assert model.traffic.pool_gbps(0.0, 2.0) == pytest.approx([15.0, 15.0])
    utilisation = model.traffic.node_utilisation(2, params.node_capacity_gbps, 0.0, 2.0)
    assert utilisation == pytest.approx([0.25, 0.25, 0.5, 0.5])
    assert model.bytes_moved == pytest.approx(30 * GB)


def test_bad_parameters_are_named() -> None:
    with pytest.raises(ValueError, match="devices_per_node"):
        TransferModel(TransferParams(devices_per_node=0))
