"""Formal proof (yowasp-sby, smtbmc + yices) of the CSR bank's AXI-Lite response-channel rules.

Proved by k-induction for every reachable state (``prove``):
* B: once ``bvalid`` is high without ``bready``, the next cycle ``bvalid`` is high and ``bresp``
  unchanged; R likewise for ``rvalid`` with ``rdata``/``rresp``;
* reads: the number of accepted ARs minus accepted Rs equals ``rvalid`` (never a response
  without a request, never a lost one).
Checked for 24 cycles from reset (``bmc``): a B response only follows an accepted AW and W,
and the number of outstanding writes never exceeds what the one-entry slots can hold.
Inputs (the manager's signals and the hardware-side field inputs) are unconstrained except that
the manager keeps AW/W/AR valid and payload until accepted and reset stays low.
"""

import pytest
from amaranth import Module, ResetSignal, Signal
from amaranth.hdl import Assert, Assume
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from mcf.abi.csrmap import node_regmap
from mcf.hdl.csr import AxiLiteSignature, CsrBank
from mcf.sim.formal import check
from mcf.sim.tb import kinds_regmap


class Formal(wiring.Component):
    """The bank with its bus and field inputs as free top-level inputs, plus the manager
    assumptions and the properties (``write_accounting`` adds the bounded-only ones)."""

    def __init__(self, regmap, addr_width, write_accounting):
        self._bank = CsrBank(regmap, addr_width=addr_width)
        self._write_accounting = write_accounting
        super().__init__({"s_axi_ctrl": In(AxiLiteSignature(addr_width)),
                          "regs": self._bank.signature.members["regs"]})

    def elaborate(self, platform):
        m = Module()
        m.submodules.bank = bank = self._bank
        wiring.connect(m, wiring.flipped(self.s_axi_ctrl), bank.s_axi_ctrl)
        wiring.connect(m, bank.regs, wiring.flipped(self.regs))
        bus = self.s_axi_ctrl
        m.d.comb += Assume(~ResetSignal())

        def prev(name):
            reg = Signal.like(getattr(bus, name), name=f"prev_{name}")
            m.d.sync += reg.eq(getattr(bus, name))
            return reg

        started = Signal()
        m.d.sync += started.eq(1)
        p = {n: prev(n) for n in (
            "awvalid", "awready", "awaddr", "wvalid", "wready", "wdata", "wstrb", "arvalid",
            "arready", "araddr", "bvalid", "bready", "bresp", "rvalid", "rready", "rdata",
            "rresp")}
        with m.If(started):
            # manager rules (assumed): valid and payload held until the handshake
            with m.If(p["awvalid"] & ~p["awready"]):
                m.d.comb += Assume(bus.awvalid & (bus.awaddr == p["awaddr"]))
            with m.If(p["wvalid"] & ~p["wready"]):
                m.d.comb += Assume(bus.wvalid & (bus.wdata == p["wdata"])
                                   & (bus.wstrb == p["wstrb"]))
            with m.If(p["arvalid"] & ~p["arready"]):
                m.d.comb += Assume(bus.arvalid & (bus.araddr == p["araddr"]))
            # subordinate rules (asserted): responses held and stable until accepted
            with m.If(p["bvalid"] & ~p["bready"]):
                m.d.comb += Assert(bus.bvalid, "bvalid dropped before bready")
                m.d.comb += Assert(bus.bresp == p["bresp"], "bresp changed while stalled")
            with m.If(p["rvalid"] & ~p["rready"]):
                m.d.comb += Assert(bus.rvalid, "rvalid dropped before rready")
                m.d.comb += Assert(bus.rdata == p["rdata"], "rdata changed while stalled")
                m.d.comb += Assert(bus.rresp == p["rresp"], "rresp changed while stalled")
        # accounting: outstanding reads == rvalid; a B needs an accepted AW and W
        reads, aws, ws = Signal(4), Signal(4), Signal(4)
        b_hs = bus.bvalid & bus.bready
        m.d.sync += [
            reads.eq(reads + (bus.arvalid & bus.arready) - (bus.rvalid & bus.rready)),
            aws.eq(aws + (bus.awvalid & bus.awready) - b_hs),
            ws.eq(ws + (bus.wvalid & bus.wready) - b_hs),
        ]
        m.d.comb += Assert(reads == bus.rvalid, "read accounting")
        if self._write_accounting:
            m.d.comb += [
                Assert(~bus.bvalid | ((aws >= 1) & (ws >= 1)), "B without AW and W"),
                Assert((aws <= 2) & (ws <= 2), "more writes outstanding than slots"),
            ]
        return m


@pytest.mark.parametrize("mapname,addr_width", [("kinds", 6), ("node", 12)])
def test_response_channel_rules_formal(mapname, addr_width):
    regmap = kinds_regmap() if mapname == "kinds" else node_regmap()
    name = f"csr_formal_{mapname}"
    check(Formal(regmap, addr_width, write_accounting=False), f"{name}_prove",
          mode="prove", depth=3)
    check(Formal(regmap, addr_width, write_accounting=True), f"{name}_bmc",
          mode="bmc", depth=24)
