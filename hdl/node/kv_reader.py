"""KV reader of the node (docs/node.md §4–5, issue #11 §1.3 "Reader"): landed KV token records
in DDR → the attention engine's ``k`` and ``v`` streams (:mod:`mcf.abi.kv_reader`).

A block request names ``tokens`` consecutive ``PER_TOKEN`` records (``sk``, ``sv``, K row, V row;
:func:`mcf.abi.kv.pack_kv_block`) of one KV head. A :class:`~mcf.hdl.mem.dma.DmaReader` reads
them; a record splitter (a byte gearbox of ``record + beat`` bytes) cuts whole records out of the
128-bit byte stream; a serializer emits each record's K row on ``k`` and, in the same cycles,
its V row into a V FIFO that holds ``v_blocks`` blocks of ``max_block`` rows, from which ``v``
is served when the engine asks for it (the engine takes a block's K rows ahead of its V rows).
"""

from __future__ import annotations

import math

from amaranth import Array, Cat, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from mcf.abi.attend import ATT_ALIGN
from mcf.abi.kv import KV_ELEM, KV_POS_BITS, KV_SCALE, kv_beat_layout, kv_token_bytes
from mcf.abi.kv_reader import KV_BLOCK_REQ, KV_BLOCK_TOKENS_BITS, KV_READER_STATUS

from ..mem.axi import ADDR_BITS, AXI4Signature
from ..mem.dma import DmaReader, off_align

__all__ = ["KvReader"]

SCALES_BYTES = 2 * KV_SCALE.width // 8


class KvReader(wiring.Component):
    """Landed KV blocks → attention ``k`` / ``v`` streams.

    Members
    -------
    blocks : In(stream.Signature(:data:`mcf.abi.kv_reader.KV_BLOCK_REQ`))
        One request per attention block: ``addr`` of its first token record (a multiple of
        :data:`~mcf.abi.attend.ATT_ALIGN`, 4 bytes: the DMA reader realigns by words only),
        ``tokens`` (1..``max_block``), ``pos0``, ``last`` (the job's final block), ``k_only``
        (no V rows: a MAX-mode job). A request with ``tokens`` 0 or above ``max_block`` or an
        ``addr`` off 4 bytes is dropped and counted in ``rejects``. Requests are queued (4
        deep) and their reads issued at once: block ``b+1`` is read while the engine consumes
        block ``b``.
    k : Out(stream.Signature(kv_beat_layout(lanes)))
        Per request the block's K rows, ``head_dim/lanes`` beats each, with the token's
        ``scale_k``, ``scale_v`` and ``pos = pos0 + i`` on every beat, ``last`` on the block's
        final beat — what :class:`~mcf.hdl.compute.attention.AttentionEngine` takes on ``k``.
    v : Out(stream.Signature(kv_beat_layout(lanes)))
        Per request (unless ``k_only``) the block's V rows in the same order, ``v = 1``,
        ``last`` on the final beat; ``scale_k``, ``scale_v``, ``pos`` are 0 (the engine takes
        the V scale with the K row). :func:`mcf.abi.kv_reader.block_beats` is the golden model.
    bus : Out(AXI4Signature(addr_width, 128))
        AXI4 master, read channels only (the ``DmaReader``'s: INCR bursts ≤ 256 beats, never
        across 4 KiB, ``outstanding`` bursts in flight, R always accepted).
    status : Out(:data:`mcf.abi.kv_reader.KV_READER_STATUS`)

    Buffers: the DmaReader's receive FIFO (``dma_fifo_depth`` × 129 bits: 2 BRAM36 at 512)
    and the V FIFO, ``v_blocks · max_block · head_dim/lanes`` entries of ``lanes·4 + 1`` bits:
    kr260 (d 128, 64 lanes, 256-token blocks) ``v_blocks = 2``: 1,024 × 257 bits = 8 BRAM36;
    ``v_blocks = 1``: 4 BRAM36, and still no deadlock (the engine's V side drains the earlier
    blocks' V rows, complete in the FIFO, without needing new K rows). Measured
    (``mcf.sim.synth.resources``, classic abc, d 128, 64 lanes): 3,113 LUT, 40 LUTRAM, 3,175
    FF, 1 DSP (``tokens · record``), 10 BRAM36 with ``v_blocks = 2`` (6 with 1) — 5,637 LUT
    when the gearbox placed a beat on the byte grid.

    Throughput: one record per ``max(head_dim/lanes, ⌈record/16⌉)`` cycles — the K row and
    the V row of a record leave in the same ``head_dim/lanes`` cycles, the gearbox takes one
    16-byte beat per cycle — when ``k`` is ready and the V FIFO has room. Latency (measured,
    R beats back to back): AR 3 cycles after the request is taken; the first ``k`` beat
    ``5 + ⌈record/16⌉`` cycles after the first R beat (7 for d 16, 14 for d 128). A request
    queued behind others is read as soon as the DmaReader takes its descriptor (once the
    previous block's last burst is issued), so block ``b+1`` streams in behind block ``b``.
    Stream rules: ``k`` and ``v`` hold a beat until taken and never wait for ``ready`` to
    raise ``valid``. Bad input never hangs: rejected requests are counted; non-OKAY read beats
    are counted (``bus_errors``) and their bytes passed on, so the block framing is kept.
    """

    def __init__(self, head_dim: int = 128, lanes: int = 64, max_block: int = 256, *,
                 v_blocks: int = 2, addr_width: int = ADDR_BITS, data_width: int = 128,
                 dma_fifo_depth: int = 512, outstanding: int = 8):
        if head_dim % lanes or (head_dim // lanes) < 1:
            raise ValueError("head_dim must be a multiple of lanes")
        if lanes % 2:
            raise ValueError("lanes must be even (whole bytes of INT4 codes per beat)")
        if not 1 <= max_block < 1 << KV_BLOCK_TOKENS_BITS:
            raise ValueError("max_block out of range")
        if kv_token_bytes(head_dim) % ATT_ALIGN:
            raise ValueError(f"a token record must be whole {ATT_ALIGN}-byte words")
        if v_blocks < 1:
            raise ValueError("the V FIFO must hold at least one block")
        self.head_dim, self.lanes, self.max_block = head_dim, lanes, max_block
        self.v_blocks, self.data_width = v_blocks, data_width
        self.addr_width, self.dma_fifo_depth, self.outstanding = (addr_width, dma_fifo_depth,
                                                                  outstanding)
        self.record = kv_token_bytes(head_dim)
        self.v_depth = v_blocks * max_block * (head_dim // lanes)
        super().__init__({
            "blocks": In(stream.Signature(KV_BLOCK_REQ)),
            "k": Out(stream.Signature(kv_beat_layout(lanes))),
            "v": Out(stream.Signature(kv_beat_layout(lanes))),
            "bus": Out(AXI4Signature(addr_width, data_width)),
            "status": Out(KV_READER_STATUS),
        })

    def elaborate(self, platform):
        m = Module()
        D, L, R = self.head_dim, self.lanes, self.record
        NB = D // L
        BB = self.data_width // 8
        BUF = R + BB                      # gearbox bytes: one record plus one bus beat
        G = math.gcd(R, BB)               # the grid the counts of bytes live on
        ROW = D * KV_ELEM.width            # bits of a K or V row
        BEAT = L * KV_ELEM.width
        st = self.status

        m.submodules.dma = dma = DmaReader(self.data_width, self.addr_width,
                                           outstanding=self.outstanding,
                                           fifo_depth=self.dma_fifo_depth, align=ATT_ALIGN)
        wiring.connect(m, dma.bus, wiring.flipped(self.bus))
        m.d.comb += st.bus_errors.eq(dma.status.errors)

        # ---- request intake: reject, issue the read, queue the block's info -----------------
        info_l = data.StructLayout({"tokens": self.blocks.payload.tokens.shape(),
                                    "pos0": KV_BLOCK_REQ["pos0"].shape,
                                    "last": 1, "k_only": 1})
        m.submodules.info = info = fifo.SyncFIFOBuffered(width=info_l.size, depth=4)
        req = self.blocks.payload
        bad = Signal()
        m.d.comb += bad.eq((req.tokens == 0) | (req.tokens > self.max_block)
                           | off_align(req.addr, ATT_ALIGN))
        d = dma.desc.payload
        m.d.comb += [d.addr.eq(req.addr), d.length.eq(req.tokens * R), d.stride.eq(0),
                     d.count.eq(1),
                     info.w_data.eq(Cat(req.tokens, req.pos0, req.last, req.k_only))]
        with m.If(bad):
            m.d.comb += self.blocks.ready.eq(1)
            with m.If(self.blocks.valid):
                m.d.sync += st.rejects.eq(st.rejects + 1)
        with m.Else():
            m.d.comb += [self.blocks.ready.eq(dma.desc.ready & info.w_rdy),
                         dma.desc.valid.eq(self.blocks.valid & info.w_rdy),
                         info.w_en.eq(self.blocks.valid & dma.desc.ready)]

        # ---- gearbox: bytes → whole records -----------------------------------------------
        buf = Signal(8 * BUF)
        cnt = Signal(range(BUF + 1))
        blk = data.View(info_l, info.r_data)
        ntok = Signal(KV_BLOCK_TOKENS_BITS)       # records of the current block loaded so far
        have = Signal()
        load = Signal()
        m.d.comb += have.eq((cnt >= R) & info.r_rdy)

        after = Signal(range(BUF + 1))
        m.d.comb += after.eq(cnt - Mux(load, R, 0))
        ib = dma.o.payload
        nbytes = Signal(range(BB + 1))
        m.d.comb += nbytes.eq(sum(ib.keep[i] for i in range(BB)))
        masked = Signal(8 * BB)
        m.d.comb += masked.eq(ib.data & Cat(*(ib.keep[i].replicate(8) for i in range(BB))))
        push = Signal()
        m.d.comb += [push.eq(dma.o.valid & (after <= BUF - BB)), dma.o.ready.eq(push)]
        shifted = Signal(8 * BUF)
        m.d.comb += shifted.eq(Mux(load, buf >> (8 * R), buf))
        # every count is a multiple of G bytes (records and beats are, and a block's final
        # beat holds a multiple of G bytes): the beat's G-byte words land at word ``u``, each
        # word of the buffer one of the beat's BB/G words (4 at 128-bit beats and d 128)
        u = after[exact_log2(G):]
        NBW = BB // G
        words = Array(masked.word_select(k, 8 * G) for k in range(NBW))
        placed = Cat(*(Mux((u <= p) & (u + NBW > p), words[(p - u)[:exact_log2(NBW)]], 0)
                       for p in range(BUF // G)))
        with m.If(push):
            m.d.sync += [buf.eq(shifted | placed),
                         cnt.eq(after + nbytes)]
        with m.Else():
            m.d.sync += [buf.eq(shifted), cnt.eq(after)]

        # ---- serializer: the loaded record's K row to ``k``, its V row to the V FIFO -------
        m.submodules.vfifo = vfifo = fifo.SyncFIFOBuffered(width=BEAT + 1, depth=self.v_depth)
        sk = Signal(KV_SCALE.width)
        sv = Signal(KV_SCALE.width)
        krow = Signal(ROW)
        vrow = Signal(ROW)
        pos = Signal(KV_POS_BITS)
        rlast = Signal()
        kpend, vpend = Signal(), Signal()
        ki = Signal(range(NB))
        vi = Signal(range(NB))
        k_end, v_end = Signal(), Signal()
        m.d.comb += [k_end.eq(self.k.valid & self.k.ready & (ki == NB - 1)),
                     v_end.eq(vfifo.w_en & vfifo.w_rdy & (vi == NB - 1))]
        kp = self.k.payload
        m.d.comb += [self.k.valid.eq(kpend),
                     kp.data.eq(krow.word_select(ki, BEAT)), kp.scale_k.eq(sk),
                     kp.scale_v.eq(sv), kp.pos.eq(pos), kp.v.eq(0),
                     kp.last.eq(rlast & (ki == NB - 1)),
                     vfifo.w_en.eq(vpend),
                     vfifo.w_data.eq(Cat(vrow.word_select(vi, BEAT), rlast & (vi == NB - 1)))]
        with m.If(self.k.valid & self.k.ready):
            m.d.sync += ki.eq(Mux(ki == NB - 1, 0, ki + 1))
            with m.If(ki == NB - 1):
                m.d.sync += kpend.eq(0)
                with m.If(rlast):
                    m.d.sync += st.blocks.eq(st.blocks + 1)
        with m.If(vfifo.w_en & vfifo.w_rdy):
            m.d.sync += vi.eq(Mux(vi == NB - 1, 0, vi + 1))
            with m.If(vi == NB - 1):
                m.d.sync += vpend.eq(0)

        m.d.comb += load.eq(have & (~kpend | k_end) & (~vpend | v_end))
        block_end = Signal()
        m.d.comb += block_end.eq(ntok + 1 == blk.tokens)
        with m.If(load):
            m.d.sync += [sk.eq(buf[:16]), sv.eq(buf[16:32]),
                         krow.eq(buf[8 * SCALES_BYTES:][:ROW]),
                         vrow.eq(buf[8 * SCALES_BYTES + ROW:][:ROW]),
                         pos.eq(blk.pos0 + ntok), rlast.eq(block_end),
                         kpend.eq(1), vpend.eq(~blk.k_only), ki.eq(0), vi.eq(0),
                         ntok.eq(Mux(block_end, 0, ntok + 1)),
                         st.tokens.eq(st.tokens + 1)]
            with m.If(block_end):
                m.d.comb += info.r_en.eq(1)
                m.d.sync += st.jobs.eq(st.jobs + blk.last)

        # ---- V rows out --------------------------------------------------------------------
        vq = self.v.payload
        m.d.comb += [self.v.valid.eq(vfifo.r_rdy), vfifo.r_en.eq(self.v.ready),
                     vq.data.eq(vfifo.r_data[:BEAT]), vq.last.eq(vfifo.r_data[BEAT]),
                     vq.v.eq(1), vq.scale_k.eq(0), vq.scale_v.eq(0), vq.pos.eq(0)]
        return m
