"""1G RGMII MAC for the KR260's PL RJ45 ports (TI DP83867; issue #13 items 2, 4; ``docs/eth.md``).

:class:`RgmiiMac` carries link frames (``beat_layout(64)`` in the node clock ``sync`` = aclk)
over one RGMII port:

* TX: ``s_axis`` → :class:`FrameGate` (whole frames only, so the MAC never underruns) →
  ``AsyncFIFO`` (aclk → ``eth_tx``) → :class:`~mcf.hdl.eth.encap.Unpack64to8` →
  :class:`~mcf.hdl.eth.encap.EthEncap` → :class:`GmiiTx` (preamble, SFD, frame, 12-byte
  gap) → :class:`RgmiiIo` (DDR nibbles).
* RX: :class:`RgmiiIo` → :class:`GmiiRx` (preamble/SFD, ``rx_er``) →
  :class:`~mcf.hdl.eth.encap.EthDecap` → :class:`~mcf.hdl.eth.encap.Pack8to64` →
  ``AsyncFIFO`` (``eth_rx`` → aclk) → ``m_axis``.
* Counters: one :data:`mcf.abi.eth.ETH_EVENT` per frame crosses to aclk through a small
  ``AsyncFIFO`` per direction; :class:`~mcf.hdl.eth.encap.EthCounters` keeps ``status``.

Clocks: ``eth_tx`` is ``tx_clk_in`` (125 MHz from an MMCM in the wrapper), ``eth_rx`` the
PHY's ``rx_clk`` (through a BUFG the platform places). Each domain's reset is the aclk reset
through a :class:`amaranth.lib.cdc.ResetSynchronizer`. ``local_id``/``peer_id`` are
quasi-static (set before the link carries traffic) and cross through ``FFSynchronizer``.

PHY set-up (DP83867 on the KR260): 1000BASE-T (auto-negotiation as strapped; the board's straps
give RGMII mode), RGMII internal delays enabled in the PHY on both directions (``RGMIICTL``,
2.0 ns each in ``RGMIIDCTL``), written over MDIO by ``mcf.driver.eth.phy_setup_ops`` through
:class:`mcf.hdl.eth.mdio.MdioMaster`, so the MAC sends ``tx_clk`` edge-aligned with the data
(``ODDRE1`` of 1/0) and samples ``rxd`` with the received clock's own edges (``IDDRE1``), no
IDELAY. 10/100 Mb/s are not supported.
"""

from __future__ import annotations

from amaranth import Cat, ClockDomain, ClockSignal, Module, Mux, ResetSignal, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer, ResetSynchronizer
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from mcf.abi.eth import ETH_EVENT, ETH_STATUS, IFG_BYTES, NODE_BITS, PREAMBLE, SFD, EthDrop
from mcf.abi.framing import beat_layout

from .cdc import events_to_aclk, stream_cdc
from .encap import BYTE, RX_BYTE, EthCounters, EthDecap, EthEncap, Pack8to64, Unpack64to8

__all__ = ["GmiiTx", "GmiiRx", "RgmiiIo", "FrameGate", "RgmiiMac", "RGMII_PINS"]

RGMII_PINS = wiring.Signature({
    "txd": Out(4), "tx_ctl": Out(1), "tx_clk": Out(1),
    "rxd": In(4), "rx_ctl": In(1), "rx_clk": In(1),
})
"""The six RGMII pins of one port, seen from the MAC."""


class GmiiTx(wiring.Component):
    """GMII transmitter: preamble (7 × 0x55), SFD (0xD5), the frame bytes, then ``IFG_BYTES``
    idle cycles.

    Members: ``i`` — ``In(stream.Signature(BYTE))`` frames dst..FCS; ``txd``/``tx_en``/
    ``tx_er`` — registered GMII outputs; ``frame_err`` — 1 once the current frame missed a
    byte (``i.valid`` low inside a frame: that cycle is sent with ``tx_er``, the receiver
    drops the frame), cleared at the next frame's start.

    Throughput: a frame of n bytes takes 8 + n + 12 cycles (line rate) when its bytes arrive
    every cycle. A frame starts once its first byte is offered.
    """

    def __init__(self):
        super().__init__({"i": In(stream.Signature(BYTE)), "txd": Out(8), "tx_en": Out(1),
                          "tx_er": Out(1), "frame_err": Out(1)})

    def elaborate(self, platform):
        m = Module()
        i = self.i
        cnt = Signal(range(max(len(PREAMBLE), IFG_BYTES) + 1))
        with m.FSM():
            with m.State("IDLE"):
                m.d.sync += [self.tx_en.eq(0), self.tx_er.eq(0)]
                with m.If(i.valid):
                    m.d.sync += [self.tx_en.eq(1), self.txd.eq(PREAMBLE[0]), cnt.eq(1),
                                 self.frame_err.eq(0)]
                    m.next = "PRE"
            with m.State("PRE"):
                m.d.sync += [self.txd.eq(Mux(cnt < len(PREAMBLE), PREAMBLE[0], SFD)),
                             cnt.eq(cnt + 1)]
                with m.If(cnt == len(PREAMBLE)):
                    m.next = "DATA"
            with m.State("DATA"):
                m.d.comb += i.ready.eq(1)
                m.d.sync += [self.txd.eq(i.payload.data), self.tx_er.eq(~i.valid)]
                with m.If(~i.valid):
                    m.d.sync += self.frame_err.eq(1)
                with m.If(i.valid & i.payload.last):
                    m.d.sync += cnt.eq(0)
                    m.next = "IFG"
            with m.State("IFG"):
                m.d.sync += [self.tx_en.eq(0), self.tx_er.eq(0), cnt.eq(cnt + 1)]
                with m.If(cnt == IFG_BYTES - 1):
                    m.next = "IDLE"
        return m


class GmiiRx(wiring.Component):
    """GMII receiver: finds the SFD after the preamble and delivers the frame bytes.

    Members: ``rxd``/``rx_dv``/``rx_er`` — GMII inputs (one byte per cycle); ``o`` —
    ``Out(stream.Signature(RX_BYTE))``: the bytes after the SFD, ``last`` on the byte before
    ``rx_dv`` falls, ``err`` on bytes received with ``rx_er``; ``o.ready`` is ignored (the
    decapsulator always takes). A carrier whose preamble is broken (a byte other than 0x55
    before the SFD) or that ends right after the SFD is reported as a one-byte frame with
    ``err`` (counted as a PHY error), the rest of it skipped. Latency: 2 cycles.
    """

    def __init__(self):
        super().__init__({"rxd": In(8), "rx_dv": In(1), "rx_er": In(1),
                          "o": Out(stream.Signature(RX_BYTE))})

    def elaborate(self, platform):
        m = Module()
        o = self.o
        held = Signal(8)
        held_er = Signal()
        have = Signal()

        def bad():
            m.d.sync += [o.valid.eq(1), o.payload.data.eq(self.rxd), o.payload.last.eq(1),
                         o.payload.err.eq(1)]

        m.d.sync += o.valid.eq(0)
        with m.FSM():
            with m.State("IDLE"), m.If(self.rx_dv):
                with m.If(self.rxd == SFD):
                    m.d.sync += have.eq(0)
                    m.next = "DATA"
                with m.Elif(self.rxd == PREAMBLE[0]):
                    m.next = "PRE"
                with m.Else():
                    bad()
                    m.next = "SKIP"
            with m.State("PRE"):
                with m.If(~self.rx_dv):
                    bad()
                    m.next = "IDLE"
                with m.Elif(self.rxd == SFD):
                    m.d.sync += have.eq(0)
                    m.next = "DATA"
                with m.Elif(self.rxd != PREAMBLE[0]):
                    bad()
                    m.next = "SKIP"
            with m.State("DATA"):
                with m.If(self.rx_dv):
                    m.d.sync += [held.eq(self.rxd), held_er.eq(self.rx_er), have.eq(1),
                                 o.valid.eq(have), o.payload.data.eq(held),
                                 o.payload.last.eq(0), o.payload.err.eq(held_er)]
                with m.Else():
                    m.d.sync += [o.valid.eq(1), o.payload.data.eq(held), o.payload.last.eq(1),
                                 o.payload.err.eq(held_er | ~have)]
                    m.next = "IDLE"
            with m.State("SKIP"), m.If(~self.rx_dv):
                m.next = "IDLE"
        return m


class RgmiiIo(wiring.Component):
    """RGMII DDR pins ↔ GMII bytes. TX (domain ``eth_tx``): ``txd[3:0]``/``tx_en`` on the
    rising half, ``txd[7:4]``/``tx_en ^ tx_er`` on the falling half; RX (domain ``eth_rx``,
    clocked by ``pins.rx_clk``): the same split, sampled on both edges of ``rx_clk``.

    With a platform: ``ODDRE1`` per output pin (and one of 1/0 forwarding ``tx_clk``),
    ``IDDRE1`` (``SAME_EDGE_PIPELINED``) per input pin, clocked by the domains' clocks.
    Without (simulation): the output pins are the registered nibbles selected by the level of
    the ``eth_tx`` clock, and ``tx_clk`` is ``tx_clk90`` (the same 125 MHz clock delayed by a
    quarter period, standing in for the PHY's TX delay), so a model sampling on ``tx_clk``'s
    edges sees the data mid-bit; inputs are sampled by a rising- and a falling-edge register.
    RX latency: the byte whose low nibble was sampled at edge t appears on ``rxd`` at t + 2.
    """

    def __init__(self):
        super().__init__({"pins": Out(RGMII_PINS), "tx_clk90": In(1),
                          "txd": In(8), "tx_en": In(1), "tx_er": In(1),
                          "rxd": Out(8), "rx_dv": Out(1), "rx_er": Out(1)})

    def elaborate(self, platform):
        from amaranth.hdl import Instance
        m = Module()
        p = self.pins
        lo = Signal(4)
        hi = Signal(4)
        c1 = Signal()
        c2 = Signal()
        if platform is not None:
            def oddr(q, d1, d2):
                m.submodules += Instance("ODDRE1", i_C=ClockSignal("eth_tx"), i_SR=0,
                                         i_D1=d1, i_D2=d2, o_Q=q)

            def iddr(d, q1, q2):
                m.submodules += Instance("IDDRE1", p_DDR_CLK_EDGE="SAME_EDGE_PIPELINED",
                                         i_C=ClockSignal("eth_rx"), i_CB=~ClockSignal("eth_rx"),
                                         i_R=0, i_D=d, o_Q1=q1, o_Q2=q2)
            for b in range(4):
                oddr(p.txd[b], self.txd[b], self.txd[4 + b])
                iddr(p.rxd[b], lo[b], hi[b])
            oddr(p.tx_ctl, self.tx_en, self.tx_en ^ self.tx_er)
            oddr(p.tx_clk, 1, 0)
            iddr(p.rx_ctl, c1, c2)
        else:
            tx_high = ClockSignal("eth_tx")
            m.d.comb += [p.txd.eq(Mux(tx_high, self.txd[:4], self.txd[4:])),
                         p.tx_ctl.eq(Mux(tx_high, self.tx_en, self.tx_en ^ self.tx_er)),
                         p.tx_clk.eq(self.tx_clk90)]
            m.domains.eth_rx_neg = neg = ClockDomain("eth_rx_neg", clk_edge="neg", local=True,
                                                     reset_less=True)
            m.d.comb += neg.clk.eq(ClockSignal("eth_rx"))
            m.d.eth_rx += [lo.eq(p.rxd), c1.eq(p.rx_ctl)]
            m.d.eth_rx_neg += [hi.eq(p.rxd), c2.eq(p.rx_ctl)]
        m.d.eth_rx += [self.rxd.eq(Cat(lo, hi)), self.rx_dv.eq(c1), self.rx_er.eq(c1 ^ c2)]
        return m


class FrameGate(wiring.Component):
    """Store-and-forward gate of link frames: ``o`` offers a frame only once it is whole in
    the ``depth``-beat FIFO (or the FIFO is full, so an over-long frame cannot wedge it).

    Members: ``i``/``o`` — ``In``/``Out(stream.Signature(beat_layout(64)))``. Throughput one
    beat per cycle each side."""

    def __init__(self, depth: int = 512):
        self._depth = depth
        super().__init__({"i": In(stream.Signature(beat_layout(64))),
                          "o": Out(stream.Signature(beat_layout(64)))})

    def elaborate(self, platform):
        m = Module()
        lay = beat_layout(64)
        m.submodules.fifo = fifo = SyncFIFO(width=lay.size, depth=self._depth)
        frames = Signal(range(self._depth + 1))
        w_last = self.i.valid & self.i.ready & self.i.payload.last
        r_last = self.o.valid & self.o.ready & self.o.payload.last
        m.d.sync += frames.eq(frames + w_last - r_last)
        open_ = (frames != 0) | (fifo.level == self._depth)
        m.d.comb += [fifo.w_data.eq(self.i.payload), fifo.w_en.eq(self.i.valid),
                     self.i.ready.eq(fifo.w_rdy),
                     self.o.payload.eq(fifo.r_data), self.o.valid.eq(fifo.r_rdy & open_),
                     fifo.r_en.eq(self.o.ready & open_)]
        return m


class RgmiiMac(wiring.Component):
    """One RGMII port carrying link frames (see the module docstring for the chain).

    Members (aclk = ``sync`` unless named): ``s_axis`` — ``In(stream.Signature(
    beat_layout(64)))`` link frames to send (``LinkTx.o``); ``m_axis`` — ``Out(...)`` link
    frames received, each whole and checked (to ``LinkRx.i``); ``local_id``/``peer_id`` —
    ``In(NODE_BITS)``; ``status`` — ``Out(ETH_STATUS)``; ``pins`` — ``Out(RGMII_PINS)``;
    ``tx_clk_in`` — ``In(1)`` the 125 MHz ``eth_tx`` clock; ``tx_clk90`` — ``In(1)`` the same
    delayed by 2 ns (simulation only: forwarded as ``tx_clk``).

    Throughput: line rate both ways (a frame of n ≥ 64 bytes every n + 20 cycles of 8 ns)
    while aclk ≥ 125/8 MHz. ``m_axis`` back-pressure fills the 4 KiB receive buffer, then
    frames are dropped and counted (``rx_overflow``). Latency RX: a frame's first beat leaves
    after its last byte arrived plus the FIFO crossing (store and forward).
    """

    def __init__(self):
        super().__init__({
            "s_axis": In(stream.Signature(beat_layout(64))),
            "m_axis": Out(stream.Signature(beat_layout(64))),
            "local_id": In(NODE_BITS), "peer_id": In(NODE_BITS),
            "status": Out(ETH_STATUS),
            "pins": Out(RGMII_PINS), "tx_clk_in": In(1), "tx_clk90": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.domains.eth_tx = ClockDomain("eth_tx", async_reset=True)
        m.domains.eth_rx = ClockDomain("eth_rx", async_reset=True)
        m.d.comb += [ClockSignal("eth_tx").eq(self.tx_clk_in),
                     ClockSignal("eth_rx").eq(self.pins.rx_clk)]
        m.submodules.rst_tx = ResetSynchronizer(ResetSignal("sync"), domain="eth_tx")
        m.submodules.rst_rx = ResetSynchronizer(ResetSignal("sync"), domain="eth_rx")
        beat = beat_layout(64)

        m.submodules.io = io = RgmiiIo()
        wiring.connect(m, wiring.flipped(self.pins), io.pins)
        m.d.comb += io.tx_clk90.eq(self.tx_clk90)

        # ---- TX: aclk → eth_tx -----------------------------------------------------------------
        m.submodules.gate = gate = FrameGate()
        wiring.connect(m, wiring.flipped(self.s_axis), gate.i)
        tx = {"unpack": Unpack64to8(), "encap": EthEncap(), "gmii": GmiiTx()}
        unpack, enc, gtx = tx["unpack"], tx["encap"], tx["gmii"]
        stream_cdc(m, "tx_fifo", gate.o, unpack.i, beat.size, 16, "sync", "eth_tx")
        for name, c in tx.items():
            m.submodules[name] = _rename(c, "eth_tx")
        wiring.connect(m, unpack.o, enc.i)
        wiring.connect(m, enc.o, gtx.i)
        m.d.comb += [io.txd.eq(gtx.txd), io.tx_en.eq(gtx.tx_en), io.tx_er.eq(gtx.tx_er)]
        m.submodules.local_tx = FFSynchronizer(self.local_id, enc.local_id, o_domain="eth_tx")
        m.submodules.peer_tx = FFSynchronizer(self.peer_id, enc.peer_id, o_domain="eth_tx")

        # ---- RX: eth_rx → aclk -----------------------------------------------------------------
        rx = {"gmii_rx": GmiiRx(), "decap": EthDecap(), "pack": Pack8to64()}
        for name, c in rx.items():
            m.submodules[name] = _rename(c, "eth_rx")
        grx, dec, pack = rx["gmii_rx"], rx["decap"], rx["pack"]
        m.d.comb += [grx.rxd.eq(io.rxd), grx.rx_dv.eq(io.rx_dv), grx.rx_er.eq(io.rx_er)]
        m.d.comb += [dec.i.valid.eq(grx.o.valid), dec.i.payload.eq(grx.o.payload),
                     grx.o.ready.eq(dec.i.ready)]
        wiring.connect(m, dec.o, pack.i)
        m.submodules.local_rx = FFSynchronizer(self.local_id, dec.local_id, o_domain="eth_rx")
        stream_cdc(m, "rx_fifo", pack.o, self.m_axis, beat.size, 16, "eth_rx", "sync")

        # ---- counters: one event per frame into aclk -------------------------------------------
        m.submodules.counters = cnt = EthCounters()
        tx_ev = Signal(ETH_EVENT)
        m.d.comb += [tx_ev.bytes.eq(enc.event.payload.bytes),
                     tx_ev.cause.eq(Mux(gtx.frame_err, EthDrop.PHY_ERROR, EthDrop.OK))]
        events_to_aclk(m, "tx_events", tx_ev, enc.event.valid, cnt.tx_event, "eth_tx")
        events_to_aclk(m, "rx_events", dec.event.payload, dec.event.valid, cnt.rx_event,
                       "eth_rx")
        m.d.comb += self.status.eq(cnt.status)
        return m


def _rename(component, domain):
    from amaranth.hdl import DomainRenamer
    return DomainRenamer(domain)(component)
