"""Online merge of the tiled prefill's block states (issue #33 step 4; paper §3.1, §5).

After :class:`~.tile_pv.TilePV`: each query row of a tile keeps a running state ``(m, l, o)``;
a block's ``(m_b, l_b, o_b = sat(acc·2^s))`` is merged into it with
:func:`mcf.abi.softmax.merge_state` bit for bit (through :class:`~.attn_merge.MergeUnit`), the
row's first block into the empty state, and after the row's final block the merged state goes
out — the SINGLE-mode loop of
:func:`mcf.golden.attention_tiled.attend_tiled_rows`.
"""

from __future__ import annotations

from amaranth import Array, Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.attn_tile import P8, merge_beat_layout, merge_in_layout
from mcf.abi.kv import AttnMode
from mcf.abi.softmax import LANE_BITS, M_EMPTY, STATE_L, STATE_M, STATE_O

from .attn_merge import MergeUnit, merge_head_state
from .fixed_ops import sat

__all__ = ["TileMerge"]


class TileMerge(wiring.Component):
    """Running states of a query tile's ``rows`` rows, block states merged in, one row at a
    time, ``lanes`` ``o`` lanes per cycle.

    Members
    -------
    i : In(stream.Signature(merge_in_layout(in_channels, rows, max_block, p_format)))
        A row's block state as the P·V stage emits it, ``head_dim / in_channels`` beats in
        channel order (``m_b``, ``l_b``, ``s``, the row's tag the same on each; the beat's exact
        sums ``acc``: ``o_b = sat(acc << s)`` is formed here, ``lanes`` channels per cycle; with
        ``p_format = PV_W`` as ArrayPV emits today's ``Σ w·v``, ``s`` 0), the row
        (``0 .. rows−1``), ``first`` (merge into the empty state: the running state is not
        read), ``final`` (emit the merged state) and, with ``p_format = PV_W``, the row's
        ``mode``: SINGLE merges online; FIXED adds ``l_b`` and ``acc`` into ``l``, ``o`` with
        32-bit wrap-around (``m`` is the blocks' ``m_fix``) —
        :func:`mcf.golden.attention.attend_fixed`'s sums; MAX keeps ``m = max(m, m_b)`` with
        ``l``, ``o`` 0 — :func:`mcf.golden.attention.attend_max`. A row's blocks come in KV
        order; rows of a block in any order. A row's first beat is taken in the idle state,
        each further one as the merge reaches its channels (the merge waits for it).
    o : Out(stream.Signature(merge_beat_layout(lanes, rows)))
        After a ``final`` block: the row's merged ``(m, l, o)`` and the row, ``head_dim/lanes``
        beats of ``lanes`` channels as the words are merged (``m``, ``l`` on each); the merge
        waits while a beat is not taken.

    The running states live in two memories (``m, l`` per row; ``o`` in ``head_dim / lanes``
    words of ``lanes`` lanes per row).

    Rate: one block state per :meth:`cycles_per_row` = ``MergeUnit.LATENCY + head_dim/lanes
    + 3`` cycles (measured in ``tests/test_tile_merge.py``): 38 at ``head_dim`` 128 and the
    default 4 lanes (14 with 16), against the P·V arrays' one row per ``block / keys`` = 64
    cycles on the kr260 shape.
    Latency: the same, from a ``final`` state taken to its last beat's ``o.valid`` (beats taken
    at once).
    """

    def __init__(self, head_dim: int = 128, rows: int = 64, lanes: int = 4,
                 max_block: int = 256, p_format=P8, in_channels: int | None = None):
        in_channels = head_dim if in_channels is None else in_channels
        if head_dim % in_channels or in_channels % lanes:
            raise ValueError("lanes must divide in_channels, in_channels head_dim")
        self.head_dim, self.rows, self.lanes, self.max_block = head_dim, rows, lanes, max_block
        self.p_format, self.in_channels = p_format, in_channels
        super().__init__({
            "i": In(stream.Signature(merge_in_layout(in_channels, rows, max_block, p_format))),
            "o": Out(stream.Signature(merge_beat_layout(lanes, rows))),
        })

    @property
    def cycles_per_row(self) -> int:
        return self.row_cycles(self.head_dim, self.lanes)

    @staticmethod
    def row_cycles(head_dim: int, lanes: int) -> int:
        """Cycles per block state (and from a ``final`` one taken to its output)."""
        return MergeUnit.LATENCY + head_dim // lanes + 3

    def elaborate(self, platform):
        m = Module()
        D, ML, R = self.head_dim, self.lanes, self.rows
        NB = D // ML
        W = ML * LANE_BITS
        m.submodules.unit = mu = MergeUnit(ML, LANE_BITS)
        ml_lay = data.StructLayout({"m": signed(STATE_M.width), "l": unsigned(STATE_L.width)})
        m.submodules.mlmem = mlmem = Memory(shape=ml_lay, depth=R, init=[])
        m.submodules.omem = omem = Memory(shape=unsigned(W), depth=R * NB, init=[])
        ml_wr, ml_rd = mlmem.write_port(), mlmem.read_port(transparent_for=())
        o_wr, o_rd = omem.write_port(), omem.read_port(transparent_for=())

        blk = Signal(self.i.payload.shape())          # the row's beat being merged
        WPB = self.in_channels // ML                  # words of a beat
        # o_b of word cd's lanes: the word's sums selected from the beat, then sat(acc << s)
        # on ``lanes`` shifters (mcf.abi.attn_tile.pv_p8_out, STATE_O)
        AW = len(blk.state.acc[0])
        acc_words = Array(blk.state.acc.as_value()[j * ML * AW:(j + 1) * ML * AW]
                          for j in range(WPB))
        acc_sel = Signal(ML * AW)
        bword = Cat(*(sat(acc_sel[n * AW:(n + 1) * AW].as_signed() << blk.state.s,
                          STATE_O.width, True) for n in range(ML)))
        c = Signal(range(NB + 1))              # word read
        cd = Signal(range(NB))                 # word whose data is on o_rd
        vld, started = Signal(), Signal()
        out = self.o.payload
        idle = Signal()
        # a final block's word waits while the beat before it is not taken, and the word
        # after a beat's last one while the row's next beat has not come (c, cd, the read
        # port's data and the merge inputs hold)
        hold = Signal()
        in_run = Signal()
        nxt = Signal()                         # word cd ends a beat, another one follows
        m.d.comb += nxt.eq(in_run & vld & ((cd % WPB == WPB - 1) if WPB > 1 else 1)
                           & (cd != NB - 1) if WPB < NB else 0)
        m.d.comb += [hold.eq((blk.final & self.o.valid & ~self.o.ready) |
                             (nxt & ~self.i.valid)),
                     ml_rd.addr.eq(Mux(idle, self.i.payload.row, blk.row)),
                     o_rd.addr.eq(blk.row * NB + c), o_rd.en.eq(~hold)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        m.d.comb += [
            mu.m_run.eq(Mux(blk.first, M_EMPTY, ml_rd.data.m)), mu.m_blk.eq(blk.state.m),
            mu.l_run.eq(Mux(blk.first, 0, ml_rd.data.l)), mu.l_blk.eq(blk.state.l),
            mu.o_run.eq(Mux(blk.first, 0, o_rd.data)), mu.o_blk.eq(bword),
            acc_sel.eq(acc_words[cd % WPB] if WPB > 1 else blk.state.acc.as_value()),
            o_wr.addr.eq(blk.row * NB + cd),
            ml_wr.addr.eq(blk.row), ml_wr.data.m.eq(mu.m_new),
        ]
        # the word and l written back: the online merge (SINGLE), or with p_format = PV_W
        # FIXED's wrapped sums and MAX's maximum alone (m: MergeUnit's max of m_run, m_b —
        # FIXED's blocks all carry m_fix)
        o_new, l_new = mu.o_out, mu.l_out
        if self.p_format != P8:
            o_run, l_run = mu.o_run, mu.l_run         # 0 on a row's first block
            o_fix = Cat(*((o_run[n * LANE_BITS:(n + 1) * LANE_BITS]
                           + acc_sel[n * AW:(n + 1) * AW].as_signed())[:LANE_BITS]
                          for n in range(ML)))
            mode = blk.mode
            o_new = Mux(mode == AttnMode.FIXED, o_fix, Mux(mode == AttnMode.MAX, 0, mu.o_out))
            l_new = Mux(mode == AttnMode.FIXED, (l_run + blk.state.l)[:LANE_BITS],
                        Mux(mode == AttnMode.MAX, 0, mu.l_out))
        m.d.comb += [o_wr.data.eq(o_new), ml_wr.data.l.eq(l_new)]
        with m.FSM() as fsm:
            with m.State("IDLE"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid & self.i.ready):
                    m.d.sync += [blk.eq(self.i.payload), started.eq(0)]
                    m.next = "HEAD"
            # the row's m, l on ml_rd; m_new, then the scale factors (MergeUnit.LATENCY)
            merge_head_state(m, mu, started, then="RUN", on_done=[c.eq(0), vld.eq(0)])
            with m.State("RUN"), m.If(~hold):
                # read word c; merge and write back word cd (read the cycle before); the row's
                # next beat taken with its first word's turn
                m.d.sync += [vld.eq(c != NB), cd.eq(c), c.eq(Mux(c == NB, NB, c + 1))]
                with m.If(nxt):
                    m.d.comb += self.i.ready.eq(1)
                    m.d.sync += blk.state.acc.eq(self.i.payload.state.acc)
                with m.If(vld):
                    m.d.comb += o_wr.en.eq(1)
                    with m.If(blk.final):
                        m.d.sync += [self.o.valid.eq(1), out.state.o.eq(o_new),
                                     out.row.eq(blk.row), out.state.m.eq(mu.m_new),
                                     out.state.l.eq(l_new), out.last.eq(cd == NB - 1)]
                    with m.If(cd == NB - 1):
                        m.d.comb += ml_wr.en.eq(1)
                        m.next = "IDLE"
        m.d.comb += [idle.eq(fsm.ongoing("IDLE")), in_run.eq(fsm.ongoing("RUN"))]
        return m
