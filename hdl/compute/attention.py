"""Attention engine of the MCF node (paper §3.1, §4 end, §5): local attention over the KV blocks
a node holds, with the online softmax, grouped-query heads, causal mask and three modes.

Arithmetic, formats and the order of operations are those of :mod:`mcf.abi.kv`,
:mod:`mcf.abi.softmax` and the golden model :mod:`mcf.golden.attention`, bit for bit.

Structure: a **QK side** (:class:`~.attn_qkside.QKSide`: job intake, query load,
:class:`~.attn_score.ScorePipe`, the per-channel-K :class:`~.attn_group.GroupFold`) scores the K
rows of a block into one of ``score_slots`` score-memory slots while a **PV side**
(:class:`~.attn_pvside.PVSide`: :class:`~.attn_pv.PVPipe` into two :class:`~.attn_acc.AccBank`
accumulator banks, :class:`~.attn_merge.MergeStage`, :class:`~.attn_out.OutputStage`) consumes
the V rows of an earlier block against its finished scores, merges and emits. The sides hand
over through a ring of two job contexts and a ring of score-slot records
(:class:`~.attn_ring.JobRing`, :class:`~.attn_ring.SlotRing`); the engine holds the score and
row-record memories between them and the status counters. K and V rows come on separate
streams, so the two multiplier banks work on different blocks (and jobs) at the same time.
"""

from __future__ import annotations

from amaranth import Module, signed
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.framing import beat_layout
from mcf.abi.kv import (
    attn_job_layout,
    attn_status_layout,
    kv_beat_layout,
    kv_header_layout,
    q_beat_layout,
)
from mcf.abi.kv_channel import KV_GROUP, KVFormat
from mcf.abi.softmax import LANE_BITS, SCORE

from .attn_pvside import PVSide
from .attn_qkside import QKSide
from .attn_ring import JobRing, SlotRing, row_mem_depth, score_mem_depth, score_row_layout

__all__ = ["AttentionEngine"]


class AttentionEngine(wiring.Component):
    """Attention over local KV blocks, jobs of one query token × ``heads`` query heads sharing a
    KV head. Prefill (``normalize``, ``causal``) emits ``o / l`` for the next GEMM; decode emits
    per-head partial states ``(m, l, o)`` for the NIC reduction engine.

    Members
    -------
    job : In(stream.Signature(attn_job_layout(max_heads)))
        Job descriptor (:class:`mcf.abi.kv.AttnMode`, heads, block count, query position).
    q : In(stream.Signature(q_beat_layout(lanes)))
        ``heads · head_dim/lanes`` query beats per job, head-major.
    k : In(stream.Signature(kv_beat_layout(lanes)))
        Per job ``n_blocks`` K blocks: each block's K rows (``head_dim/lanes`` beats each,
        ``scale_k``, ``scale_v``, ``pos`` sampled on a row's first beat), ``last`` on the
        block's final beat. ``v`` is ignored.
    v : In(stream.Signature(kv_beat_layout(lanes)))
        Per job ``n_blocks`` V blocks (none for MAX-mode jobs): each block's V rows in the
        order of its K rows, ``last`` on the block's final beat. Only ``data`` and ``last`` are
        used (the V scale came with the K row).
    o : Out(stream.Signature(beat_layout(data_width)))
        Payload beats for the packetizer: per job :func:`mcf.abi.kv.job_out_words` 32-bit
        little-endian words (``pack_state`` per head, or ``o/l``, or ``m``) in
        :func:`mcf.abi.kv.job_payloads` payloads (one per head for states), ``keep`` on each
        payload's final beat, ``last`` at its end.
    kh : In(stream.Signature(kv_header_layout(lanes))) — ``kv_format = PER_CHANNEL_K`` only
        Per K block, for each group of ``kv_group`` rows from the block's first row (the last
        group may be shorter), the group header: ``head_dim/lanes`` beats of ``lanes`` K channel
        scale codes (:func:`mcf.abi.kv.pack_kv_channel_block`'s header, channel order). At
        each group's first row the QK side folds the header into every head's query
        (:class:`~.attn_fold.QueryFold`, :func:`mcf.abi.kv.fold_query`) and scores the group's
        records with the per-token path and their ``sk``. The fold is not overlapped with
        scoring: about ``heads · (2·head_dim/lanes + 6)`` cycles per group.
    status : Out(attn_status_layout())
        Counters (jobs, blocks, malformed input) and ``busy``. A job with ``heads`` outside
        ``1..max_heads`` or an undefined mode is rejected: its query beats, K blocks and (unless
        MAX) V blocks are consumed and dropped, nothing is emitted, ``err_job`` counts it.

    Throughput: the QK bank takes one (K beat, head) pair per cycle and the PV bank one
    (V beat, head) pair per cycle, concurrently on different blocks: the QK side runs up to
    ``score_slots − 1`` blocks (and one job) ahead of the PV side. Per (query, key, head) about
    ``head_dim / lanes`` cycles in steady state, plus ~10 cycles per block (drains, slot
    hand-over) and per job the query load (QK side), accumulator clear, last merge and output
    (PV side); the SINGLE-mode merge of a block (``heads·(head_dim/lanes · (lanes/merge_lanes +
    1) + 5)`` cycles) runs while the PV bank works on the next block. Causally masked K rows and
    their V rows pass at one beat per cycle, unscored. ``sim/perf/attention.py`` measures it.
    Latency: the output of a job starts ~10 cycles after its last V beat (SINGLE mode adds the
    last block's merge). Stream rules: ``o`` raises ``valid`` without waiting for ``ready`` and
    holds the beat; inputs are consumed only when needed, so sources may present beats early.
    Malformed blocks (a partial row, more K rows than ``max_block``, V row count differing from
    the K row count) are processed as far as they are well-formed and counted in ``err_rows``;
    nothing hangs on bad input.
    """

    def __init__(self, head_dim: int = 128, lanes: int = 16, max_heads: int = 6,
                 max_block: int = 256, data_width: int = 64, out_fifo_depth: int = 16,
                 merge_lanes: int | None = None, score_slots: int = 3,
                 kv_format: KVFormat = KVFormat.PER_TOKEN, kv_group: int = KV_GROUP):
        if head_dim % lanes:
            raise ValueError("head_dim must be a multiple of lanes")
        if lanes & (lanes - 1):
            raise ValueError("lanes must be a power of two")
        if data_width % LANE_BITS:
            raise ValueError("data_width must be a multiple of 32")
        if score_slots < 2:
            raise ValueError("score_slots must be at least 2 for the banks to overlap")
        self.head_dim, self.lanes, self.max_heads = head_dim, lanes, max_heads
        self.max_block, self.data_width = max_block, data_width
        self.out_fifo_depth = out_fifo_depth
        self.score_slots = score_slots
        self.kv_format, self.kv_group = KVFormat(kv_format), kv_group
        self.merge_lanes = merge_lanes if merge_lanes is not None else max(1, lanes // 4)
        if lanes % self.merge_lanes:
            raise ValueError("merge_lanes must divide lanes")
        super().__init__({
            "job": In(stream.Signature(attn_job_layout(max_heads))),
            "q": In(stream.Signature(q_beat_layout(lanes))),
            "k": In(stream.Signature(kv_beat_layout(lanes))),
            "v": In(stream.Signature(kv_beat_layout(lanes))),
            **({"kh": In(stream.Signature(kv_header_layout(lanes)))}
               if self.kv_format == KVFormat.PER_CHANNEL_K else {}),
            "o": Out(stream.Signature(beat_layout(data_width))),
            "status": Out(attn_status_layout()),
        })

    def elaborate(self, platform):
        m = Module()
        D, L, G, T = self.head_dim, self.lanes, self.max_heads, self.max_block
        NS = self.score_slots
        st = self.status

        m.submodules.qk = qk = QKSide(D, L, G, T, NS, self.kv_format, self.kv_group)
        m.submodules.pv = pv = PVSide(D, L, G, T, self.data_width, self.out_fifo_depth,
                                      self.merge_lanes, NS)
        m.submodules.jobs = jobs = JobRing(G)
        m.submodules.slots = slots = SlotRing(G, T, NS)
        for name in ("job", "q", "k") + (("kh",) if self.kv_format == KVFormat.PER_CHANNEL_K
                                         else ()):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(qk, name))
        wiring.connect(m, wiring.flipped(self.v), pv.v)
        wiring.connect(m, pv.o, wiring.flipped(self.o))
        wiring.connect(m, qk.ctx, jobs.w)
        wiring.connect(m, jobs.r, pv.ctx)
        wiring.connect(m, qk.slot, slots.w)
        wiring.connect(m, slots.r, pv.slot)

        # scores of NS blocks: address (slot·G + head, row); per row its record (V scale, not
        # masked); the QK side writes them, the PV side reads them
        m.submodules.smem = smem = Memory(shape=signed(SCORE.width),
                                          depth=score_mem_depth(G, T, NS), init=[])
        m.submodules.rmem = rmem = Memory(shape=score_row_layout(), depth=row_mem_depth(T, NS),
                                          init=[])
        wiring.connect(m, qk.s_wr, smem.write_port())
        wiring.connect(m, qk.r_wr, rmem.write_port())
        wiring.connect(m, pv.s_rd, smem.read_port())
        wiring.connect(m, pv.r_rd, rmem.read_port())
        wiring.connect(m, pv.r_nx, rmem.read_port())

        m.d.sync += [
            st.err_rows.eq(st.err_rows + qk.err_rows + pv.err_rows),
            st.blocks.eq(st.blocks + pv.block),
            st.err_job.eq(st.err_job + qk.err_job),
            st.jobs.eq(st.jobs + pv.job),
            st.err_max.eq(st.err_max + pv.err_max),
        ]
        m.d.comb += st.busy.eq(qk.busy | pv.busy | (jobs.r.count != 0))
        return m
