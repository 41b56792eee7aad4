"""S = Q·Kᵀ of prefill attention tiled for the GEMM arrays (issue #33 step 4; paper §3.1, §5).

Before :class:`~.tile_softmax.TileSoftmax`: a query row's INT8 codes against its KV block's INT4
K, two keys per DSP48E2 (``(k1·2^k + k0)·q``, the arrays' packing, on the cascades of
:class:`~.tile_cascade.PackedCascades` shared with TilePV), the packed sum over ``head_dim``
split into the exact ``acc = Σ q·k`` per key — :func:`mcf.golden.attention_tiled.qk_acc` bit for
bit — and emitted with the keys' ``sk``, ``sv``, the causal mask and the query's scale as
TileSoftmax's score rows (formats in :mod:`mcf.abi.attn_tile`). The per-channel query fold is
upstream: a query beat comes per key tile, already folded by the tile's group header.
"""

from __future__ import annotations

from amaranth import Array, Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.attn_tile import (
    k_word_layout,
    qk_acc_bits,
    qk_pack_shift,
    qk_tile_keys,
    score_q_layout,
    score_row_beat_layout,
)
from mcf.abi.kv import KV_ELEM, KV_SCALE, Q_ELEM
from mcf.abi.kv_channel import KV_GROUP

from .tile_cascade import PackedCascades

__all__ = ["TileScore", "k_banks"]


def k_banks(m: Module, keys: int, lanes: int, tile: int, words: int):
    """Two banks of ``words`` K words (``tile`` keys × ``lanes`` channels of INT4) and, addressed
    like them, each word's ``keys`` keys' ``sk``, ``sv`` (read asynchronously): the write and
    read ports ``(k_wr, k_rd, s_wr, s_rd)`` of TileScore's and ArrayScore's K memories."""
    wlay = data.ArrayLayout(data.ArrayLayout(signed(KV_ELEM.width), lanes), tile)
    slay = data.StructLayout({"sk": data.ArrayLayout(unsigned(KV_SCALE.width), keys),
                              "sv": data.ArrayLayout(unsigned(KV_SCALE.width), keys)})
    m.submodules.kmem = kmem = Memory(shape=wlay, depth=2 * words, init=[])
    m.submodules.smem = smem = Memory(shape=slay, depth=2 * words, init=[])
    return (kmem.write_port(), kmem.read_port(), smem.write_port(),
            smem.read_port(domain="comb"))


class TileScore(wiring.Component):
    """``acc = Σ q·k`` of query rows against a KV block's K, emitted as score rows:
    ``keys × head_dim`` MACs per cycle in ``keys × head_dim / 2`` DSP48E2 slices.

    The array: a key tile is ``R`` = :func:`~mcf.abi.attn_tile.qk_tile_keys` keys (``keys ×
    head_dim / lanes``); per key pair ``(2p, 2p+1)`` of the tile one cascade of ``lanes``
    slices (:class:`~.tile_cascade.PackedCascades`; lane ``j`` = channel ``c·lanes + j`` of
    chunk ``c``, its inputs ``j`` cycles late — the form of ``GemmArray``'s DSP chains),
    ``A = k[2p+1]·2^sh``, ``D = k[2p]``, ``B = q``,
    ``sh`` = :func:`~mcf.abi.attn_tile.qk_pack_shift`. The chain's last slice accumulates the
    packed sum over the ``S = head_dim / lanes`` chunks (one dot product: one group, exact),
    which is split into the two keys' exact ``acc`` (:func:`~mcf.abi.attn_tile.qk_acc_bits`).
    The tile's ``R`` sums then leave as ``S`` beats of ``keys`` keys (fewer for a block's
    last, partial tile), each key with its ``sk``, ``sv`` and ``masked`` (key ``≥ visible``
    or ``≥`` the block's keys).

    K is held in two banks of ``max_block`` keys: the next block loads while rows run
    against the current one; a bank is freed when its last row's last beat has left.

    Parameters
    ----------
    keys : keys per output beat (TileSoftmax's ``keys``); head_dim; lanes : channels per
    cycle (the cascades' length; divides ``head_dim``); max_block : keys of a bank (a
    multiple of ``R``); max_rows : rows per block; dsp : ``"model"`` (the slices in logic)
    or ``"primitive"`` (``DSP48E2`` instances, synthesis only). ``R`` is even and divides
    :data:`mcf.abi.kv_channel.KV_GROUP` (a key tile never spans two per-channel groups).

    Members
    -------
    k : In(stream.Signature(k_word_layout(keys, head_dim, lanes, max_block, max_rows)))
        A block's K words in (key tile, chunk) order, ``n`` and ``rows`` on the ``last``
        word; ready while a bank is free.
    q : In(stream.Signature(score_q_layout(head_dim, max_block, max_rows)))
        Query beats, one per key tile (``ceil(n / R)`` per row), each row against the oldest
        loaded block whose rows are not all issued; after its ``rows`` rows, the next block.
        Ready at a tile's first step while a block is loaded and the pipeline runs.
    o : Out(stream.Signature(score_row_beat_layout(keys, head_dim, max_rows)))
        Score rows, ``ceil(n / keys)`` beats each, ``last`` on the final one; ``row``,
        ``first``, ``final`` on every beat. Rows in order; the payload holds until taken.

    Rate: one chunk step per cycle, i.e. ``S`` cycles per key tile, and one output beat per
    cycle when ``R`` divides ``n`` (``keys × head_dim`` MACs per cycle), while ``o`` is taken
    (a partial last tile still takes ``S`` cycles); the pipeline stalls as a whole only while
    a finished tile waits for the previous one to leave.
    Latency: :meth:`latency` = ``lanes + S + 3`` cycles from a tile's first query beat taken
    to its first output beat valid.
    """

    def __init__(self, keys: int = 4, head_dim: int = 128, lanes: int = 16,
                 max_block: int = 256, max_rows: int = 64, dsp: str = "model"):
        if head_dim % lanes:
            raise ValueError("lanes must divide head_dim")
        tile = qk_tile_keys(keys, head_dim, lanes)
        if tile % 2 or KV_GROUP % tile or max_block % tile:
            raise ValueError(f"a key tile of {tile} keys must be even, divide {KV_GROUP} "
                             "and max_block")
        if dsp not in ("model", "primitive"):
            raise ValueError("dsp must be 'model' or 'primitive'")
        self.keys, self.head_dim, self.lanes, self.max_block = keys, head_dim, lanes, max_block
        self.max_rows, self.dsp, self.tile = max_rows, dsp, tile
        self.steps = head_dim // lanes
        super().__init__({
            "k": In(stream.Signature(k_word_layout(keys, head_dim, lanes, max_block, max_rows))),
            "q": In(stream.Signature(score_q_layout(head_dim, max_block, max_rows))),
            "o": Out(stream.Signature(score_row_beat_layout(keys, head_dim, max_rows))),
        })

    @property
    def latency(self) -> int:
        return self.lanes + self.steps + 3

    @property
    def dsps(self) -> int:
        return self.keys * self.head_dim // 2

    def elaborate(self, platform):
        m = Module()
        K, L, S, R = self.keys, self.lanes, self.steps, self.tile
        NW = self.max_block // K                      # words of a bank (= score beats)
        NT = self.max_block // R                      # key tiles of a bank
        sh = qk_pack_shift(self.head_dim)
        AB = qk_acc_bits(self.head_dim)

        # ---- the emitter's buffer (declared first: the stall depends on it) --------------------
        o = self.o
        ob = [Signal(signed(AB), name=f"ob{i}") for i in range(R)]
        ob_beat = Signal(range(S))                    # beat of the buffered tile on o
        ob_beats = Signal(range(S + 1))               # its beats
        ob_rlast = Signal()                           # the tile is the row's last
        ob_bank = Signal()
        ob_kidx = Signal(range(self.max_block + R))   # key index of the beat's key 0
        ob_lim = Signal(range(self.max_block + 1))    # keys ≥ ob_lim masked
        ob_word = Signal(range(NW))
        ob_meta = Signal(data.StructLayout({"scale_m": o.payload.beat.scale_m.shape(),
                                            "scale_e": o.payload.beat.scale_e.shape(),
                                            "row": o.payload.row.shape(), "first": 1,
                                            "final": 1}))
        ob_end = Signal()                             # the buffer's last beat is taken now
        m.d.comb += ob_end.eq(o.valid & o.ready & (ob_beat == ob_beats - 1))

        # ---- K banks (the words, and the keys' scales addressed like the beats) -------------
        k_wr, k_rd, s_wr, s_rd = k_banks(m, K, L, R, NW)
        full = Array(Signal(name=f"full{b}") for b in range(2))       # loaded, not yet emitted
        loaded = Array(Signal(name=f"loaded{b}") for b in range(2))   # loaded, rows to issue
        nrows = Array(Signal(range(self.max_rows + 1), name=f"nrows{b}") for b in range(2))
        nkeys = Array(Signal(range(self.max_block + 1), name=f"nkeys{b}") for b in range(2))
        wb, rb, eb = Signal(), Signal(), Signal()     # bank loading, issuing, emitting
        kword = Signal(range(NW))
        k = self.k
        m.d.comb += [k.ready.eq(~full[wb]),
                     k_wr.addr.eq(Mux(wb, NW, 0) + kword), k_wr.data.eq(k.payload.k),
                     k_wr.en.eq(k.valid & k.ready),
                     s_wr.addr.eq(k_wr.addr), s_wr.en.eq(k_wr.en),
                     s_wr.data.sk.eq(k.payload.sk), s_wr.data.sv.eq(k.payload.sv)]
        with m.If(k.valid & k.ready):
            m.d.sync += kword.eq(Mux(k.payload.last, 0, kword + 1))
            with m.If(k.payload.last & (k.payload.rows != 0)):
                m.d.sync += [full[wb].eq(1), loaded[wb].eq(1), nrows[wb].eq(k.payload.rows),
                             nkeys[wb].eq(k.payload.n), wb.eq(~wb)]

        # ---- flags of a step, delayed with it (F[n]: in the step's cycle c0 + n) ---------------
        flay = data.StructLayout({"valid": 1, "tfirst": 1, "tend": 1, "rlast": 1, "bank": 1,
                                  "kt": range(NT), "lim": range(self.max_block + 1),
                                  "meta": ob_meta.shape()})
        F = [Signal(flay, name=f"f{n}") for n in range(L + 3)]
        fx = F[L + 2]                                 # the split's cycle
        en = Signal()
        m.d.comb += en.eq(~(fx.valid & fx.tend & o.valid & ~ob_end))

        # ---- stage A: issue a chunk step, read its K word -------------------------------------
        q = self.q
        c = Signal(range(S))
        kt = Signal(range(NT))
        done = Signal(range(self.max_rows + 1))       # rows of the bank issued
        ntiles = Signal(range(NT + 1))
        m.d.comb += ntiles.eq((nkeys[rb] + R - 1) // R)
        issue = Signal()
        m.d.comb += [q.ready.eq(en & loaded[rb] & (c == 0)),
                     issue.eq(en & loaded[rb] & ((c != 0) | q.valid)),
                     k_rd.addr.eq(Mux(rb, NW, 0) + kt * S + c), k_rd.en.eq(en)]
        qreg = Signal(q.payload.shape())
        tend = c == S - 1
        rlast = kt == ntiles - 1
        with m.If(q.valid & q.ready):
            m.d.sync += qreg.eq(q.payload)
        with m.If(issue):
            m.d.sync += c.eq(Mux(tend, 0, c + 1))
            with m.If(tend):
                m.d.sync += kt.eq(Mux(rlast, 0, kt + 1))
                with m.If(rlast):
                    with m.If(done + 1 == nrows[rb]):
                        m.d.sync += [done.eq(0), loaded[rb].eq(0), rb.eq(~rb)]
                    with m.Else():
                        m.d.sync += done.eq(done + 1)
        qmeta = Signal(q.payload.shape())             # the tile's query beat
        m.d.comb += qmeta.eq(Mux(c == 0, q.payload, qreg))
        with m.If(en):
            m.d.sync += [F[0].valid.eq(issue), F[0].tfirst.eq(c == 0), F[0].tend.eq(tend),
                         F[0].rlast.eq(rlast), F[0].bank.eq(rb), F[0].kt.eq(kt),
                         F[0].lim.eq(Mux(qmeta.visible < nkeys[rb], qmeta.visible, nkeys[rb])),
                         F[0].meta.scale_m.eq(qmeta.scale_m),
                         F[0].meta.scale_e.eq(qmeta.scale_e), F[0].meta.row.eq(qmeta.row),
                         F[0].meta.first.eq(qmeta.first), F[0].meta.final.eq(qmeta.final)]
            m.d.sync += [F[n].eq(F[n - 1]) for n in range(1, L + 3)]
        cur = Signal(range(S))                        # the chunk of the step in F[0]
        with m.If(en):
            m.d.sync += cur.eq(c)

        # ---- the array: lane j's inputs j cycles late, one cascade per key pair -------------
        qchunks = Array(qreg.q[n * L:(n + 1) * L] for n in range(S))
        qc = Signal(data.ArrayLayout(signed(Q_ELEM.width), L))
        m.d.comb += qc.eq(qchunks[cur])
        kw = k_rd.data
        m.submodules.array = arr = PackedCascades(
            lanes=L, pairs=R // 2, a_shape=signed(KV_ELEM.width), b_shape=signed(Q_ELEM.width),
            shift=sh, dsp=self.dsp)
        for j in range(L):
            m.d.comb += [arr.a[j].eq(Cat(*(kw[r][j] for r in range(R)))), arr.b[j].eq(qc[j])]
        # P ← M + PCIN (+ P within the tile) in the step's cycle c0 + L + 1
        m.d.comb += [arr.ce.eq(en), arr.ce_p.eq(en & F[L + 1].valid),
                     arr.acc.eq(~F[L + 1].tfirst)]
        tails = [arr.sums[p] for p in range(R // 2)]

        # ---- split at the tile's end into the emitter's buffer ---------------------------------
        with m.If(en & fx.valid & fx.tend):
            for p, pc in enumerate(tails):
                packed = pc[:2 * sh].as_signed()
                m.d.sync += [ob[2 * p].eq(packed[:sh].as_signed()),
                             ob[2 * p + 1].eq(packed[sh:].as_signed() + packed[sh - 1])]
            left = Signal(range(self.max_block + 1))
            m.d.comb += left.eq(nkeys[fx.bank] - fx.kt * R)
            m.d.sync += [o.valid.eq(1), ob_beat.eq(0),
                         ob_beats.eq(Mux(left >= R, S, (left + K - 1) // K)),
                         ob_rlast.eq(fx.rlast), ob_bank.eq(fx.bank), ob_kidx.eq(fx.kt * R),
                         ob_lim.eq(fx.lim), ob_word.eq(fx.kt * S), ob_meta.eq(fx.meta)]
        with m.Elif(o.valid & o.ready):
            m.d.sync += [ob_beat.eq(ob_beat + 1), ob_kidx.eq(ob_kidx + K),
                         ob_word.eq(ob_word + 1)]
            m.d.sync += [ob[i].eq(ob[i + K]) for i in range(R - K)]
            with m.If(ob_end):
                m.d.sync += o.valid.eq(0)

        # ---- the emitter: beat by beat, the keys' scales and masks; frees a bank -------------
        ol = o.payload.beat
        m.d.comb += s_rd.addr.eq(Mux(ob_bank, NW, 0) + ob_word)
        for j in range(K):
            m.d.comb += [ol.keys[j].acc.eq(ob[j]), ol.keys[j].sk.eq(s_rd.data.sk[j]),
                         ol.keys[j].sv.eq(s_rd.data.sv[j]),
                         ol.keys[j].masked.eq(ob_kidx + j >= ob_lim)]
        m.d.comb += [ol.scale_m.eq(ob_meta.scale_m), ol.scale_e.eq(ob_meta.scale_e),
                     ol.last.eq(ob_rlast & (ob_beat == ob_beats - 1)),
                     o.payload.row.eq(ob_meta.row), o.payload.first.eq(ob_meta.first),
                     o.payload.final.eq(ob_meta.final)]
        edone = Signal(range(self.max_rows + 1))      # rows of the bank emitted
        with m.If(ob_end & ob_rlast):
            with m.If(edone + 1 == nrows[eb]):
                m.d.sync += [edone.eq(0), full[eb].eq(0), eb.eq(~eb)]
            with m.Else():
                m.d.sync += edone.eq(edone + 1)
        return m
