"""The EMIT executor (docs/node.md §3 EMIT row, §6 rule 3; issue #11 §1.3): a fragment's ACT K/V
rows in DDR → :class:`~mcf.hdl.compute.attention_kvq.KVQuantizer` → one INT4 KV fragment,
teed to the local landing path (always) and to the send unit's staging input (``replicate``).
The record format, ACT row layout and golden model are :mod:`mcf.abi.emit`.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.emit import (
    EMIT_ALIGN,
    EMIT_ARG,
    EMIT_CONFIG,
    EMIT_STATUS,
    kv_pair_bytes,
    max_fragment_tokens,
)
from mcf.abi.framing import beat_layout, parsed_layout
from mcf.abi.kv import kv_token_bytes
from mcf.abi.meta import META, Op
from mcf.abi.node import CMD

from ..compute.attention_kvq import KVQuantizer
from ..mem.axi import ADDR_BITS, AXI4Signature
from ..mem.dma import DmaReader, align_down
from .fsm import offer

__all__ = ["EmitUnit"]

PKT_WIDTH = 64


class EmitUnit(wiring.Component):
    """EMIT records → one quantised KV fragment each, landed locally and optionally staged.

    Members
    -------
    rec : In(stream.Signature(:data:`mcf.abi.node.CMD`))
        The sequencer's ``emit`` stream. ``meta`` is the fragment's Meta, ``arg`` an
        :data:`mcf.abi.emit.EMIT_ARG`, ``flags.replicate`` the tee. Taken when idle (one
        record at a time).
    done : Out(1)
        One strobe per record, in order: for a good record once its local packet has been
        handed on completely and its staged copy, if any, is complete in the staging FIFO; for
        a bad record (``bad_record``) or a read error (``read_errors``) once it is dropped.
    local : Out(stream.Signature(parsed_layout(64)))
        The fragment as a parsed packet for the local-packet arbiter: ``meta`` (the record's,
        ``src = local_id``) beside every beat, ``keep`` on the final beat, ``last``.
    staged : Out(stream.Signature(beat_layout(64)))
        ``replicate`` records only: the same payload beats for the send unit's
        ``staged_emit``. A fragment is offered only once complete in the staging FIFO
        (``MAX_PAYLOAD``, 256 beats), so the packetizer never waits on the emitter.
    local_id : In(META.src)
        This node's id.
    cfg : In(:data:`mcf.abi.emit.EMIT_CONFIG`)
        ACT K/V buffer base and row stride, their low 4 bits taken as 0
        (:data:`~mcf.abi.emit.EMIT_ALIGN`: the DMA reader has no byte realigner).
    bus : Out(AXI4Signature(addr_width, 128))
        AXI4 read master (a :class:`~mcf.hdl.mem.dma.DmaReader`): one 2-D descriptor per
        record, ``tokens`` rows of ``kv_pair_bytes(head_dim)`` bytes.
    status : Out(:data:`mcf.abi.emit.EMIT_STATUS`)

    Latency / throughput: the DMA beats (4 ACT codes each) feed the quantizer directly; its
    output fills the fragment buffer (``MAX_PAYLOAD`` bytes); then the buffer is read out at
    one beat per cycle to ``local`` and, through a second read port, to the staging FIFO, each
    at its own pace. The next record is taken after ``done``. The quantizer sets the rate
    (PER_TOKEN, one token at a time): measured at head_dim 16 (cocotb, no pauses, every record
    replicated, 10- and 32-token fragments): 33–34 cycles per token, 0.073–0.076 payload beats
    per cycle; the per-fragment overhead (descriptor, read latency, buffer read-out) is ~16
    cycles (2 % of a 32-token fragment, 5 % of a 10-token one).

    Resources (``mcf.sim.synth.resources``, yosys ``synth_xilinx``): head_dim 16: 4,069 LUT,
    120 LUTRAM, 1,730 FF, 27 DSP, 7 BRAM36; head_dim 128: 4,072 LUT, 192 LUTRAM, 1,736 FF,
    27 DSP, 7 BRAM36 (the quantizer's ~24 DSP, the DmaReader FIFO, the fragment buffer — one
    copy per read port — and the staging FIFO). Bad input never hangs: bad records are dropped
    before any bus access, a read error still runs the fragment through (framing kept) and
    drops it at the end.
    """

    def __init__(self, head_dim: int = 128, *, addr_width: int = ADDR_BITS,
                 dma_fifo_depth: int = 256, outstanding: int = 4):
        if kv_pair_bytes(head_dim) % EMIT_ALIGN:
            raise ValueError("a K/V pair must be whole 16-byte beats (head_dim even)")
        self.head_dim, self.addr_width = head_dim, addr_width
        self.dma_fifo_depth, self.outstanding = dma_fifo_depth, outstanding
        self.record = kv_token_bytes(head_dim)
        self.max_tokens = max_fragment_tokens(head_dim)
        self.depth = -(-self.max_tokens * self.record // (PKT_WIDTH // 8))
        super().__init__({
            "rec": In(stream.Signature(CMD)),
            "done": Out(1),
            "local": Out(stream.Signature(parsed_layout(PKT_WIDTH))),
            "staged": Out(stream.Signature(beat_layout(PKT_WIDTH))),
            "local_id": In(META["src"].shape),
            "cfg": In(EMIT_CONFIG),
            "bus": Out(AXI4Signature(addr_width, 128)),
            "status": Out(EMIT_STATUS),
        })

    def elaborate(self, platform):
        m = Module()
        st = self.status
        beat = beat_layout(PKT_WIDTH)

        m.submodules.dma = dma = DmaReader(128, self.addr_width, outstanding=self.outstanding,
                                           fifo_depth=self.dma_fifo_depth, align=EMIT_ALIGN)
        wiring.connect(m, dma.bus, wiring.flipped(self.bus))
        m.submodules.kvq = kvq = KVQuantizer(self.head_dim, data_width=PKT_WIDTH)
        m.d.comb += st.scale_sat.eq(kvq.scale_sat)

        # the latched record
        meta = Signal(META)
        arg = Signal(EMIT_ARG)
        rep = Signal()
        rmeta = data.View(META, self.rec.payload.meta[:META.size])
        rarg = data.View(EMIT_ARG, self.rec.payload.arg)
        good = Signal()
        m.d.comb += good.eq((rmeta.op == Op.KV_REPLICA) & (rarg.tokens != 0)
                            & (rarg.tokens <= self.max_tokens)
                            & (rmeta.length == rarg.tokens * self.record))

        # DMA → quantizer (one 128-bit beat = 4 ACT codes = one quantizer beat)
        err = Signal()
        m.d.comb += [kvq.i.payload.data.eq(dma.o.payload.data),
                     kvq.i.payload.last.eq(dma.o.payload.last),
                     kvq.i.valid.eq(dma.o.valid), dma.o.ready.eq(kvq.i.ready),
                     kvq.o_meta.ready.eq(1)]
        with m.If(dma.o.valid & dma.o.ready & dma.o.payload.err):
            m.d.sync += err.eq(1)
        d = dma.desc.payload
        # the base and stride on EMIT_ALIGN bytes (their low bits taken as 0: the reader's rows
        # are always on its ``align``, a misconfigured buffer reads from below, never hangs)
        base = align_down(self.cfg.kv_base, EMIT_ALIGN)
        stride = align_down(self.cfg.row_stride, EMIT_ALIGN)
        m.d.comb += [d.addr.eq(base + arg.row * stride
                               + arg.head * kv_pair_bytes(self.head_dim)),
                     d.length.eq(kv_pair_bytes(self.head_dim)),
                     d.stride.eq(stride), d.count.eq(arg.tokens),
                     kvq.i_meta.payload.eq(meta)]

        # fragment buffer: quantizer output → two read ports
        m.submodules.buf = buf = Memory(shape=beat, depth=self.depth, init=[])
        wr = buf.write_port()
        rd_l, rd_s = buf.read_port(), buf.read_port()
        wptr = Signal(range(self.depth + 1))
        lptr = Signal(range(self.depth + 1))
        sptr = Signal(range(self.depth + 1))
        l_done, s_done = Signal(), Signal()
        m.d.comb += [wr.addr.eq(wptr), wr.data.eq(kvq.o.payload)]

        # staging FIFO and its complete-packet count
        m.submodules.sfifo = sfifo = SyncFIFOBuffered(width=beat.size, depth=256)
        complete = Signal(range(257))
        s_out = data.View(beat, sfifo.r_data)
        m.d.comb += [self.staged.payload.eq(s_out),
                     self.staged.valid.eq(sfifo.r_rdy & (complete != 0)),
                     sfifo.r_en.eq(self.staged.ready & (complete != 0)),
                     sfifo.w_data.eq(rd_s.data)]
        s_last_out = self.staged.valid & self.staged.ready & s_out.last
        copy_end = Signal()
        m.d.sync += complete.eq(complete + copy_end - s_last_out)

        lp = self.local.payload
        l_beat = rd_l.data
        m.d.comb += [lp.meta.eq(meta), lp.meta.src.eq(self.local_id), lp.data.eq(l_beat.data),
                     lp.keep.eq(l_beat.keep), lp.last.eq(l_beat.last)]
        take_l = Signal()
        take_s = Signal()
        m.d.comb += [rd_l.addr.eq(Mux(take_l, lptr + 1, lptr)),
                     rd_s.addr.eq(Mux(take_s, sptr + 1, sptr))]
        m.d.sync += self.done.eq(0)

        def retire():
            m.d.sync += [self.done.eq(1), st.records.eq(st.records + 1)]
            m.next = "IDLE"

        with m.FSM(name="emit"):
            with m.State("IDLE"):
                m.d.comb += self.rec.ready.eq(1)
                m.d.sync += [wptr.eq(0), lptr.eq(0), sptr.eq(0), err.eq(0),
                             l_done.eq(0), s_done.eq(0)]
                with m.If(self.rec.valid):
                    m.d.sync += [meta.eq(rmeta), arg.eq(rarg),
                                 rep.eq(self.rec.payload.flags.replicate)]
                    with m.If(good):
                        m.next = "ISSUE"
                    with m.Else():
                        m.d.sync += st.bad_record.eq(st.bad_record + 1)
                        retire()
            with m.State("ISSUE"):
                offer(m, dma.desc, "QMETA")
            with m.State("QMETA"):
                offer(m, kvq.i_meta, "FILL")
            with m.State("FILL"):
                m.d.comb += [kvq.o.ready.eq(1), wr.en.eq(kvq.o.valid)]
                with m.If(kvq.o.valid):
                    m.d.sync += wptr.eq(wptr + 1)
                    with m.If(kvq.o.payload.last):
                        m.d.sync += st.tokens.eq(st.tokens + arg.tokens)
                        m.next = "PREP"
            with m.State("PREP"):
                with m.If(err):
                    m.d.sync += st.read_errors.eq(st.read_errors + 1)
                    retire()
                with m.Else():
                    m.d.sync += s_done.eq(~rep)
                    m.next = "OUT"
            with m.State("OUT"):
                m.d.comb += [self.local.valid.eq(~l_done),
                             take_l.eq(~l_done & self.local.ready),
                             take_s.eq(~s_done & sfifo.w_rdy), sfifo.w_en.eq(take_s)]
                with m.If(take_l):
                    m.d.sync += lptr.eq(lptr + 1)
                    with m.If(lptr + 1 == wptr):
                        m.d.sync += [l_done.eq(1), st.local.eq(st.local + 1)]
                with m.If(take_s):
                    m.d.sync += sptr.eq(sptr + 1)
                    with m.If(sptr + 1 == wptr):
                        m.d.comb += copy_end.eq(1)
                        m.d.sync += [s_done.eq(1), st.staged.eq(st.staged + 1)]
                with m.If(l_done & s_done):
                    retire()
        return m

