"""ATTEND PREFILL_TILE executor of the node (issue #33; docs/node.md §3 "ATTEND PREFILL_TILE",
§5, §7): one PREFILL_TILE record → its block list and the chunk's query slots read from DDR →
:class:`~mcf.hdl.compute.tile_prefill.TilePrefill`'s ``chunk``, ``q`` and ``desc`` streams and
the KV reader's block requests, one per (query tile, block) pair → the normalised rows written
to DDR. Formats: :mod:`mcf.abi.attend`; golden model: :func:`mcf.golden.attend_unit.attend_model`
(``max_chunk`` > 0, PER_TOKEN K).
"""

from __future__ import annotations

from amaranth import Array, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.attend import (
    ATT_ALIGN,
    ATTEND_ARG,
    ATTEND_HEADER,
    ATTEND_STATUS,
    ATTEND_STRIDE_BITS,
    ATTEND_TILE_ROWS,
    SOFTMAX_OF_MODE,
    AttendMode,
)
from mcf.abi.attn_tile import block_desc_layout, chunk_layout, norm_beat_layout, query_row_layout
from mcf.abi.compute import DMA_ADDR_BITS
from mcf.abi.kv import ATTN_OUT, KV_POS_BITS
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

from ..mem.axi import ADDR_BITS, AXI4Signature
from ..mem.dma import LUTRAM_FIFO_DEPTH, dma_client_members, dma_views, off_align
from .attend_list import arg_check, list_states
from .fsm import dma_read, offer

__all__ = ["TileUnit", "TileRowWriter"]


class TileRowWriter(wiring.Component):
    """The normalised rows of a chunk → DDR, each query head's part at its offset: chunk row
    ``x`` (token ``t = x // heads``, head ``h = x % heads``) is one write of ``head_dim``
    ATTN_OUT words at ``out_addr + t · out_stride + h · head_dim · 4`` — the bytes of
    :func:`mcf.abi.attend.prefill_tile_out_address`'s row ``t``. ``x // heads`` is a multiply by
    a per-``heads`` reciprocal (exact below ``max_rows``, checked when built).

    Members
    -------
    o : In(stream.Signature(norm_beat_layout(data_width // 32, max_rows)))
        TilePrefill's ``o`` (built with ``merge_lanes = data_width / 32``): a row's
        ``32·head_dim/data_width`` beats, each one bus beat of the row's write.
    out_addr, out_stride, heads : In
        The record's; stable while its rows arrive.
    wr_bus : Out(AXI4Signature(addr_width, data_width)) — a DmaWriter's (AW/W/B only).
    wr_desc, wr_data, wr_done, wr_err — instead of ``wr_bus`` with ``own_dma = False``: the
        DmaWriter is outside (:func:`~mcf.hdl.mem.dma.dma_client_members`).
    row_done, row_err : Out(1)
        The DmaWriter's ``desc_done`` / ``desc_err``: one strobe per row written (B received).

    A row's first beat waits until the row's descriptor (from that beat's ``row``) is
    presented, the cycle after the beat is valid (the DmaWriter's AW two cycles later); then
    the beats pass straight into the DmaWriter as it takes them — no row is held here.
    """

    def __init__(self, head_dim: int, max_heads: int, max_rows: int, *,
                 addr_width: int = ADDR_BITS, data_width: int = 128, own_dma: bool = True):
        if data_width % ATTN_OUT.width or (head_dim * ATTN_OUT.width) % data_width:
            raise ValueError("a row must be whole bus beats of whole ATTN_OUT words")
        self.head_dim, self.max_heads, self.max_rows = head_dim, max_heads, max_rows
        self.addr_width, self.data_width, self.own_dma = addr_width, data_width, own_dma
        self.k = 2 * max(max_rows, 2).bit_length()
        self.recip = [0] + [-(-(1 << self.k) // h) for h in range(1, max_heads + 1)]
        for h in range(1, max_heads + 1):
            if any((x * self.recip[h]) >> self.k != x // h for x in range(max_rows)):
                raise AssertionError("reciprocal not exact")  # pragma: no cover
        super().__init__({
            "o": In(stream.Signature(norm_beat_layout(data_width // ATTN_OUT.width, max_rows))),
            "out_addr": In(DMA_ADDR_BITS), "out_stride": In(ATTEND_STRIDE_BITS),
            "heads": In(range(max_heads + 1)),
            **({"wr_bus": Out(AXI4Signature(addr_width, data_width))} if own_dma else
               {n: v for n, v in dma_client_members(addr_width, data_width).items()
                if n.startswith("wr_")}),
            "row_done": Out(1), "row_err": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        D = self.head_dim
        RB = D * ATTN_OUT.width
        dv = dma_views(m, self, self.own_dma, reader=False, align=ATT_ALIGN)
        m.d.comb += [self.row_done.eq(dv.wr_done), self.row_err.eq(dv.wr_err)]
        x = self.o.payload.row
        tok = Signal(range(self.max_rows))
        recip = Array(self.recip)
        m.d.comb += tok.eq((x * recip[self.heads]) >> self.k)
        addr = Signal(DMA_ADDR_BITS)
        # opened: the row of the beats arriving has its descriptor (presented or taken)
        opened, dpend = Signal(), Signal()
        o = self.o
        with m.If(o.valid & ~opened):
            m.d.sync += [opened.eq(1), dpend.eq(1),
                         addr.eq(self.out_addr + tok * self.out_stride
                                 + (x - tok * self.heads) * (RB // 8))]
        wd = dv.wr_desc.payload
        m.d.comb += [dv.wr_desc.valid.eq(dpend), wd.addr.eq(addr), wd.length.eq(RB // 8),
                     wd.stride.eq(0), wd.count.eq(1)]
        with m.If(dv.wr_desc.valid & dv.wr_desc.ready):
            m.d.sync += dpend.eq(0)
        # the DmaWriter takes a row's beats only after its descriptor
        m.d.comb += [dv.wr_data.valid.eq(o.valid & opened),
                     dv.wr_data.payload.eq(o.payload.o.as_value()),
                     o.ready.eq(opened & dv.wr_data.ready)]
        with m.If(o.valid & o.ready & o.payload.last):
            m.d.sync += opened.eq(0)
        return m


class TileUnit(wiring.Component):
    """One PREFILL_TILE record at a time: list → the chunk's query slots (checked, then read
    again: per token its heads as rows of ``4 + head_dim`` bytes, one head's beats held) →
    TilePrefill's chunk and rows, and beside the rows (TileQuery holds two query
    tiles: a tile's rows wait for the tile two before) per query tile the blocks' descriptors
    and, in the same order, the KV reader's block requests → the rows written
    (:class:`TileRowWriter`).

    Members
    -------
    rec : In(stream.Signature(CMD))
        ATTEND records (``arg`` = :data:`~mcf.abi.attend.ATTEND_ARG`), taken while idle.
        Anything but PREFILL_TILE with a softmax :data:`~mcf.abi.attend.SOFTMAX_OF_MODE` allows,
        ``heads`` in 1..``max_heads`` and ``blocks`` in 1..``max_list`` is a bad record.
    done : Out(1)
        One strobe per record: one cycle after the last row's B response (``tokens · heads``
        rows), a bad record or list one cycle after it is found bad.
    list_base : In(DMA_ADDR_BITS) — ``ATT_LIST_BASE``.
    chunk, q, desc : Out — to :class:`~mcf.hdl.compute.tile_prefill.TilePrefill` (built with
        ``rows``, ``max_rows = max_chunk · max_heads``, ``max_heads``, ``max_block`` of this
        unit): the chunk (slot 0's ``pos``, ``tokens · heads`` rows, ``heads``), its rows
        (token ``i`` head ``h``: slot ``i``'s head ``h``), then per query tile of ``rows`` rows
        the list's blocks in order up to the last one the tile does not lie wholly before
        (``last`` on it).
    blocks : Out(stream.Signature(KV_BLOCK_REQ))
        To :class:`~mcf.hdl.node.kv_reader.KvReader` (its own AXI read port; its ``k``/``v``
        go to TilePrefill's): one request per descriptor, presented with it, ``last`` on the
        record's final one; counted in ``att_blocks``.
    o : In — TilePrefill's ``o`` (:class:`TileRowWriter`'s).
    rd_bus, wr_bus : Out(AXI4Signature(addr_width, data_width)) — list and slots; rows.
    rd_desc, rd_data, wr_desc, wr_data, wr_done, wr_err — instead of ``rd_bus`` / ``wr_bus``
        with ``own_dma = False``: the DmaReader (of ``LUTRAM_FIFO_DEPTH`` beats) and the
        DmaWriter are outside, shared with AttendUnit
        (:func:`~mcf.hdl.mem.dma.dma_client_members`).
    status : Out(ATTEND_STATUS); busy : Out(1).

    Checks as the golden model (bad record; bad list: a list read error, a block's ``tokens``
    outside 1..``max_block``, ``tokens`` outside 1..``max_chunk``, ``out_stride`` below one
    row, a slot's read error, ``heads`` or non-consecutive ``pos``), before anything reaches
    TilePrefill, and a chunk whose first token precedes the first block's ``pos0`` (rows that
    see no key, which TilePrefill never emits) is a bad list. The blocks must be in increasing
    positions (TilePrefill's rule, not checked). A read error on the second read of
    the slots (after the check) cannot stop the chunk: its rows are written and the record is
    counted in ``bad_list``, not ``records``. ``write_errors`` counts records with a row
    answered with an error (the record still retires). Rows are written per query head, not
    gathered per token: a token's heads may finish in two query tiles, and TilePrefill emits a
    tile's rows in the order they finish, so a gather would need a buffer of a tile's rows;
    per-head writes are ``head_dim · 4``-byte bursts and need none.

    In the node (:class:`~mcf.hdl.node.compute.NodeCompute` of a configuration with the tiled
    path, ``NodeConfig.tiled``): the ATTEND records are split by ``arg.mode``
    (:class:`~mcf.hdl.node.attend_split.AttendSplit`: PREFILL_TILE here, the others to
    AttendUnit, one record at a time; together they are ``attend_model(...,
    max_chunk=max_chunk)``), the two ``done`` strobes OR'd and their ``ATTEND_STATUS``
    counters summed into ``att_*``; built with ``own_dma = False``, its DMA streams are served by
    the node's one DmaReader and DmaWriter of ``att_rd`` / ``att_wr`` while a PREFILL_TILE
    record is in work, and the node's one
    :class:`~mcf.hdl.node.kv_reader.KvReader` (``lanes`` = ``attn_lanes`` = TilePrefill's
    ``in_lanes``, PER_TOKEN records only) takes this unit's block requests and feeds
    TilePrefill's ``k``/``v`` (:func:`~mcf.hdl.node.attend_split.steer`).

    Latency: the list, the slots' check pass, then the rows' pass beside the descriptors and
    the chain's; records are not overlapped (the next record is taken after ``done``).
    """

    def __init__(self, head_dim: int = 128, max_heads: int = 6, max_block: int = 256, *,
                 max_list: int = 64, max_chunk: int = 256, rows: int = ATTEND_TILE_ROWS,
                 addr_width: int = ADDR_BITS, data_width: int = 128, own_dma: bool = True):
        self.head_dim, self.max_heads, self.max_block = head_dim, max_heads, max_block
        self.max_list, self.max_chunk, self.rows = max_list, max_chunk, rows
        self.max_rows = max_chunk * max_heads
        self.addr_width, self.data_width, self.own_dma = addr_width, data_width, own_dma
        self.q_beats = -(-query_bytes(max_heads, head_dim) // (data_width // 8))
        super().__init__({
            "rec": In(stream.Signature(CMD)), "done": Out(1),
            "list_base": In(DMA_ADDR_BITS),
            "chunk": Out(stream.Signature(chunk_layout(self.max_rows, max_heads))),
            "q": Out(stream.Signature(query_row_layout(head_dim))),
            "desc": Out(stream.Signature(block_desc_layout(max_block))),
            "blocks": Out(stream.Signature(KV_BLOCK_REQ)),
            "o": In(stream.Signature(norm_beat_layout(data_width // ATTN_OUT.width,
                                                      self.max_rows))),
            **({"rd_bus": Out(AXI4Signature(addr_width, data_width)),
                "wr_bus": Out(AXI4Signature(addr_width, data_width))} if own_dma else
               dma_client_members(addr_width, data_width)),
            "status": Out(ATTEND_STATUS), "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        D, G, DW, QT = self.head_dim, self.max_heads, self.data_width, self.rows
        BB = DW // 8
        st = self.status
        dv = dma_views(m, self, self.own_dma, fifo_depth=LUTRAM_FIFO_DEPTH, writer=False,
                       align=ATT_ALIGN)
        m.submodules.wr = wr = TileRowWriter(D, G, self.max_rows, addr_width=self.addr_width,
                                             data_width=DW, own_dma=self.own_dma)
        if self.own_dma:
            wiring.connect(m, wr.wr_bus, wiring.flipped(self.wr_bus))
        else:                                   # the row writer's client ports, passed out
            wiring.connect(m, wr.wr_desc, wiring.flipped(self.wr_desc))
            wiring.connect(m, wr.wr_data, wiring.flipped(self.wr_data))
            m.d.comb += [wr.wr_done.eq(self.wr_done), wr.wr_err.eq(self.wr_err)]
        wiring.connect(m, wiring.flipped(self.o), wr.o)

        arg, hdr = Signal(ATTEND_ARG), Signal(ATTEND_HEADER)
        m.d.comb += [wr.out_addr.eq(hdr.out_addr), wr.out_stride.eq(hdr.out_stride),
                     wr.heads.eq(arg.heads)]
        elay = data.StructLayout({"addr": DMA_ADDR_BITS, "tokens": range(self.max_block + 1),
                                  "pos0": KV_POS_BITS})
        m.submodules.ents = ents = Memory(shape=elay, depth=self.max_list, init=[])
        ew = ents.write_port()
        er0, er1 = ents.read_port(domain="comb"), ents.read_port(domain="comb")
        bad, qerr, werr = Signal(), Signal(), Signal()
        done = Signal()
        m.d.sync += self.done.eq(done)
        idx = Signal(range(max(self.max_list, self.max_chunk) + 2))
        nrows = Signal(range(self.max_rows + 1))
        m.d.comb += nrows.eq(hdr.tokens * arg.heads)
        pos0, first_key = Signal(KV_POS_BITS), Signal(KV_POS_BITS)

        # ---- the query slots: bytes, beats, the row extraction -------------------------------
        P = query_head_bytes(D)
        HB = -(-P // BB)                           # beats of a head's row
        qlen = Signal(range(query_bytes(G, D) + 1))
        slot = Signal(range(query_bytes(G, D) + BB))
        qbeats = Signal(range(self.q_beats + 1))
        m.d.comb += [qlen.eq(QUERY_HEADER_BYTES + arg.heads * P),
                     slot.eq((qlen + BB - 1) & ~(BB - 1)), qbeats.eq((qlen + BB - 1) // BB)]
        bi = Signal(range(max(self.q_beats, HB) + 1))
        h = Signal(range(G + 1))
        # the rows' pass reads a token's heads as rows of P bytes (the DmaReader delivers each
        # from lane 0): a head's beats fill hbuf, its scale and codes at fixed bits
        hbuf = Signal(DW * HB)
        qa = Signal(DMA_ADDR_BITS)                 # the next slot's first head
        sc = data.View(QUERY_SCALE, hbuf[:QUERY_SCALE.size])
        m.d.comb += [self.q.payload.q.eq(hbuf[8 * QUERY_SCALE_BYTES:][:8 * D]),
                     self.q.payload.scale_m.eq(sc.m),
                     self.q.payload.scale_e.eq(sc.e)]
        m.d.comb += [self.chunk.payload.pos.eq(pos0), self.chunk.payload.rows.eq(nrows),
                     self.chunk.payload.heads.eq(arg.heads)]

        # ---- the (query tile, block) pairs ---------------------------------------------------
        lo = Signal(range(self.max_rows + QT + 1))
        tend = Signal(range(self.max_rows + QT + 1))    # the tile's last row
        m.d.comb += tend.eq(Mux(lo + QT < nrows, lo + QT, nrows) - 1)
        b = Signal(range(self.max_list + 1))
        m.d.comb += [er0.addr.eq(b), er1.addr.eq(b + 1)]

        def met(e):
            """The tile does not lie wholly before block entry ``e``."""
            return (e.pos0 <= pos0) | ((e.pos0 - pos0) * arg.heads <= tend)

        tlast, rlast = Signal(), Signal()
        m.d.comb += [tlast.eq((b == arg.blocks - 1) | ~met(er1.data)),
                     rlast.eq(tlast & (lo + QT >= nrows))]
        dp, bp = self.desc.payload, self.blocks.payload
        m.d.comb += [dp.pos0.eq(er0.data.pos0), dp.n.eq(er0.data.tokens), dp.last.eq(tlast),
                     bp.addr.eq(er0.data.addr), bp.tokens.eq(er0.data.tokens),
                     bp.pos0.eq(er0.data.pos0), bp.last.eq(rlast), bp.k_only.eq(0)]
        dsent, bsent = Signal(), Signal()
        # the (query tile, block) pairs are being sent, beside the rows: TileQuery holds two
        # query tiles, so a tile's rows wait for the descriptors of the tile two before
        pairs = Signal()
        acked = Signal(range(self.max_rows + 1))
        with m.If(wr.row_done):
            m.d.sync += [acked.eq(acked + 1), werr.eq(werr | wr.row_err)]

        # ---- record sequencing -------------------------------------------------------------
        rin = data.View(ATTEND_ARG, self.rec.payload.arg)
        sm_ok = Signal()
        for s in SOFTMAX_OF_MODE[AttendMode.PREFILL_TILE]:
            with m.If(rin.softmax == s):
                m.d.comb += sm_ok.eq(1)
        beat = dv.rd_data.payload
        qh = data.View(QUERY_HEADER, beat.data[:QUERY_HEADER.size])

        def entry(bent):
            m.d.comb += [ew.addr.eq(idx - 1), ew.en.eq(1), ew.data.addr.eq(bent.addr),
                         ew.data.tokens.eq(bent.tokens), ew.data.pos0.eq(bent.pos0)]
            with m.If(idx == 1):
                m.d.sync += first_key.eq(bent.pos0)

        def check_pass():
            """States QH_REQ and QH_RX: one pass over the chunk's query slots, checked."""
            with m.State("QH_REQ"):
                dma_read(m, dv.rd_desc, hdr.q_addr, qlen, "QH_RX", count=hdr.tokens, stride=slot)
            with m.State("QH_RX"):
                m.d.comb += dv.rd_data.ready.eq(1)
                with m.If(dv.rd_data.valid):
                    m.d.sync += bi.eq(Mux(bi == qbeats - 1, 0, bi + 1))
                    with m.If(beat.err):
                        m.d.sync += bad.eq(1)
                    with m.If(bi == 0):
                        with m.If((qh.heads != arg.heads)
                                  | ((idx != 0) & (qh.pos != (pos0 + idx)[:KV_POS_BITS]))):
                            m.d.sync += bad.eq(1)
                        with m.If(idx == 0):
                            m.d.sync += pos0.eq(qh.pos)
                    with m.If(bi == qbeats - 1):
                        m.d.sync += idx.eq(idx + 1)
                        with m.If(beat.last):
                            m.next = "CHECK"

        def rows_pass():
            """States Q_REQ, Q_RX, Q_OUT: per token its heads read as ``heads`` rows of ``P``
            bytes (``P`` apart, after the slot's header), each head's row out on ``q``."""
            with m.State("Q_REQ"):
                dma_read(m, dv.rd_desc, qa, P, "Q_RX", count=arg.heads, stride=P)
                with m.If(dv.rd_desc.ready):
                    m.d.sync += [qa.eq(qa + slot), h.eq(0)]
            with m.State("Q_RX"):
                m.d.comb += dv.rd_data.ready.eq(1)
                with m.If(dv.rd_data.valid):
                    m.d.sync += bi.eq(Mux(bi == HB - 1, 0, bi + 1))
                    with m.If(beat.err):
                        m.d.sync += [bad.eq(1), qerr.eq(1)]
                    for i in range(HB):
                        with m.If(bi == i):
                            m.d.sync += hbuf[DW * i:DW * (i + 1)].eq(beat.data)
                    with m.If(bi == HB - 1):
                        m.next = "Q_OUT"
            with m.State("Q_OUT"):
                m.d.comb += self.q.valid.eq(1)
                with m.If(self.q.ready):
                    m.d.sync += h.eq(h + 1)
                    m.next = "Q_RX"
                    with m.If(h == arg.heads - 1):
                        m.d.sync += idx.eq(idx + 1)
                        m.next = "Q_REQ"
                        with m.If(idx == hdr.tokens - 1):
                            m.next = "ROWS"

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.rec.ready.eq(1)
                with m.If(self.rec.valid):
                    m.d.sync += [arg.eq(rin), bad.eq(0), qerr.eq(0), werr.eq(0), idx.eq(0),
                                 bi.eq(0), lo.eq(0), b.eq(0), acked.eq(0), pairs.eq(0)]
                    arg_check(m, rin, rin.mode != AttendMode.PREFILL_TILE, sm_ok, G, self.max_list,
                              status=st, done=done)
            list_states(m, dv.rd_desc, dv.rd_data, list_base=self.list_base, arg=arg, hdr=hdr,
                        idx=idx, bad=bad, max_block=self.max_block, entry=entry, nxt="HDR")
            with m.State("HDR"):
                with m.If(bad | (hdr.tokens == 0) | (hdr.tokens > self.max_chunk)
                          | (hdr.out_stride < arg.heads * (D * ATTN_OUT.width // 8))
                          | off_align(hdr.q_addr, ATT_ALIGN) | off_align(hdr.out_addr, ATT_ALIGN)
                          | off_align(hdr.out_stride, ATT_ALIGN)):
                    m.next = "BAD"
                with m.Else():
                    m.next = "QH_REQ"
            check_pass()
            with m.State("CHECK"):
                m.d.sync += idx.eq(0)
                with m.If(bad | (pos0 < first_key)):
                    m.next = "BAD"
                with m.Else():
                    m.next = "CHUNK"
            with m.State("BAD"):
                m.d.sync += st.bad_list.eq(st.bad_list + 1)
                m.d.comb += done.eq(1)
                m.next = "IDLE"
            with m.State("CHUNK"):
                offer(m, self.chunk, "Q_REQ")
                with m.If(self.chunk.ready):
                    m.d.sync += [pairs.eq(1), qa.eq(hdr.q_addr + QUERY_HEADER_BYTES)]
            rows_pass()
            with m.State("ROWS"), m.If(~pairs & (acked == nrows)):
                m.d.sync += [st.records.eq(st.records + ~qerr),
                             st.bad_list.eq(st.bad_list + qerr),
                             st.write_errors.eq(st.write_errors + werr)]
                m.d.comb += done.eq(1)
                m.next = "IDLE"
        # ---- the pairs, beside the rows ------------------------------------------------------
        with m.If(pairs):
            m.d.comb += [self.desc.valid.eq(~dsent), self.blocks.valid.eq(~bsent)]
            d_ok = dsent | self.desc.ready
            b_ok = bsent | self.blocks.ready
            with m.If(self.desc.ready):
                m.d.sync += dsent.eq(1)
            with m.If(self.blocks.valid & self.blocks.ready):
                m.d.sync += [bsent.eq(1), st.blocks.eq(st.blocks + 1)]
            with m.If(d_ok & b_ok):
                m.d.sync += [dsent.eq(0), bsent.eq(0), b.eq(b + 1)]
                with m.If(tlast):
                    m.d.sync += [b.eq(0), lo.eq(lo + QT)]
                with m.If(rlast):
                    m.d.sync += pairs.eq(0)
        m.d.comb += self.busy.eq(~self.rec.ready)
        return m
