"""Wire models between two MACs, with fault injection (issue #13; ``docs/eth.md``; simulation
only, not for the board): the RGMII pins of one :class:`~mcf.hdl.eth.rgmii.RgmiiMac` driving
the RX pins of another, and the GT user data of one :class:`~mcf.hdl.eth.tengig.TenGigLink`
driving the other's (the SFP+ line, "serialised at the PCS boundary").

Each model passes the line through unchanged until its ``inject`` input (``sync`` = aclk, a
one-cycle pulse) arms it; it then flips exactly one line bit inside the next frame, in a byte
that is part of dst..FCS, so the receiving MAC drops that frame as a bad FCS
(``rx_fcs_errors``) and the NIC behind it sees the sequence gap at the next frame it gets.
``inject`` crosses into the wire's clock by a toggle and a :class:`~amaranth.lib.cdc.
FFSynchronizer`. The wire's clock domains are local and reset-less (initial values).
"""

from __future__ import annotations

from amaranth import Cat, ClockDomain, ClockSignal, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from mcf.abi.eth import PREAMBLE, SYNC_CTRL, SYNC_DATA

__all__ = ["RgmiiWire", "GtWire"]


def _armed_by(m, inject, domain: str) -> Signal:
    """A one-cycle pulse in ``domain`` per ``inject`` pulse in ``sync``."""
    tog = Signal()
    with m.If(inject):
        m.d.sync += tog.eq(~tog)
    tog_s = Signal()
    tog_d = Signal()
    m.submodules.inject_cdc = FFSynchronizer(tog, tog_s, o_domain=domain)
    m.d[domain] += tog_d.eq(tog_s)
    pulse = Signal()
    m.d.comb += pulse.eq(tog_s ^ tog_d)
    return pulse


class RgmiiWire(wiring.Component):
    """One direction of an RGMII cable: the sender's ``txd``/``tx_ctl``/``tx_clk`` pins to the
    receiver's ``rxd``/``rx_ctl``/``rx_clk``, with a one-bit fault on demand.

    Members: ``txd`` — ``In(4)``, ``tx_ctl``/``tx_clk`` — ``In(1)`` (the sender's pins);
    ``rxd`` — ``Out(4)``, ``rx_ctl``/``rx_clk`` — ``Out(1)`` (to the receiver's pins: the same
    values, combinational, except the one flipped bit); ``inject`` — ``In(1)`` (``sync``): a
    one-cycle pulse arms the fault; ``faults`` — ``Out(16)`` (domain of ``tx_clk``) faults
    applied so far.

    The model samples the pins as the receiver does, on both edges of ``tx_clk`` (data
    mid-bit: the sender's delayed clock), and counts the bytes of a carrier (``tx_ctl`` high at
    the rising edge). Armed, it takes the next carrier that starts and flips bit ``bit`` of byte
    ``byte`` after the SFD (byte 0 = the first destination byte) for exactly the half period the
    receiver samples that nibble: a rising-edge and a falling-edge toggle register whose XOR is
    the flip, so no other sample of the line changes. ``byte`` ≥ 1 and < 60 keeps the flip
    inside dst..FCS of any frame (64 bytes at least). Latency: none (the line is combinational).
    """

    def __init__(self, *, byte: int = 20, bit: int = 5):
        if not 1 <= byte < 60 or not 0 <= bit < 8:
            raise ValueError("byte must be in 1..59 and bit in 0..7")
        self._byte, self._bit = byte, bit
        super().__init__({"txd": In(4), "tx_ctl": In(1), "tx_clk": In(1),
                          "rxd": Out(4), "rx_ctl": Out(1), "rx_clk": Out(1),
                          "inject": In(1), "faults": Out(16)})

    def elaborate(self, platform):
        m = Module()
        m.domains.wire = ClockDomain("wire", local=True, reset_less=True)
        m.domains.wire_neg = ClockDomain("wire_neg", clk_edge="neg", local=True,
                                         reset_less=True)
        m.d.comb += [ClockSignal("wire").eq(self.tx_clk), ClockSignal("wire_neg").eq(self.tx_clk)]
        arm = _armed_by(m, self.inject, "wire")

        target = len(PREAMBLE) + 1 + self._byte        # carrier byte index
        hi = self._bit >= 4                             # the falling-edge nibble
        armed = Signal()
        active = Signal()
        cnt = Signal(range(target + 2))
        rise_tog = Signal()
        fall_tog = Signal()
        start_rise = Signal()
        start_fall = Signal()                           # (registered in ``wire``)
        m.d.comb += start_rise.eq(Const(hi) & active & self.tx_ctl & (cnt == target))
        m.d.wire += start_fall.eq(Const(not hi) & active & self.tx_ctl & (cnt == target - 1))
        m.d.wire += rise_tog.eq(fall_tog ^ start_rise)
        m.d.wire_neg += fall_tog.eq(rise_tog ^ start_fall)
        flip = rise_tog ^ fall_tog

        with m.If(arm):
            m.d.wire += armed.eq(1)
        with m.If(self.tx_ctl):
            with m.If(cnt <= target):
                m.d.wire += cnt.eq(cnt + 1)
            with m.If((cnt == 0) & (armed | arm)):
                m.d.wire += [active.eq(1), armed.eq(0)]
            with m.If(cnt == target):
                m.d.wire += active.eq(0)
                with m.If(active):
                    m.d.wire += self.faults.eq(self.faults + 1)
        with m.Else():
            m.d.wire += [cnt.eq(0), active.eq(0)]

        m.d.comb += [self.rxd.eq(self.txd ^ (flip << (self._bit % 4))),
                     self.rx_ctl.eq(self.tx_ctl), self.rx_clk.eq(self.tx_clk)]
        return m


class GtWire(wiring.Component):
    """One direction of the SFP+ line at the PCS boundary: the sender's 64-bit GT TX user data
    (10GBASE-R 66-bit blocks, bit 0 first, as :class:`~mcf.hdl.eth.pcs10g.GearboxTx` writes
    them) to the receiver's GT RX user data, one word per ``clk`` cycle, with a one-bit fault on
    demand.

    Members: ``clk`` — ``In(1)`` the line clock (the sender's TX user clock; the receiver's
    recovered clock is the same); ``i`` — ``In(64)`` TX data; ``o`` — ``Out(64)`` RX data,
    registered: ``o`` is ``i`` one ``clk`` cycle later, except the flipped bit; ``inject`` —
    ``In(1)`` (``sync``): a one-cycle pulse arms the fault; ``block_lock`` — ``Out(1)`` the
    model has found the block grid; ``faults`` — ``Out(16)`` faults applied so far (both in the
    domain of ``clk``).

    The model finds the 66-bit block grid in the line as a receiver does (a sync header 01 or
    10 at every 66th bit: an invalid one moves its guess by one bit, 64 valid ones in a row
    lock). Armed and locked, at the next control block (a frame's start, or idle) it counts the
    data blocks that follow and flips scrambled payload bit ``bit`` (0..5) of the second: that
    block is dst..FCS bytes of any frame, whatever lane it started on. The receiver's
    self-synchronising descrambler (x^58 + x^39 + 1) turns the one line bit into three bit
    errors (``bit``, ``bit`` + 39, ``bit`` + 58) of that block only, no header changes, so the
    frame ends normally with a bad FCS.
    """

    def __init__(self, *, bit: int = 3):
        if not 0 <= bit < 6:
            raise ValueError("bit must be in 0..5 (all three descrambled errors in one block)")
        self._bit = bit
        super().__init__({"clk": In(1), "i": In(64), "o": Out(64), "inject": In(1),
                          "block_lock": Out(1), "faults": Out(16)})

    def elaborate(self, platform):
        m = Module()
        m.domains.wire = ClockDomain("wire", local=True, reset_less=True)
        m.d.comb += ClockSignal("wire").eq(self.clk)
        arm = _armed_by(m, self.inject, "wire")

        prev = Signal(64)
        carry = Signal(64)
        m.d.wire += prev.eq(self.i)
        window = Cat(prev, self.i)                      # 128 bits; ``prev`` goes out now
        nxt = Signal(range(68))                         # guessed block start in ``prev``
        good = Signal(range(65))
        header = Signal(2)
        m.d.comb += header.eq(window.bit_select(nxt, 2))
        valid = (header == SYNC_DATA) | (header == SYNC_CTRL)
        starts = nxt < 64

        armed = Signal()
        active = Signal()
        datas = Signal(2)                               # data blocks since a control block
        mask = Signal(128)
        hit = Signal()
        with m.If(arm):
            m.d.wire += armed.eq(1)
        with m.If(~starts):
            m.d.wire += nxt.eq(nxt - 64)
        with m.Elif(~valid):
            m.d.wire += [nxt.eq(nxt + 3), good.eq(0), self.block_lock.eq(0)]
        with m.Else():
            m.d.wire += nxt.eq(nxt + 2)
            with m.If(good == 63):
                m.d.wire += self.block_lock.eq(1)
            with m.If(good != 64):
                m.d.wire += good.eq(good + 1)
            with m.If(header == SYNC_CTRL):
                m.d.wire += datas.eq(0)
                with m.If(self.block_lock & (armed | arm)):
                    m.d.wire += [active.eq(1), armed.eq(0)]
            with m.Elif(datas != 3):
                m.d.wire += datas.eq(datas + 1)
            m.d.comb += hit.eq(self.block_lock & active & (header == SYNC_DATA) & (datas == 1))
            with m.If(hit):
                m.d.wire += [active.eq(0), self.faults.eq(self.faults + 1)]
        # the slip keeps ``nxt`` in 0..67: 63 + 3 = 66 and 65 + 2 = 67 are starts in the next word
        m.d.comb += mask.eq(Mux(hit, Const(1, 128) << (nxt + 2 + self._bit), 0))
        m.d.wire += [self.o.eq(prev ^ carry ^ mask[:64]), carry.eq(mask[64:])]
        return m
