"""The NIC bench (mcf.sim.perf.nic): figures from golden-checked runs, and refusal of every
misconfiguration that makes an engine drop (amaranth.sim, ~15 s)."""

from __future__ import annotations

import pytest

from mcf.abi.meta import ReduceOp
from mcf.abi.route import route_entry
from mcf.sim.perf import BenchRefused, nic


@pytest.fixture(scope="module")
def small():
    return nic.collect(small=True, synth=False)


def test_small_run_reports_checked_figures(small):
    assert small["multicast"]["beats_per_cycle"] == 1.0
    assert small["multicast"]["hop_latency_cycles"] == 2
    assert small["multicast"]["beats_per_cycle_1beat"] == 1.0
    assert small["multicast"]["packet_slots"] == 4
    assert small["reduction"]["elements_per_cycle_per_lane"] == 1.0
    assert small["reduction"]["lanes"] == 2
    assert small["link"]["payload_beats_per_cycle"] == pytest.approx(8 / 11, abs=1e-3)
    assert small["all_to_all"]["scatter_beats_per_cycle"] == 1.0
    assert small["all_to_all"]["gather_beats_per_cycle"] >= 0.98
    assert "resources" not in small
    text = nic.render(small)
    assert "gather beats/cycle" in text and "1-beat pkts" in text


def test_one_beat_injection_needs_the_fourth_slot():
    """3 packet slots: a 1-beat packet holds its slot 2 cycles and injection needs 2 free."""
    assert nic.router_rate(n_beats=1, n_packets=60, packet_slots=3)["beats_per_cycle"] < 0.7
    assert nic.router_rate(n_beats=2, n_packets=60, packet_slots=3)["beats_per_cycle"] == 1.0


def test_gather_at_line_rate_with_three_slots_and_eight_nodes():
    r = nic.a2a_rate(n=8, part_beats=2, n_ops=12, n_slots=3)
    assert r["gather_beats_per_cycle"] >= 0.98
    assert r["scatter_beats_per_cycle"] == 1.0


@pytest.mark.parametrize("kw, counter", [
    ({"k": 0}, "drop_no_config"),
    ({"reduce_op": ReduceOp.NONE}, "drop_bad_op"),
    ({"k": 3}, "drop_no_slot"),                  # k above the contributors: slots never free
])
def test_reduction_misconfiguration_is_refused(kw, counter):
    with pytest.raises(BenchRefused, match=counter):
        nic.reduce_rate(n_packets=16, **kw)


@pytest.mark.parametrize("num_nodes, counter", [(3, "scatter_drops"), (5, "scatter_drops"),
                                                (2, "drop_bad_src")])
def test_all_to_all_wrong_node_count_is_refused(num_nodes, counter):
    with pytest.raises(BenchRefused, match=counter):
        nic.a2a_rate(n=4, n_ops=4, num_nodes=num_nodes)


@pytest.mark.parametrize("kw, counter", [
    ({"route": route_entry(set())}, "drop_no_route"),
    ({"route": route_entry({3}), "n_ports": 2}, "drop_bad_port"),
    ({"length": 4096}, "drop_oversize"),
])
def test_router_route_that_drops_is_refused(kw, counter):
    with pytest.raises(BenchRefused, match=counter):
        nic.router_rate(n_packets=8, **kw)
