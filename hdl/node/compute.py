"""The compute half of the node top (docs/node.md §3, §4, §11; paper §5, Fig. 2): the COMPUTE
sequencer's JOB, EMIT and ATTEND records become GEMM/vector work, K/V fragments and attention
jobs, each unit reading what it needs from DDR itself."""

from __future__ import annotations

from amaranth import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.attend import ATT_ALIGN, ATTEND_STATUS, ATTEND_TILE_ROWS
from mcf.abi.compute import (
    COMPUTE_BUSY_STATUS,
    DMA_ADDR_BITS,
    DMA_STATUS,
    GEMM_STATUS,
    STRIPE_STATUS,
    VECTOR_STATUS,
    WEIGHT_STRIPES,
)
from mcf.abi.emit import EMIT_CONFIG, EMIT_STATUS
from mcf.abi.framing import beat_layout, parsed_layout
from mcf.abi.jobs import JOB_ALIGN, JOB_INDEX_BITS, JOB_WR_ALIGN, JOBS_STATUS
from mcf.abi.kv import attn_status_layout
from mcf.abi.kv_reader import KV_READER_STATUS
from mcf.abi.meta import META
from mcf.abi.node import CMD
from mcf.abi.node_config import AXI_WIDTH, PACKET_WIDTH, NodeConfig

from ..compute.attention import AttentionEngine
from ..compute.gemm_top import MatrixEngine
from ..compute.tile_prefill import TilePrefill
from ..mem.axi import ADDR_BITS, AXI4Signature
from ..mem.dma import LUTRAM_FIFO_DEPTH, DmaReader, DmaWriter
from ..stream.register_slice import RegisterSlice
from .attend import AttendUnit
from .attend_split import AttendSplit, steer
from .emit import EmitUnit
from .jobs import JobWalker, connect_engine
from .kv_reader import KvReader
from .tile_unit import TileUnit

__all__ = ["NodeCompute", "COMPUTE_BUSES"]

WEIGHT_BUSES = tuple(f"w{p}" for p in range(WEIGHT_STRIPES))
"""The stripe readers' masters, ``w<p>`` on HP port ``p`` (docs/node.md §4)."""

COMPUTE_BUSES = ("walker", "mat0", "mat1", "emit", "att_rd", "att_wr", "kvr", *WEIGHT_BUSES)
"""The AXI4 masters of the compute half (members ``m_axi_<name>``); the node top places each
on an HP port (docs/node.md §4)."""


class NodeCompute(wiring.Component):
    """JOB walker + matrix engine, K/V emitter, ATTEND executor + KV reader + attention engine
    (+ with the tiled path, ``config.tiled``: the PREFILL_TILE executor and its chain).

    The matrix engine reads its weights through stripe readers on every HP port
    (``MatrixEngine(w_ports=WEIGHT_STRIPES)``, the walker's STRIPE entries; docs/node.md §4) in
    both configurations: its ``w_in`` is ``WEIGHT_STRIPES · 128`` = 512 bits wide; port 1
    (``mat1``) reads only the vector unit's second operand.

    Parameters
    ----------
    config : :class:`mcf.abi.node_config.NodeConfig` — the engines' geometry.

    Members
    -------
    job, emit, attend : In(stream.Signature(:data:`mcf.abi.node.CMD`))
        The COMPUTE sequencer's record streams of the same names.
    job_done, emit_done, attend_done : Out(1)
        One strobe per record retired (to the sequencer).
    jobs_table, jobs_table_len, emit_cfg, att_list_base, local_id : In
        Configuration from the registers ``JOBS_TABLE_*``, ``EMIT_*``, ``ATT_LIST_BASE_*`` and
        ``NODE.local_id``.
    local : Out(stream.Signature(parsed_layout(64)))
        EMIT's local K/V fragments (to the local sink, packet by packet).
    staged_emit, staged_attn : Out(stream.Signature(beat_layout(64)))
        EMIT's replica payloads and ATTEND's decode states, to the send unit's staged FIFOs.
    m_axi_<bus> : Out(AXI4Signature(40, 128)) for each of :data:`COMPUTE_BUSES`
        walker (template rows, R only), mat0 (activations R, results W), mat1 (vector 2nd
        operand R), emit (ACT K/V rows R), att_rd (lists and queries R), att_wr (PREFILL
        ``o/l`` W; PREFILL_TILE rows), kvr (K/V token records R), w0..w3 (weight stripe ``p``,
        R only).
    jobs_status, emit_status, att_status, kvr_status, dma0_status, dma1_status, gemm_status,
    vector_status, attn_status, stripe_status : Out — every unit's counters.
    cmp_status : Out(:data:`mcf.abi.compute.COMPUTE_BUSY_STATUS`) — busy cycles per record
        stream and in all (a record is in progress from its transfer to its ``done``).

    With ``config.tiled`` the ATTEND records are split by ``arg.mode``
    (:class:`~mcf.hdl.node.attend_split.AttendSplit`): PREFILL_TILE to a
    :class:`~mcf.hdl.node.tile_unit.TileUnit` (``max_chunk`` = ``tile_max_chunk``, query tiles
    of :data:`~mcf.abi.attend.ATTEND_TILE_ROWS` rows) →
    :class:`~mcf.hdl.compute.tile_prefill.TilePrefill` (``keys`` = ``tile_keys``, ``lanes`` =
    ``tile_lanes``), the other modes to the AttendUnit, one record at a time; ``attend_done``
    is either's ``done``, ``att_status`` their counters summed. The one KV reader serves both
    (its block requests from, and its ``k``/``v`` to, the record's executor: TilePrefill's
    ``in_lanes`` is ``attn_lanes``) — a second one would idle whenever the first works and
    cost a DMA reader, its V FIFO (block RAM) and a bus name — and ``att_rd`` / ``att_wr`` are
    one DmaReader and one DmaWriter that serve the record's executor (a select, not an
    arbiter: only one executor is in work; ≈ 2.3k LUT less than a pair each; the units built
    with ``own_dma = False``). Without the tiled path the node is as it was: PREFILL_TILE is a
    bad record (``attend_model(..., max_chunk=0)``). With ``config.tile_on_gemm`` TilePrefill's S
    and P·V run on the GEMM's arrays (:class:`~mcf.hdl.compute.array_attend.ArrayAttention`,
    clients 1 and 2 of the matrix engine's :class:`~mcf.hdl.compute.gemm_shared.SharedGemm`),
    taking turns with the GEMM's dot products; else on arrays of their own. With
    ``config.attn_on_arrays`` the AttendUnit's engine is an
    :class:`~mcf.hdl.compute.array_engine.ArrayEngine` on TilePrefill's own chain
    (``engine_width``; the chain in today's ``w``, the chunks' rows in P8; steered by the
    record in work, like the KV reader) instead of the vector
    :class:`~mcf.hdl.compute.attention.AttentionEngine`: the same words.

    Latency: each unit's own (their docstrings); the three record streams run concurrently,
    each one record at a time.
    """

    def __init__(self, config: NodeConfig):
        c = self.config = config
        if c.hp_ports != WEIGHT_STRIPES:
            raise ValueError(f"{c.name}: the weights are striped over {WEIGHT_STRIPES} HP ports")
        self.walker = JobWalker(c.gemm_limits, vec_n_max=c.vec_n_max, data_width=AXI_WIDTH,
                                stripes=True)
        self.matrix = MatrixEngine(rows=c.gemm_rows, lanes=c.gemm_lanes, group=c.group,
                                   k_max=c.gemm_k_max, m_max=c.gemm_m_max,
                                   vec_n_max=c.vec_n_max, data_width=AXI_WIDTH,
                                   arrays=c.gemm_arrays, chain=c.gemm_chain, dsp=c.gemm_dsp,
                                   w_ports=WEIGHT_STRIPES, clients=2 if c.tile_on_gemm else 0,
                                   tile_ram=c.gemm_tile_ram, rd_align=JOB_ALIGN,
                                   wr_align=JOB_WR_ALIGN)
        self.emitter = EmitUnit(c.attn_head_dim)
        # with the tiled path the two ATTEND executors share one DMA reader and writer
        self.attender = AttendUnit(c.attn_head_dim, c.attn_lanes, c.attn_heads, c.attn_block,
                                   max_list=c.attn_max_list, out_width=PACKET_WIDTH,
                                   data_width=AXI_WIDTH, own_dma=not c.tiled)
        self.reader = KvReader(c.attn_head_dim, c.attn_lanes, c.attn_block)
        # attn_on_arrays: the engine's jobs on TilePrefill's chain (its ArrayEngine)
        self.engine = None if c.attn_on_arrays else AttentionEngine(
            c.attn_head_dim, c.attn_lanes, c.attn_heads, c.attn_block, data_width=PACKET_WIDTH,
            kv_format=c.kv_format)
        if c.tiled:
            self.split = AttendSplit()
            self.tiler = TileUnit(c.attn_head_dim, c.attn_heads, c.attn_block,
                                  max_list=c.attn_max_list, max_chunk=c.tile_max_chunk,
                                  rows=ATTEND_TILE_ROWS, data_width=AXI_WIDTH,
                                  own_dma=False)
            self.prefill = TilePrefill(keys=c.tile_keys, head_dim=c.attn_head_dim,
                                       lanes=c.tile_lanes, in_lanes=c.attn_lanes,
                                       max_block=c.attn_block, rows=ATTEND_TILE_ROWS,
                                       max_rows=self.tiler.max_rows, max_heads=c.attn_heads,
                                       kv_format=c.kv_format,
                                       engine_width=PACKET_WIDTH if c.attn_on_arrays else 0,
                                       query_words=c.tile_query_words,
                                       **self._tile_arrays(c))
        rec = stream.Signature(CMD)
        axi = AXI4Signature(ADDR_BITS, AXI_WIDTH)
        super().__init__({
            "job": In(rec), "emit": In(rec), "attend": In(rec),
            "job_done": Out(1), "emit_done": Out(1), "attend_done": Out(1),
            "jobs_table": In(DMA_ADDR_BITS), "jobs_table_len": In(JOB_INDEX_BITS),
            "emit_cfg": In(EMIT_CONFIG), "att_list_base": In(DMA_ADDR_BITS),
            "local_id": In(META["src"].shape),
            "local": Out(stream.Signature(parsed_layout(PACKET_WIDTH))),
            "staged_emit": Out(stream.Signature(beat_layout(PACKET_WIDTH))),
            "staged_attn": Out(stream.Signature(beat_layout(PACKET_WIDTH))),
            **{f"m_axi_{b}": Out(axi) for b in COMPUTE_BUSES},
            "jobs_status": Out(JOBS_STATUS), "emit_status": Out(EMIT_STATUS),
            "att_status": Out(ATTEND_STATUS), "kvr_status": Out(KV_READER_STATUS),
            "dma0_status": Out(DMA_STATUS), "dma1_status": Out(DMA_STATUS),
            "gemm_status": Out(GEMM_STATUS), "vector_status": Out(VECTOR_STATUS),
            "attn_status": Out(attn_status_layout()), "stripe_status": Out(STRIPE_STATUS),
            "cmp_status": Out(COMPUTE_BUSY_STATUS),
        })

    @staticmethod
    def _tile_arrays(c: NodeConfig) -> dict:
        """TilePrefill's arrays: its own TileAttention, or (``tile_on_gemm``) S and P·V on the
        GEMM's arrays, reached through the matrix engine's share clients 1 and 2."""
        if not c.tile_on_gemm:
            return {}
        return {"arrays": c.gemm_arrays, "array_rows": c.gemm_rows, "chain": c.gemm_chain,
                "dsp": c.gemm_dsp, "own_arrays": False}

    def elaborate(self, platform):
        m = Module()
        parts = ("walker", "matrix", "emitter", "attender", "reader")
        for name in parts:
            m.submodules[name] = getattr(self, name)
        w, x, e, a, r = (getattr(self, name) for name in parts)
        g = self.engine
        if g is not None:
            m.submodules.engine = g
            eng = {"job": g.job, "q": g.q, "o": g.o, "status": g.status}
        else:                           # ArrayEngine inside TilePrefill, on its chain
            p = self.prefill
            eng = {"job": p.ejob, "q": p.eq, "o": p.eo, "status": p.estatus}

        # JOB: walker → matrix engine
        wiring.connect(m, wiring.flipped(self.job), w.rec)
        connect_engine(m, w, x)
        m.d.comb += [self.job_done.eq(w.done), w.table_base.eq(self.jobs_table),
                     w.table_len.eq(self.jobs_table_len)]

        # EMIT: ACT K/V rows → fragments (local, staged)
        wiring.connect(m, wiring.flipped(self.emit), e.rec)
        wiring.connect(m, e.local, wiring.flipped(self.local))
        wiring.connect(m, e.staged, wiring.flipped(self.staged_emit))
        m.d.comb += [self.emit_done.eq(e.done), e.cfg.eq(self.emit_cfg),
                     e.local_id.eq(self.local_id)]

        # ATTEND: lists → KV reader + attention engine → o/l or staged states (with the tiled
        # path: split by mode, PREFILL_TILE → TileUnit → TilePrefill → rows; _tiled)
        tiled = self.config.tiled
        if not tiled:
            wiring.connect(m, wiring.flipped(self.attend), a.rec)
        wiring.connect(m, a.job, eng["job"])
        wiring.connect(m, a.q, eng["q"])
        if not tiled:
            wiring.connect(m, a.blocks, r.blocks)
            wiring.connect(m, r.k, g.k)
            wiring.connect(m, r.v, g.v)
        wiring.connect(m, eng["o"], a.o)
        wiring.connect(m, a.staged, wiring.flipped(self.staged_attn))
        att_done, att_status = self._tiled(m) if tiled else (a.done, a.status)
        m.d.comb += [self.attend_done.eq(att_done), a.list_base.eq(self.att_list_base)]

        buses = {"walker": w.m_axi, "mat0": x.m_axi0, "mat1": x.m_axi1, "emit": e.bus,
                 "kvr": r.bus, **{b: getattr(x, f"m_axi_{b}") for b in WEIGHT_BUSES}}
        if not tiled:                   # else the shared DMA pair's, in _tiled
            buses.update(att_rd=a.rd_bus, att_wr=a.wr_bus)
        for name, bus in buses.items():
            wiring.connect(m, bus, wiring.flipped(getattr(self, f"m_axi_{name}")))

        m.d.comb += [self.jobs_status.eq(w.status), self.emit_status.eq(e.status),
                     self.att_status.eq(att_status), self.kvr_status.eq(r.status),
                     self.dma0_status.eq(x.dma0_status), self.dma1_status.eq(x.dma1_status),
                     self.gemm_status.eq(x.gemm_status), self.vector_status.eq(x.vec_status),
                     self.attn_status.eq(eng["status"]),
                     self.stripe_status.eq(x.stripe_status)]

        # busy cycles: a record is in progress from its transfer to its done strobe
        st = self.cmp_status
        flags = []
        for name, done in (("job", w.done), ("emit", e.done), ("attend", att_done)):
            rec = getattr(self, name)
            busy = Signal(name=f"{name}_busy")
            with m.If(rec.valid & rec.ready):
                m.d.sync += busy.eq(1)
            with m.Elif(done):
                m.d.sync += busy.eq(0)
            m.d.sync += st[f"{name}_cycles"].eq(st[f"{name}_cycles"] + busy)
            flags.append(busy)
        m.d.sync += st.busy_cycles.eq(st.busy_cycles + Cat(*flags).any())
        return m

    def _tiled(self, m: Module):
        """The ATTEND records split by mode between AttendUnit and TileUnit (→ TilePrefill),
        the KV reader and ``att_rd``/``att_wr`` steered by the record in work; returns the
        ``done`` strobe and the summed ``ATTEND_STATUS``."""
        a, r, g = self.attender, self.reader, self.engine
        m.submodules.split = s = self.split
        m.submodules.tiler = t = self.tiler
        m.submodules.prefill = p = self.prefill
        wiring.connect(m, wiring.flipped(self.attend), s.rec)
        wiring.connect(m, s.attend, a.rec)
        wiring.connect(m, s.tile, t.rec)
        for name in ("chunk", "q", "desc"):
            wiring.connect(m, getattr(t, name), getattr(p, name))
        # the normalised rows through a ready slice: the row writer's and the HP port's ready
        # no longer reach back through TileNormalize and TileMerge into P·V (docs/depth.md)
        m.submodules.rows_slice = rs = RegisterSlice(p.o.payload.shape(), forward=False)
        wiring.connect(m, p.o, rs.i)
        wiring.connect(m, rs.o, t.o)
        if self.config.tile_on_gemm:                 # S, P·V: the GEMM's share clients 1, 2
            x = self.matrix
            for n, part in ((1, "score"), (2, "pv")):
                wiring.connect(m, getattr(p, f"{part}_st"), getattr(x, f"c{n}_st"))
                wiring.connect(m, getattr(x, f"c{n}_res"), getattr(p, f"{part}_res"))
        m.d.comb += [s.attend_done.eq(a.done), s.tile_done.eq(t.done),
                     s.attend_status.eq(a.status), s.tile_status.eq(t.status),
                     t.list_base.eq(self.att_list_base)]
        steer(m, s.tiled, a.blocks, t.blocks, wiring.flipped(r.blocks))
        if g is None:                   # one chain: its inputs steered inside TilePrefill
            wiring.connect(m, r.k, p.k)
            wiring.connect(m, r.v, p.v)
            m.d.comb += p.sel.eq(s.tiled)
        else:
            steer(m, s.tiled, g.k, p.k, wiring.flipped(r.k))
            steer(m, s.tiled, g.v, p.v, wiring.flipped(r.v))
        # one DmaReader and one DmaWriter for both executors, steered by the record in work
        m.submodules.att_rd = rd = DmaReader(AXI_WIDTH, ADDR_BITS, fifo_depth=LUTRAM_FIFO_DEPTH,
                                             align=ATT_ALIGN)
        m.submodules.att_wr = wr = DmaWriter(AXI_WIDTH, ADDR_BITS, align=ATT_ALIGN)
        wiring.connect(m, rd.bus, wiring.flipped(self.m_axi_att_rd))
        wiring.connect(m, wr.bus, wiring.flipped(self.m_axi_att_wr))
        steer(m, s.tiled, a.rd_desc, t.rd_desc, wiring.flipped(rd.desc))
        steer(m, s.tiled, a.rd_data, t.rd_data, wiring.flipped(rd.o))
        steer(m, s.tiled, a.wr_desc, t.wr_desc, wiring.flipped(wr.desc))
        steer(m, s.tiled, a.wr_data, t.wr_data, wiring.flipped(wr.i))
        m.d.comb += [a.wr_done.eq(wr.desc_done & ~s.tiled), a.wr_err.eq(wr.desc_err),
                     t.wr_done.eq(wr.desc_done & s.tiled), t.wr_err.eq(wr.desc_err)]
        return s.done, s.status
