"""NIC fuzz (slow, not in CI): about 100,000 packets through each of the cocotb + Verilator benches
of the NIC engines, malformed ones mixed in; every good packet is checked bit-exact at every
destination and every status counter exactly, and no run may hang (every wait is bounded).

* router: 4 idle × backpressure runs of 25,000 packets (100,000): random routes incl.
  multicast to 1..4 ports + local, zero-length and maximum packets, oversize and unrouted ones.
* reduction: 4 runs of 6,500 tags: 102,240 contributions in all, malformed ones mixed in.
* link: 4 runs of 25,000 packets (100,000) through LinkTx → link model (~4.6 % frames dropped,
  ~7.6 % with a bit flipped) → LinkRx, plus 4 × 5,000 hand-made frames into a second LinkRx
  (every drop cause: CRC, runt / bad magic, oversize, stale / duplicate, gaps).
* all-to-all: 12 runs (N ∈ {2, 4, 8} × idle × backpressure) of 1,900 scatter requests and
  1,050 gathers: 22,800 scatter requests + 79,754 arriving parts = 102,554 packets in (with
  duplicates, foreign sources, bad lengths, NO_SLOT refusals; 89,538 parts and 12,600 tensors
  out), watchdog at the end of each run.

Wall time on the shared 2-core machine (load ~4): router 767 s, link 382 s, all-to-all 250 s,
reduction 115 s; 25 min in all.

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
        "n_slots": e.n_slots, "max_payload": e.max_payload, "n_tags": 6500})


@pytest.mark.slow
def test_link_fuzz_100k():
    top = TOPS["nic_link_loop"]()
    loop = top.inner
    sim.run(sim.build(top, "nic_link_loop"), "mcf.sim.benches.nic_link", params={
        "data_width": loop.data_width, "max_payload": loop.max_payload,
        "n_packets": 25_000, "n_inject": 5_000})


@pytest.mark.slow
def test_all_to_all_fuzz_100k():
    top = TOPS["nic_all_to_all"]()
    eng = top.inner
    sim.run(sim.build(top, "nic_all_to_all"), "mcf.sim.benches.nic_a2a", params={
        "data_width": 64, "max_nodes": 8, "part_max": eng.part_max, "n_slots": eng.n_slots,
        "n_tags": 1050, "n_scatter": 1900})
