"""ATTEND executor of the node (docs/node.md §3, §5, §7; issue #11 §1.2–1.4): an ATTEND record →
its block list and query read from DDR → the attention engine's ``job``/``q`` streams and the KV
reader's block requests → the engine's output staged for SEND (decode) or written to DDR
(prefill). The record's ``softmax`` picks one online-softmax pass (SINGLE) or a phase of the
two-phase softmax (DECODE MAX / FIXED; PREFILL EXACT runs both phases itself). Formats:
:mod:`mcf.abi.attend`; golden model: :mod:`mcf.golden.attend_unit`.
"""

from __future__ import annotations

import math

from amaranth import Array, Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.attend import (
    ATT_ALIGN,
    ATTEND_ARG,
    ATTEND_BLOCK,
    ATTEND_HEADER,
    ATTEND_STATUS,
    ENGINE_MODE,
    SOFTMAX_OF_MODE,
    AttendMode,
    AttendSoftmax,
    max_payload_bytes,
)
from mcf.abi.compute import DMA_ADDR_BITS
from mcf.abi.framing import beat_layout
from mcf.abi.kv import AttnMode, attn_job_layout, q_beat_layout
from mcf.abi.kv_reader import KV_BLOCK_REQ
from mcf.abi.node import CMD
from mcf.abi.query import (
    QUERY_HEADER,
    QUERY_HEADER_BYTES,
    QUERY_SCALE,
    QUERY_SCALE_BYTES,
    query_bytes,
    query_head_bytes,
)
from mcf.abi.softmax import LANE_BITS, state_words

from ..mem.axi import ADDR_BITS, AXI4Signature
from ..mem.dma import LUTRAM_FIFO_DEPTH, dma_client_members, dma_views, off_align
from .attend_list import arg_check, list_states
from .fsm import dma_read

__all__ = ["AttendUnit"]


class AttendUnit(wiring.Component):
    """One ATTEND record at a time: list → query (→ DECODE FIXED's maxima) → job, query beats,
    block requests → outputs. PREFILL EXACT runs two jobs per record (a MAX pass, then a FIXED
    pass over the same query and blocks).

    Members
    -------
    rec : In(stream.Signature(CMD))
        ATTEND records from the COMPUTE sequencer (``arg`` = :data:`mcf.abi.attend.ATTEND_ARG`).
        Taken only when the unit is idle (the previous record is done).
    done : Out(1)
        One strobe per record, in order: DECODE when all its payloads are in the staging FIFO
        (``heads`` states; DECODE MAX's one maxima payload), PREFILL one cycle after the ``o/l``
        write's ``desc_done``, a bad record one cycle after it is found bad.
    list_base : In(DMA_ADDR_BITS)
        ``ATT_LIST_BASE`` (configuration register).
    job : Out(stream.Signature(attn_job_layout(max_heads)))
        To :class:`~mcf.hdl.compute.attention.AttentionEngine` ``job``: ``mode`` =
        :data:`mcf.abi.attend.ENGINE_MODE` of the record's ``softmax`` (EXACT: ``MAX``, then
        ``FIXED``), ``causal`` = PREFILL, ``normalize`` = PREFILL except in EXACT's MAX pass,
        ``heads``, ``n_blocks``, ``q_pos`` = the query's pos.
    q : Out(stream.Signature(q_beat_layout(lanes)))
        To the engine's ``q``: ``heads · head_dim/lanes`` beats from the query record (again for
        EXACT's second job); ``m_fix`` is the head's maximum in FIXED jobs (DECODE FIXED: read at
        ``out_addr``; EXACT: the MAX pass's output), 0 otherwise.
    blocks : Out(stream.Signature(KV_BLOCK_REQ))
        To :class:`~mcf.hdl.node.kv_reader.KvReader` ``blocks`` (the reader is outside the unit:
        it has its own AXI port): one request per list entry, ``last`` on the final one,
        ``k_only`` in MAX jobs, after the job and its query beats.
    o : In(stream.Signature(beat_layout(64)))
        The engine's ``o``.
    staged : Out(stream.Signature(beat_layout(64)))
        DECODE payloads (``last``-terminated: one state per head, or DECODE MAX's one payload
        of ``heads`` maxima) for the send unit's ``staged_attn``; a payload is offered only
        once all its beats are in the staging FIFO (docs/node.md §6 rule 3). The FIFO holds
        ``max_heads`` states.
    rd_bus : Out(AXI4Signature(addr_width, 128)) — the :class:`DmaReader` (list, query, maxima).
    wr_bus : Out(AXI4Signature(addr_width, 128)) — the :class:`DmaWriter` (PREFILL ``o/l``).
    rd_desc, rd_data, wr_desc, wr_data, wr_done, wr_err — instead of ``rd_bus`` / ``wr_bus``
        with ``own_dma = False``: the two DMA engines are outside, shared with TileUnit
        (:func:`~mcf.hdl.mem.dma.dma_client_members`; reader of ``LUTRAM_FIFO_DEPTH`` beats).
    status : Out(:data:`mcf.abi.attend.ATTEND_STATUS`) — ``blocks`` counts block requests
        (EXACT requests each block twice).
    busy : Out(1) — a record is in progress.

    Latency per record (no pauses): list read (AR + ``2 + blocks`` beats), query read, DECODE
    FIXED's maxima read (AR + ``⌈4·heads/16⌉`` beats), then the job, ``heads·head_dim/lanes``
    query beats and ``blocks`` requests at one per cycle; the engine then runs the blocks (the
    KV reader prefetches up to 4). PREFILL EXACT: the MAX job runs to its output (K rows
    only), then the FIXED job is issued like a SINGLE one. Records are not overlapped: the next
    record's list is read after ``done``. Bad input never hangs: bad records are counted and
    retired; no engine job is issued for them.
    """

    def __init__(self, head_dim: int = 128, lanes: int = 16, max_heads: int = 6,
                 max_block: int = 256, *, max_list: int = 64, addr_width: int = ADDR_BITS,
                 data_width: int = 128, out_width: int = 64, own_dma: bool = True):
        if data_width != 2 * out_width:
            raise ValueError("the o/l packer pairs two output beats per bus beat")
        self.head_dim, self.lanes, self.max_heads = head_dim, lanes, max_heads
        self.max_block, self.max_list = max_block, max_list
        self.addr_width, self.data_width, self.out_width = addr_width, data_width, out_width
        self.own_dma = own_dma
        bb = data_width // 8
        self.q_beats = -(-query_bytes(max_heads, head_dim) // bb)
        self.stage_depth = max_heads * -(-4 * state_words(head_dim) // (out_width // 8))
        super().__init__({
            "rec": In(stream.Signature(CMD)),
            "done": Out(1),
            "list_base": In(DMA_ADDR_BITS),
            "job": Out(stream.Signature(attn_job_layout(max_heads))),
            "q": Out(stream.Signature(q_beat_layout(lanes))),
            "blocks": Out(stream.Signature(KV_BLOCK_REQ)),
            "o": In(stream.Signature(beat_layout(out_width))),
            "staged": Out(stream.Signature(beat_layout(out_width))),
            **({"rd_bus": Out(AXI4Signature(addr_width, data_width)),
                "wr_bus": Out(AXI4Signature(addr_width, data_width))} if own_dma else
               dma_client_members(addr_width, data_width)),
            "status": Out(ATTEND_STATUS),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        D, L, G = self.head_dim, self.lanes, self.max_heads
        NB = D // L
        DW = self.data_width
        st = self.status

        dv = dma_views(m, self, self.own_dma, fifo_depth=LUTRAM_FIFO_DEPTH, align=ATT_ALIGN)
        # one spare entry: EXACT's MAX pass pushes each entry back as it pops it
        m.submodules.bfifo = bfifo = fifo.SyncFIFOBuffered(width=ATTEND_BLOCK.size,
                                                           depth=self.max_list + 1)
        olay = beat_layout(self.out_width)
        m.submodules.stage = stage = fifo.SyncFIFOBuffered(width=olay.size,
                                                           depth=self.stage_depth)

        arg = Signal(ATTEND_ARG)
        hdr = Signal(ATTEND_HEADER)
        prefill = Signal()
        bad = Signal()
        idx = Signal(range(max(self.max_list, self.q_beats) + 2))
        # the query record's beats, in a memory read asynchronously (LUT-RAM): a beat chunk is
        # a window of consecutive beats and a choice of its start on the record's byte grid
        BB = DW // 8
        NR = (8 * L + DW - 1) // DW + 1               # beats a chunk of 8·L bits may touch
        m.submodules.qmem = qmem = Memory(shape=unsigned(DW), depth=self.q_beats + NR - 1,
                                          init=[])
        q_wr = qmem.write_port()
        qhdr = Signal(QUERY_HEADER)                   # beat 0's header, kept as it lands
        done = Signal()
        m.d.sync += self.done.eq(done)

        # ---- the job's engine mode and the maxima of FIXED jobs -------------------------------
        emode = Signal(AttnMode)     # EXACT: MAX in the first pass, FIXED in the second
        is_max = Signal()
        capture = Signal()           # EXACT's MAX pass: the output is the maxima, kept here
        writes = Signal()            # the job's output is the o/l row written at out_addr
        m.d.comb += [is_max.eq(emode == AttnMode.MAX), capture.eq(prefill & is_max),
                     writes.eq(prefill & ~is_max)]
        mx = Signal(LANE_BITS * G)   # per-head maxima (m_fix), 0 unless FIXED / EXACT
        mx_ok = Signal()             # DECODE FIXED: read; EXACT: the MAX pass's output captured
        mx_words = Array(mx[LANE_BITS * h:][:LANE_BITS] for h in range(G))

        def store_words(word0, payload, width):
            """``mx`` words ``word0 ..`` from ``payload`` (``width`` bits, word 0 lowest)."""
            lo = LANE_BITS * word0
            n = min(width, LANE_BITS * G - lo)
            return mx[lo:lo + n].eq(payload[:n]) if n > 0 else []

        # ---- query beat extraction: head h, chunk c of the pack_query record ---------------
        P = query_head_bytes(D)
        h_cnt = Signal(range(G + 1))
        c_cnt = Signal(range(NB))
        GB = math.gcd(QUERY_HEADER_BYTES, QUERY_SCALE.size // 8, P, L, BB)   # the fields' grid

        def window(start, n_beats, width):
            """``width`` bits of the record from byte ``start`` (a multiple of GB)."""
            ports = [qmem.read_port(domain="comb") for _ in range(n_beats)]
            for r, port in enumerate(ports):
                m.d.comb += port.addr.eq(start // BB + r)
            beats = Cat(*(port.data for port in ports))
            return Array(beats[8 * GB * k:][:width] for k in range(BB // GB))[
                (start % BB) // GB]

        q_at = Signal(range(QUERY_HEADER_BYTES + G * P + 1))    # head h_cnt's bytes
        m.d.comb += q_at.eq(QUERY_HEADER_BYTES + h_cnt * P)
        # the heads' scale words, kept in registers as their beats land (a word never straddles
        # a beat): no LUT-RAM read port of their own
        scales = Array(Signal(QUERY_SCALE.size, name=f"qscale{h}") for h in range(G))
        scale_at = [divmod(QUERY_HEADER_BYTES + h * P, BB) for h in range(G)]
        if any(off + QUERY_SCALE_BYTES > BB for _, off in scale_at):
            raise ValueError(f"a query head's scale word straddles a {BB}-byte beat")
        sc = data.View(QUERY_SCALE, scales[h_cnt])
        qp = self.q.payload
        m.d.comb += [qp.data.eq(window(q_at + QUERY_SCALE_BYTES + c_cnt * L, NR, 8 * L)),
                     qp.scale_m.eq(sc.m),
                     qp.scale_e.eq(sc.e), qp.m_fix.eq(mx_words[h_cnt])]

        jp = self.job.payload
        m.d.comb += [jp.mode.eq(emode), jp.normalize.eq(writes), jp.causal.eq(prefill),
                     jp.heads.eq(arg.heads), jp.n_blocks.eq(arg.blocks), jp.q_pos.eq(qhdr.pos)]

        ent = data.View(ATTEND_BLOCK, bfifo.r_data)
        bp = self.blocks.payload
        m.d.comb += [bp.addr.eq(ent.addr), bp.tokens.eq(ent.tokens), bp.pos0.eq(ent.pos0),
                     bp.last.eq(idx == arg.blocks - 1), bp.k_only.eq(is_max)]

        # ---- outputs: decode → staging FIFO (whole packets), prefill → 64→128 packer → writer,
        # EXACT's MAX pass → mx
        pkts = Signal(range(self.stage_depth + 1))
        rec_pkts = Signal(range(G + 1))
        op = self.o.payload
        push_last = Signal()
        pop_last = Signal()
        m.d.comb += [stage.w_data.eq(op.as_value()),
                     push_last.eq(stage.w_en & stage.w_rdy & op.last),
                     pop_last.eq(self.staged.valid & self.staged.ready
                                 & self.staged.payload.last)]
        m.d.sync += pkts.eq(pkts + push_last - pop_last)
        m.d.comb += [self.staged.payload.eq(stage.r_data),
                     self.staged.valid.eq(stage.r_rdy & (pkts != 0)),
                     stage.r_en.eq(self.staged.ready & (pkts != 0))]
        wbuf = Signal(DW)
        wval = Signal()
        half = Signal()
        OW = self.out_width // LANE_BITS
        cap = Signal(range(-(-G // OW) + 1))
        m.d.comb += [dv.wr_data.payload.eq(wbuf), dv.wr_data.valid.eq(wval)]
        with m.If(dv.wr_data.ready):
            m.d.sync += wval.eq(0)
        with m.If(capture):
            m.d.comb += self.o.ready.eq(1)
            with m.If(self.o.valid):
                m.d.sync += cap.eq(cap + 1)
                for j in range(-(-G // OW)):
                    with m.If(cap == j):
                        m.d.sync += store_words(OW * j, op.data, self.out_width)
                with m.If(op.last):
                    m.d.sync += [mx_ok.eq(1), cap.eq(0)]
        with m.Elif(prefill):
            m.d.comb += self.o.ready.eq(~wval)
            with m.If(self.o.valid & ~wval):
                with m.If(half):
                    m.d.sync += [wbuf[self.out_width:].eq(op.data), wval.eq(1), half.eq(0)]
                with m.Else():
                    m.d.sync += [wbuf[:self.out_width].eq(op.data), wval.eq(op.last),
                                 half.eq(~op.last)]
        with m.Else():
            m.d.comb += [self.o.ready.eq(stage.w_rdy), stage.w_en.eq(self.o.valid)]
            with m.If(push_last):
                m.d.sync += rec_pkts.eq(rec_pkts + 1)

        # ---- record sequencing -------------------------------------------------------------
        rin = data.View(ATTEND_ARG, self.rec.payload.arg)
        sm_ok = Signal()             # the (mode, softmax) pair is one SOFTMAX_OF_MODE defines
        m.d.comb += sm_ok.eq(0)
        for mode, settings in SOFTMAX_OF_MODE.items():
            for s in settings:
                with m.If((rin.mode == mode) & (rin.softmax == s)):
                    m.d.comb += sm_ok.eq(1)
        wr_d = dv.wr_desc.payload
        m.d.comb += [wr_d.stride.eq(0), wr_d.count.eq(1),
                     wr_d.addr.eq(hdr.out_addr), wr_d.length.eq(arg.heads * (4 * D))]
        beat = dv.rd_data.payload

        def entry(bent):
            m.d.comb += [bfifo.w_en.eq(1), bfifo.w_data.eq(beat.data)]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.rec.ready.eq(1)
                with m.If(self.rec.valid):
                    m.d.sync += [arg.eq(rin), prefill.eq(rin.mode == AttendMode.PREFILL),
                                 bad.eq(0), idx.eq(0), rec_pkts.eq(0), half.eq(0),
                                 mx.eq(0), mx_ok.eq(0), cap.eq(0)]
                    with m.Switch(rin.softmax):
                        for s, mode in ENGINE_MODE.items():
                            with m.Case(s):
                                m.d.sync += emode.eq(mode)
                        with m.Case(AttendSoftmax.EXACT):
                            m.d.sync += emode.eq(ENGINE_MODE[AttendSoftmax.MAX])
                    arg_check(m, rin, rin.mode > AttendMode.PREFILL.value, sm_ok, G, self.max_list,
                              status=st, done=done)
            list_states(m, dv.rd_desc, dv.rd_data, list_base=self.list_base, arg=arg, hdr=hdr,
                        idx=idx, bad=bad, max_block=self.max_block, entry=entry, nxt="Q_REQ")
            with m.State("Q_REQ"):
                # an address off ATT_ALIGN: a bad list, found before any transfer at it
                uses_out = prefill | (arg.softmax == AttendSoftmax.FIXED)
                with m.If(off_align(hdr.q_addr, ATT_ALIGN)
                          | (uses_out & off_align(hdr.out_addr, ATT_ALIGN))):
                    m.d.sync += bad.eq(1)
                    m.next = "CHECK"
                with m.Else():
                    dma_read(m, dv.rd_desc, hdr.q_addr, QUERY_HEADER_BYTES + arg.heads * P,
                             "Q_RX")
            with m.State("Q_RX"):
                m.d.comb += dv.rd_data.ready.eq(1)
                m.d.comb += [q_wr.addr.eq(idx), q_wr.data.eq(beat.data)]
                with m.If(dv.rd_data.valid):
                    m.d.sync += idx.eq(idx + 1)
                    m.d.comb += q_wr.en.eq(idx < self.q_beats)
                    with m.If(idx == 0):
                        m.d.sync += qhdr.eq(beat.data[:QUERY_HEADER.size])
                    for h, (at, off) in enumerate(scale_at):
                        with m.If(idx == at):
                            m.d.sync += scales[h].eq(beat.data[8 * off:][:QUERY_SCALE.size])
                    with m.If(beat.err):
                        m.d.sync += bad.eq(1)
                    with m.If(beat.last):
                        m.d.sync += idx.eq(0)
                        m.next = "CHECK"
            with m.State("CHECK"):
                with m.If(bad | (qhdr.heads != arg.heads)):
                    m.next = "DRAIN"
                with m.Elif((arg.softmax == AttendSoftmax.FIXED) & ~mx_ok):
                    m.next = "M_REQ"
                with m.Else():
                    m.next = "JOB"
            with m.State("M_REQ"):
                # DECODE FIXED: the heads' maxima at out_addr
                dma_read(m, dv.rd_desc, hdr.out_addr, max_payload_bytes(arg.heads), "M_RX")
            with m.State("M_RX"):
                m.d.comb += dv.rd_data.ready.eq(1)
                with m.If(dv.rd_data.valid):
                    m.d.sync += idx.eq(idx + 1)
                    for j in range(-(-G * LANE_BITS // DW)):
                        with m.If(idx == j):
                            m.d.sync += store_words(DW // LANE_BITS * j, beat.data, DW)
                    with m.If(beat.err):
                        m.d.sync += bad.eq(1)
                    with m.If(beat.last):
                        m.d.sync += [idx.eq(0), mx_ok.eq(1)]
                        m.next = "CHECK"
            with m.State("DRAIN"):
                m.d.comb += bfifo.r_en.eq(1)
                with m.If(~bfifo.r_rdy):
                    m.d.sync += st.bad_list.eq(st.bad_list + 1)
                    m.d.comb += done.eq(1)
                    m.next = "IDLE"
            with m.State("JOB"):
                m.d.comb += self.job.valid.eq(1)
                with m.If(self.job.ready):
                    m.d.sync += [h_cnt.eq(0), c_cnt.eq(0)]
                    m.next = "W_DESC"
            with m.State("W_DESC"):
                m.d.comb += dv.wr_desc.valid.eq(writes)
                with m.If(~writes | dv.wr_desc.ready):
                    m.next = "Q_OUT"
            with m.State("Q_OUT"):
                m.d.comb += self.q.valid.eq(1)
                with m.If(self.q.ready):
                    m.d.sync += c_cnt.eq(Mux(c_cnt == NB - 1, 0, c_cnt + 1))
                    with m.If(c_cnt == NB - 1):
                        m.d.sync += h_cnt.eq(h_cnt + 1)
                        with m.If(h_cnt == arg.heads - 1):
                            m.next = "BLOCKS"
            with m.State("BLOCKS"):
                m.d.comb += [self.blocks.valid.eq(bfifo.r_rdy), bfifo.r_en.eq(self.blocks.ready)]
                with m.If(self.blocks.valid & self.blocks.ready):
                    m.d.sync += [idx.eq(idx + 1), st.blocks.eq(st.blocks + 1)]
                    # EXACT's MAX pass keeps the list for the FIXED pass
                    m.d.comb += [bfifo.w_en.eq(capture), bfifo.w_data.eq(bfifo.r_data)]
                    with m.If(idx == arg.blocks - 1):
                        m.next = "OUT"
            with m.State("OUT"):
                with m.If(capture), m.If(mx_ok):
                    m.d.sync += [emode.eq(ENGINE_MODE[AttendSoftmax.FIXED]), idx.eq(0)]
                    m.next = "JOB"
                with m.Elif(prefill), m.If(dv.wr_done):
                    m.d.sync += [st.records.eq(st.records + 1),
                                 st.write_errors.eq(st.write_errors + dv.wr_err)]
                    m.d.comb += done.eq(1)
                    m.next = "IDLE"
                with m.Elif(rec_pkts == Mux(is_max, 1, arg.heads)):
                    m.d.sync += st.records.eq(st.records + 1)
                    m.d.comb += done.eq(1)
                    m.next = "IDLE"
        m.d.comb += self.busy.eq(~self.rec.ready)
        return m
