"""NIC fuzz (slow, not in CI): >= 100,000 packets through the cocotb + Verilator benches of the
router (4 idle × backpressure runs of 25,000 packets: random routes incl. multicast to 1..4
ports + local, zero-length and maximum packets, oversize and unrouted ones mixed in) and of the
reduction engine (4 runs of 4,000 tags, about 14,000 contributions each, malformed ones mixed
in). Every good packet is checked bit-exact at every destination and every counter exactly.

    pytest -m slow tests/test_nic_fuzz.py
"""

from __future__ import annotations

import pytest

from mcf.hdl.tops import TOPS

sim = pytest.importorskip("mcf.sim.toolchain")


@pytest.mark.slow
def test_router_fuzz_100k():
    top = TOPS["nic_router"]()
    r = top.inner
    sim.run(sim.build(top, "nic_router"), "mcf.sim.benches.nic_router", params={
        "n_ports": r.n_ports, "n_inputs": r.n_inputs, "data_width": 64,
        "max_payload": r.max_payload, "n_packets": 25_000})


@pytest.mark.slow
def test_reduce_fuzz():
    top = TOPS["nic_reduce"]()
    e = top.inner
    sim.run(sim.build(top, "nic_reduce"), "mcf.sim.benches.nic_reduce", params={
        "n_slots": e.n_slots, "max_payload": e.max_payload, "n_tags": 4000})
