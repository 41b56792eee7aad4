"""Simulation model of an inter-board link (for benches and multi-node simulations; not for the
board): configurable latency, bandwidth and injected frame drops / bit flips, all in RTL so that
long simulations keep Python off the per-cycle path."""

from __future__ import annotations

from amaranth import Cat, Const, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from mcf.abi.framing import beat_layout
from mcf.abi.meta import META

__all__ = ["LinkModel", "LINK_MODEL_STATUS"]

LINK_MODEL_STATUS = data.StructLayout({"frames": 32, "dropped": 32, "corrupted": 32})


class LinkModel(wiring.Component):
    """A frame-level link model on ``beat_layout`` streams (between a ``LinkTx`` and a ``LinkRx``).

    Parameters: ``latency`` (cycles from accepting a beat to offering it, ≥ 2), ``rate`` =
    (num, den): bandwidth in bytes per cycle (``num/den``; a beat costs its valid bytes),
    ``drop_ppm`` / ``flip_ppm``: per-frame probabilities (per 2^16) that a frame is lost whole or
    gets exactly one data bit flipped inside a valid byte, ``seed``: LFSR seed.

    Members: ``i`` (In stream), ``o`` (Out stream), ``status`` (frames seen, dropped,
    corrupted), ``inject`` (In, 1 bit: a one-cycle pulse arms a fault — the next frame to start
    gets one data bit flipped, as if ``flip_p16`` had drawn it — so a bench can put a link fault
    at a chosen moment without a second build). ``o`` obeys the stream rules; ``i.ready`` falls
    when the in-flight buffer is full.
    """

    def __init__(self, *, data_width=64, latency=8, rate=(8, 1), drop_p16=0, flip_p16=0,
                 seed=0xACE1, depth=64, meta_layout: data.StructLayout = META):
        self._dw = data_width
        self._latency = max(2, latency)
        self._rate = rate
        self._drop = drop_p16
        self._flip = flip_p16
        self._seed = seed or 1
        self._depth = max(depth, self._latency + 4)
        blay = beat_layout(data_width, meta_layout)
        self._blay = blay
        super().__init__({"i": In(stream.Signature(blay)), "o": Out(stream.Signature(blay)),
                          "status": Out(LINK_MODEL_STATUS), "inject": In(1)})

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        dw, bpb = self._dw, self._dw // 8
        tbits = 32
        now = Signal(tbits)
        m.d.sync += now.eq(now + 1)

        # 32-bit Galois LFSR, advanced once per frame start
        lfsr = Signal(32, init=self._seed)
        step = Signal(32)
        m.d.comb += step.eq(Cat(lfsr[1:], 0) ^ (lfsr[0].replicate(32) & 0xA3000000))

        entry = data.StructLayout({"beat": self._blay, "t": tbits})
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=entry.size, depth=self._depth)
        w = entry(fifo.w_data)
        r = entry(fifo.r_data)

        first = Signal(init=1)
        drop = Signal()
        flip = Signal()
        flip_beat = Signal(4)
        flip_bit = Signal(range(dw))
        bidx = Signal(16)
        fire_in = i.valid & i.ready
        m.d.comb += i.ready.eq(fifo.w_rdy)

        armed = Signal()                    # ``inject`` seen, not yet spent on a frame
        with m.If(self.inject):
            m.d.sync += armed.eq(1)
        drop_now = Signal()
        flip_now = Signal()
        fbeat_now = Signal(4)
        fbit_now = Signal(range(dw))
        with m.If(first):
            m.d.comb += [drop_now.eq(step[:16] < self._drop),
                         flip_now.eq((step[16:32] < self._flip) | armed),
                         fbeat_now.eq(lfsr[8:12]), fbit_now.eq(lfsr[16:16 + len(fbit_now)])]
        with m.Else():
            m.d.comb += [drop_now.eq(drop), flip_now.eq(flip), fbeat_now.eq(flip_beat),
                         fbit_now.eq(flip_bit)]
        with m.If(fire_in):
            m.d.sync += [first.eq(i.payload.last), bidx.eq(bidx + 1)]
            with m.If(i.payload.last):
                m.d.sync += bidx.eq(0)
            with m.If(first):
                with m.If(~self.inject):
                    m.d.sync += armed.eq(0)
                m.d.sync += [lfsr.eq(step), drop.eq(drop_now), flip.eq(flip_now),
                             flip_beat.eq(fbeat_now), flip_bit.eq(fbit_now),
                             self.status.frames.eq(self.status.frames + 1)]
                with m.If(drop_now):
                    m.d.sync += self.status.dropped.eq(self.status.dropped + 1)
                with m.Elif(flip_now):
                    m.d.sync += self.status.corrupted.eq(self.status.corrupted + 1)
        # the flipped bit: in beat min(flip_beat, last beat), inside a valid byte (byte 0 if the
        # chosen byte is not valid)
        target = (~drop_now & flip_now & ((bidx == fbeat_now) | (i.payload.last
                                                                  & (bidx < fbeat_now))))
        byte_ok = Signal()
        m.d.comb += byte_ok.eq((i.payload.keep >> fbit_now[3:])[0])
        bit = Signal(range(dw))
        m.d.comb += bit.eq(Cat(fbit_now[:3], fbit_now[3:] & byte_ok.replicate(len(fbit_now) - 3)))
        mask = Signal(dw)
        m.d.comb += mask.eq((Const(1, dw) << bit)[:dw] & target.replicate(dw))
        m.d.comb += [
            w.beat.data.eq(i.payload.data ^ mask), w.beat.keep.eq(i.payload.keep),
            w.beat.last.eq(i.payload.last), w.t.eq(now + self._latency - 2),
            fifo.w_en.eq(fire_in & ~drop_now),
        ]

        # bandwidth: credits in units of 1/den byte, capped at one beat's worth
        num, den = self._rate
        cap = bpb * den + num
        credit = Signal(range(cap + 1), init=cap)
        cost = Signal(range(bpb * den + 1))
        popcount = sum(r.beat.keep[b] for b in range(bpb))
        m.d.comb += cost.eq(popcount * den)
        due = (now - r.t)[-1] == 0          # now >= t (modular, within 2^31)
        m.d.comb += [o.valid.eq(fifo.r_rdy & due & (credit >= cost)), o.payload.eq(r.beat),
                     fifo.r_en.eq(o.valid & o.ready)]
        spend = Signal.like(credit)
        m.d.comb += spend.eq(credit - (cost & (o.valid & o.ready).replicate(len(cost))))
        with m.If(spend + num > cap):
            m.d.sync += credit.eq(cap)
        with m.Else():
            m.d.sync += credit.eq(spend + num)
        return m
