"""P·V of prefill attention tiled for the GEMM arrays (issue #33 step 3; paper §3.1, §5).

After :class:`~.tile_softmax.TileSoftmax`: a row's 8-bit probabilities ``w8`` against its KV
block's INT4 V, two V channels per DSP48E2 (``(v1·2^k + v0)·w8``, the arrays' packing, on the
cascades of :class:`~.tile_cascade.PackedCascades` shared with TileScore), exact integer
accumulators, then ``o_b = (Σ w8·v)·2^s`` saturated —
:func:`mcf.golden.attention_tiled.tile_block_state` with ``p_format = P8`` bit for bit
(formats in :mod:`mcf.abi.attn_tile`; the shift and saturation are the merge's,
:class:`~.tile_merge.TileMerge`).
"""

from __future__ import annotations

from amaranth import Array, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi import attn_tile
from mcf.abi.kv import KV_ELEM

from .tile_cascade import PackedCascades

__all__ = ["TilePV"]


class TilePV(wiring.Component):
    """``acc = Σ w8·v`` of P8 rows against a KV block's V (``o_b = sat(acc·2^s)``):
    ``keys × head_dim`` MACs per cycle in ``keys × head_dim / 2`` DSP48E2 slices.

    The array (:class:`~.tile_cascade.PackedCascades`): per channel pair ``(2c, 2c+1)`` one
    cascade of ``keys`` slices (lane ``j`` = the beat's key ``j``, its inputs ``j`` cycles
    late), ``A = v[2c+1]·2^k``, ``D = v[2c]``,
    ``B = w8`` zero-extended (9 bits, sign 0: the one change to the GEMM arrays' INT8 path),
    ``k`` = :data:`~mcf.abi.attn_tile.PV_SHIFT`; the chain's last slice accumulates the packed
    sum over a group of ``group`` keys (≤ :data:`~mcf.abi.attn_tile.PV_SPLIT_KEYS`, where the
    fields split exactly), which is then split into the two channels' exact group sums and added
    to their accumulators (:func:`~mcf.abi.attn_tile.pv_acc_bits` of ``max_block``). At the
    row's end the exact sums go out with the row's ``m``, ``l`` and ``s``; ``o_b = sat(acc <<
    s)`` (``STATE_O``) is formed by the merge a few channels per cycle (yosys: 18,348 LUT with
    a shifter per channel here, 3,900 without, at the kr260 shape).

    V is held in two banks of ``max_block`` keys: the next block loads while rows run against
    the current one.

    Parameters
    ----------
    keys : keys per beat (TileSoftmax's ``keys``); head_dim : channels (even); max_block : keys
    of a bank (a multiple of ``keys``); max_rows : rows per block; group : keys per packed group
    (a multiple of ``keys``, ≤ ``PV_SPLIT_KEYS``; fewer only to test the split); dsp :
    ``"model"`` (the slices in logic, for simulation) or ``"primitive"`` (``DSP48E2``
    instances, synthesis only).

    Members
    -------
    v : In(stream.Signature(attn_tile.v_beat_layout(keys, head_dim, max_rows)))
        A block's V, beat by beat, ``rows`` on the ``last`` beat; ready while a bank is free.
    p : In(stream.Signature(attn_tile.p8_beat_layout(keys)))
        P8 rows (TileSoftmax's ``o``), each against the oldest loaded block, as many beats as its
        V; after the block's ``rows`` rows its bank is free. Ready while a block is loaded and
        ``o`` is not stalled.
    o : Out(stream.Signature(attn_tile.pv_out_layout(head_dim, max_block)))
        One beat per row (``last`` always set): ``(m_b, l_b, s, acc)``. Rows in order; the
        payload holds until taken.

    Rate: one beat per cycle (``keys × head_dim`` MACs per cycle) while ``o`` is taken; the
    pipeline stalls as a whole only while a row waits on ``o.ready``.
    Latency: :meth:`latency` = ``keys + 4`` cycles from a row's last beat taken to its ``o``.
    """

    def __init__(self, keys: int = 4, head_dim: int = 128, max_block: int = 256,
                 max_rows: int = 64, group: int = attn_tile.PV_SPLIT_KEYS, dsp: str = "model"):
        if head_dim % 2 or max_block % keys or group % keys or group > attn_tile.PV_SPLIT_KEYS:
            raise ValueError("head_dim even; keys divides max_block and group; group ≤ "
                             f"{attn_tile.PV_SPLIT_KEYS}")
        if dsp not in ("model", "primitive"):
            raise ValueError("dsp must be 'model' or 'primitive'")
        self.keys, self.head_dim, self.max_block = keys, head_dim, max_block
        self.max_rows, self.group, self.dsp = max_rows, group, dsp
        self.beats = max_block // keys
        super().__init__({
            "v": In(stream.Signature(attn_tile.v_beat_layout(keys, head_dim, max_rows))),
            "p": In(stream.Signature(attn_tile.p8_beat_layout(keys))),
            "o": Out(stream.Signature(attn_tile.pv_out_layout(head_dim, max_block))),
        })

    @property
    def latency(self) -> int:
        return self.keys + 4

    @property
    def dsps(self) -> int:
        return self.keys * self.head_dim // 2

    def elaborate(self, platform):
        m = Module()
        K, D, MB, k = self.keys, self.head_dim, self.beats, attn_tile.PV_SHIFT
        en = Signal()
        m.d.comb += en.eq(~self.o.valid | self.o.ready)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)

        # ---- V banks --------------------------------------------------------------------------
        vlay = data.ArrayLayout(data.ArrayLayout(signed(KV_ELEM.width), D), K)
        m.submodules.vmem = vmem = memory.Memory(shape=vlay, depth=2 * MB, init=[])
        v_wr, v_rd = vmem.write_port(), vmem.read_port()
        full = Array(Signal(name=f"full{b}") for b in range(2))
        nrows = Array(Signal(range(self.max_rows + 1), name=f"nrows{b}") for b in range(2))
        wb, rb = Signal(), Signal()
        vbeat = Signal(range(MB))
        v = self.v
        m.d.comb += [v.ready.eq(~full[wb]), v_wr.addr.eq(Mux(wb, MB, 0) + vbeat),
                     v_wr.data.eq(v.payload.v), v_wr.en.eq(v.valid & v.ready)]
        with m.If(v.valid & v.ready):
            m.d.sync += vbeat.eq(Mux(v.payload.last, 0, vbeat + 1))
            with m.If(v.payload.last & (v.payload.rows != 0)):
                m.d.sync += [full[wb].eq(1), nrows[wb].eq(v.payload.rows), wb.eq(~wb)]

        # ---- stage 0: take a P beat, read its V -----------------------------------------------
        p = self.p
        m.d.comb += p.ready.eq(en & full[rb])
        take = p.valid & p.ready
        pbeat = Signal(range(MB))
        done = Signal(range(self.max_rows + 1))        # rows of the bank finished
        spg = self.group // K                          # beats per packed group
        gpos = Signal(range(spg))
        rfirst = Signal(init=1)                        # the beat is in the row's first group
        m.d.comb += [v_rd.addr.eq(Mux(rb, MB, 0) + pbeat), v_rd.en.eq(en)]
        with m.If(take):
            m.d.sync += [pbeat.eq(Mux(p.payload.last, 0, pbeat + 1)),
                         rfirst.eq(p.payload.last | (rfirst & (gpos != spg - 1))),
                         gpos.eq(Mux(p.payload.last | (gpos == spg - 1), 0, gpos + 1))]
            with m.If(p.payload.last):
                with m.If(done + 1 == nrows[rb]):
                    m.d.sync += [done.eq(0), full[rb].eq(0), rb.eq(~rb)]
                with m.Else():
                    m.d.sync += done.eq(done + 1)

        # flags and the row's record, delayed with the step (F[n]: in the step's cycle t0 + n)
        flay = data.StructLayout({"valid": 1, "gfirst": 1, "glast": 1, "rfirst": 1, "rlast": 1,
                                  "m": p.payload.m.shape(), "l": p.payload.l.shape(),
                                  "s": p.payload.s.shape()})
        F = [Signal(flay, name=f"f{n}") for n in range(K + 3)]
        w8 = Signal(data.ArrayLayout(unsigned(attn_tile.P8.width), K))
        with m.If(en):
            m.d.sync += [F[0].valid.eq(take), F[0].gfirst.eq(gpos == 0),
                         F[0].glast.eq(p.payload.last | (gpos == spg - 1)),
                         F[0].rfirst.eq(rfirst), F[0].rlast.eq(p.payload.last),
                         F[0].m.eq(p.payload.m), F[0].l.eq(p.payload.l), F[0].s.eq(p.payload.s),
                         w8.eq(p.payload.w8)]
            m.d.sync += [F[n].eq(F[n - 1]) for n in range(1, K + 3)]

        # ---- the array: lane j's inputs j cycles late, one cascade per channel pair ---------
        m.submodules.array = arr = PackedCascades(
            lanes=K, pairs=D // 2, a_shape=signed(KV_ELEM.width),
            b_shape=unsigned(attn_tile.P8.width), shift=k, dsp=self.dsp)   # w8 zero-extended
        for j in range(K):
            m.d.comb += [arr.a[j].eq(v_rd.data[j]), arr.b[j].eq(w8[j])]
        # P ← M + PCIN (+ P within a group) in the step's cycle t0 + K + 1
        m.d.comb += [arr.ce.eq(en), arr.ce_p.eq(en & F[K + 1].valid),
                     arr.acc.eq(~F[K + 1].gfirst)]
        tails = [arr.sums[c] for c in range(D // 2)]

        # ---- split at the group's end, exact accumulators, o_b at the row's end -------------
        AB = attn_tile.pv_acc_bits(self.max_block)
        acc = [Signal(signed(AB), name=f"acc{n}") for n in range(D)]
        fx = F[K + 2]
        with m.If(en & fx.valid & fx.glast):
            for c, pc in enumerate(tails):
                packed = pc[:2 * k].as_signed()
                low = packed[:k].as_signed()
                high = packed[k:].as_signed() + packed[k - 1]
                for n, part in ((2 * c, low), (2 * c + 1, high)):
                    new = Signal(signed(AB), name=f"new{n}")
                    m.d.comb += new.eq(Mux(fx.rfirst, 0, acc[n]) + part)
                    m.d.sync += acc[n].eq(new)
                    with m.If(fx.rlast):
                        m.d.sync += self.o.payload.acc[n].eq(new)
            with m.If(fx.rlast):
                m.d.sync += [self.o.valid.eq(1), self.o.payload.last.eq(1),
                             self.o.payload.m.eq(fx.m),
                             self.o.payload.l.eq(fx.l), self.o.payload.s.eq(fx.s)]
        return m
