"""Runners of the NIC cocotb + Verilator benches (one Verilator build per design): a short run of
each in the default suite, and the NIC fuzz (``-m slow``, not in CI) — about 100,000 packets
through each engine's bench, malformed ones mixed in; every good packet is checked bit-exact at
every destination and every status counter exactly, and no run may hang (every wait is bounded).

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

    pytest -m slow tests/test_nic_cocotb.py
"""

from __future__ import annotations

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mcf import sim
from mcf.hdl.tops import TOPS


def sizes(default, fuzz):
    """The default run's size, and the fuzz run's (marked slow)."""
    values = fuzz if isinstance(fuzz, tuple) else (fuzz,)
    return [default, pytest.param(*values, marks=pytest.mark.slow, id="fuzz")]


def _run(name: str, bench: str, params) -> None:
    """The bench ``bench`` on the top ``TOPS[name]`` (built under that name, width-checked),
    with the parameters ``params(inner)`` of its inner component."""
    top = TOPS[name]()
    sim.run(sim.build(top, name, width_warnings=True), f"mcf.sim.benches.{bench}",
            params=params(top.inner))


@pytest.mark.parametrize("n_packets", sizes(1500, 25_000))
def test_router_cocotb(n_packets):
    _run("nic_router", "nic_router", lambda router: {
        "n_ports": router.n_ports, "n_inputs": router.n_inputs, "data_width": 64,
        "max_payload": router.max_payload, "n_packets": n_packets})


@pytest.mark.parametrize("n_tags", sizes(300, 6500))
def test_reduce_cocotb(n_tags):
    _run("nic_reduce", "nic_reduce", lambda eng: {
        "n_slots": eng.n_slots, "max_payload": eng.max_payload, "n_tags": n_tags})


@pytest.mark.parametrize("n_packets, n_inject", sizes((200, 60), (25_000, 5_000)))
def test_link_cocotb(n_packets, n_inject):
    _run("nic_link_loop", "nic_link", lambda loop: {
        "data_width": loop.data_width, "max_payload": loop.max_payload,
        "n_packets": n_packets, "n_inject": n_inject})


@pytest.mark.parametrize("n_tags, n_scatter", sizes((8, 10), (1050, 1900)))
def test_all_to_all_cocotb(n_tags, n_scatter):
    _run("nic_all_to_all", "nic_a2a", lambda eng: {
        "data_width": 64, "max_nodes": 8, "part_max": eng.part_max, "n_slots": eng.n_slots,
        "n_tags": n_tags, "n_scatter": n_scatter})


class _WidenedShift(wiring.Component):
    """A 1-bit value shifted into a 64-bit context (the pattern the link model had): Verilator
    widens it by context, which ``width_warnings`` must report."""

    def __init__(self):
        super().__init__({"a": In(1), "n": In(6), "y": Out(64)})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.y.eq(self.a << self.n)
        return m


def test_width_warnings_fail_a_build_and_stay_per_build():
    with pytest.raises(sim.ToolchainError, match="WIDTHEXPAND"):
        sim.build(_WidenedShift(), "nic_width_check", width_warnings=True)
    sim.build(_WidenedShift(), "nic_width_check")      # default: other builds are unaffected
