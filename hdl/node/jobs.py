"""Template walker: JOB records → the matrix engine's descriptor streams and settings, read from
the template table in DDR (issue #11 §1.2, docs/node.md §3 "Job templates"; formats in
:mod:`mcf.abi.jobs`). It does in the PL what ``sim/benches/gemm_layer.py`` does from the PS."""

from __future__ import annotations

from amaranth import Cat, Module, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.compute import DMA_DESC, GEMM_JOB, STRIPE_ALIGN, GemmLimits, stripe_job_layout
from mcf.abi.jobs import (
    ENTRY_BYTES,
    JOB_ALIGN,
    JOB_ARG,
    JOB_INDEX_BITS,
    JOB_WR_ALIGN,
    JOBS_STATUS,
    ROUTE,
    STRIPE_KIND,
    TEMPLATE_ENTRY,
    TEMPLATE_REF,
    VEC_CFG,
    EntryKind,
)
from mcf.abi.node import CMD
from mcf.abi.quant import ReadDest, VectorOp, WriteSrc

from ..mem.axi import ADDR_BITS, AXI4Signature, descriptor_layout
from ..mem.dma import LUTRAM_FIFO_DEPTH, DmaReader, off_align

__all__ = ["JobWalker", "connect_engine"]

SETTLE = 2   # cycles the engine must look idle before a fence passes (its busy flags lag by 1)


class JobWalker(wiring.Component):
    """Plays one template per JOB record into the matrix engine.

    Members
    -------
    rec : In(stream.Signature(:data:`mcf.abi.node.CMD`))
        JOB records (the sequencer's ``job`` stream); ``arg`` is :data:`mcf.abi.jobs.JOB_ARG`.
        One is taken when the walker is idle.
    done : Out(1)
        One pulse per JOB: after its last entry completed (final fence), or at once for a bad
        index (or a table off :data:`~mcf.abi.jobs.JOB_ALIGN`), an unknown entry kind (or a
        template off ``JOB_ALIGN``, or a transfer off its alignment), a GEMM job ``gemm``
        refuses (the engine would; the job's descriptors follow it and are skipped with the
        rest) or a read error (counted; the rest is skipped). The walker's reader and the
        engine's DMA readers are built with ``align = JOB_ALIGN`` (no byte realigner), its
        writer with :data:`~mcf.abi.jobs.JOB_WR_ALIGN`.
    table_base, table_len : In
        ``JOBS_TABLE`` byte address and ``JOBS_TABLE_LEN`` (:func:`mcf.abi.jobs.jobs_registers`).
    m_axi : Out(AXI4Signature)
        Read master for table rows and entries (AW/W/B idle).
    rd_desc0, rd_desc1, wr_desc, gemm_job : Out(stream)
        To the engine's members of the same names; each behind a ``queue``-deep FIFO so the
        walker runs ahead of a busy stream.
    w_job : Out(stream.Signature(:func:`mcf.abi.compute.stripe_job_layout`)) — ``stripes``
        only: STRIPE entries as stripe-reader jobs (``pitch`` = the entry's ``ext`` ·
        :data:`mcf.abi.compute.STRIPE_ALIGN`), to the engine's ``w_job`` (a
        ``MatrixEngine(w_ports > 0)``), behind its own queue. Without ``stripes`` a STRIPE
        entry is a bad entry.
    rd_dest0, rd_dest1, wr_src, vec_op, vec_n_beats, vec_eps : Out
        The engine's routing and vector configuration (held between ROUTE / VEC entries).
    wr_busy, gemm_busy : In(1)
        From the engine; a fence waits for both low, the queues empty, for ``SETTLE`` cycles.
    status : Out(:data:`mcf.abi.jobs.JOBS_STATUS`)

    ``gemm`` (:class:`mcf.abi.compute.GemmLimits`) is the engine's: the jobs it accepts.

    The members named like :class:`mcf.hdl.compute.gemm_top.MatrixEngine`'s connect 1:1 with
    ``wiring.connect`` (build with the engine's ``vec_n_max`` and ``data_width``).

    Latency: table row read, then the entries stream from one read descriptor; one entry per
    cycle while the target queue has room and no fence waits; a fence costs ``SETTLE`` + 1
    cycles after the engine is idle. Throughput: one JOB at a time.
    """

    def __init__(self, gemm: GemmLimits, vec_n_max=8960, data_width=128,
                 addr_width=ADDR_BITS, queue=8, stripes=False):
        self.queue, self.gemm, self.stripes = queue, gemm, stripes
        self.reader = DmaReader(data_width, addr_width, outstanding=2,
                                fifo_depth=LUTRAM_FIFO_DEPTH, align=JOB_ALIGN)
        dma = stream.Signature(descriptor_layout(addr_width))
        super().__init__({
            "rec": In(stream.Signature(CMD)), "done": Out(1),
            "table_base": In(addr_width), "table_len": In(JOB_INDEX_BITS),
            "m_axi": Out(AXI4Signature(addr_width, data_width)),
            "rd_desc0": Out(dma), "rd_desc1": Out(dma), "wr_desc": Out(dma),
            "gemm_job": Out(stream.Signature(GEMM_JOB)),
            "rd_dest0": Out(ReadDest), "rd_dest1": Out(ReadDest), "wr_src": Out(WriteSrc),
            "vec_op": Out(VectorOp),
            "vec_n_beats": Out(range(vec_n_max // (data_width // 32) + 1)),
            "vec_eps": Out(32),
            "wr_busy": In(1), "gemm_busy": In(1),
            "status": Out(JOBS_STATUS),
            **({"w_job": Out(stream.Signature(stripe_job_layout(addr_width)))}
               if stripes else {}),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.reader = rd = self.reader
        wiring.connect(m, rd.bus, wiring.flipped(self.m_axi))
        st = self.status

        outs = {EntryKind.RD0.value: ("rd0", self.rd_desc0),
                EntryKind.RD1.value: ("rd1", self.rd_desc1),
                EntryKind.WR.value: ("wr", self.wr_desc),
                EntryKind.GEMM.value: ("gemm", self.gemm_job)}
        if self.stripes:
            outs[STRIPE_KIND] = ("stripe", self.w_job)
        queues = {}
        for kind, (name, port) in outs.items():
            q = fifo.SyncFIFOBuffered(width=port.payload.shape().size, depth=self.queue)
            m.submodules[f"q_{name}"] = queues[kind] = q
            m.d.comb += [port.valid.eq(q.r_rdy), port.payload.eq(q.r_data),
                         q.r_en.eq(port.ready)]
        last_kind = STRIPE_KIND if self.stripes else EntryKind.VEC.value

        # fence: queues empty and the engine idle for SETTLE cycles
        idle_now = Signal()
        m.d.comb += idle_now.eq(~self.wr_busy & ~self.gemm_busy &
                                ~Cat(q.level != 0 for q in queues.values()).any())
        quiet = Signal(range(SETTLE + 1))
        m.d.sync += quiet.eq(0)
        with m.If(idle_now):
            m.d.sync += quiet.eq(quiet + (quiet != SETTLE))
        idle = Signal()
        m.d.comb += idle.eq(idle_now & (quiet == SETTLE))

        index = Signal(JOB_INDEX_BITS)
        ref = data.View(TEMPLATE_REF, rd.o.payload.data)
        ent = data.View(TEMPLATE_ENTRY, rd.o.payload.data)
        ent_addr = Signal.like(rd.desc.payload.addr)
        ent_count = Signal(JOB_INDEX_BITS)
        m.d.sync += self.done.eq(0)

        def retire():
            m.d.sync += [self.done.eq(1), st.jobs.eq(st.jobs + 1)]

        def abort():
            with m.If(rd.o.payload.last):
                retire()
                m.next = "IDLE"
            with m.Else():
                m.next = "DRAIN"

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.rec.ready.eq(1)
                with m.If(self.rec.valid):
                    tmpl = data.View(JOB_ARG, self.rec.payload.arg).template
                    m.d.sync += index.eq(tmpl)
                    with m.If((tmpl >= self.table_len) | off_align(self.table_base, JOB_ALIGN)):
                        m.d.sync += st.bad_index.eq(st.bad_index + 1)
                        retire()
                    with m.Else():
                        m.next = "TABLE"
            with m.State("TABLE"):
                m.d.comb += [rd.desc.valid.eq(1),
                             rd.desc.payload.addr.eq(self.table_base + index * ENTRY_BYTES),
                             rd.desc.payload.length.eq(ENTRY_BYTES),
                             rd.desc.payload.count.eq(1)]
                with m.If(rd.desc.ready):
                    m.next = "ROW"
            with m.State("ROW"):
                m.d.comb += rd.o.ready.eq(1)
                with m.If(rd.o.valid):
                    m.d.sync += [ent_addr.eq(ref.addr), ent_count.eq(ref.count)]
                    with m.If(rd.o.payload.err):
                        m.d.sync += st.read_errors.eq(st.read_errors + 1)
                        retire()
                        m.next = "IDLE"
                    with m.Elif(ref.count == 0):
                        m.next = "FINAL"
                    with m.Elif(off_align(ref.addr, JOB_ALIGN)):        # a template off a beat
                        m.d.sync += st.bad_entries.eq(st.bad_entries + 1)
                        retire()
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "ENTRIES_REQ"
            with m.State("ENTRIES_REQ"):
                m.d.comb += [rd.desc.valid.eq(1), rd.desc.payload.addr.eq(ent_addr),
                             rd.desc.payload.length.eq(ent_count * ENTRY_BYTES),
                             rd.desc.payload.count.eq(1)]
                with m.If(rd.desc.ready):
                    m.next = "ENTRIES"
            with m.State("ENTRIES"):
                fences = Signal()
                take = Signal()
                refused = Signal()              # a GEMM entry the engine would reject
                job = data.View(GEMM_JOB, ent.body[:GEMM_JOB.size])
                xfer = data.View(DMA_DESC, ent.body[:DMA_DESC.size])
                off = Signal()                  # a transfer off its alignment: a bad entry
                kinds = [EntryKind.RD0.value, EntryKind.RD1.value] + (
                    [STRIPE_KIND] if self.stripes else [])
                m.d.comb += off.eq((Cat(ent.kind == k for k in kinds).any() &
                                    off_align(xfer.addr | xfer.stride, JOB_ALIGN)) |
                                   ((ent.kind == EntryKind.WR.value) &
                                    off_align(xfer.addr | xfer.stride, JOB_WR_ALIGN)))
                m.d.comb += [
                    fences.eq(ent.fence | (ent.kind == EntryKind.ROUTE.value) |
                              (ent.kind == EntryKind.VEC.value)),
                    refused.eq((ent.kind == EntryKind.GEMM.value) &
                               ~self.gemm.accepts(job.m_count, job.k_steps, job.n_tiles)),
                ]
                with m.If(rd.o.valid):
                    with m.If(rd.o.payload.err):
                        m.d.comb += take.eq(1)
                        m.d.sync += st.read_errors.eq(st.read_errors + 1)
                        abort()
                    with m.Elif(fences & ~idle):
                        m.d.sync += st.fence_cycles.eq(st.fence_cycles + 1)
                    with m.Elif(refused):
                        m.d.comb += take.eq(1)
                        m.d.sync += st.bad_gemm.eq(st.bad_gemm + 1)
                        abort()
                    with m.Elif(off):
                        m.d.comb += take.eq(1)
                        m.d.sync += st.bad_entries.eq(st.bad_entries + 1)
                        abort()
                    with m.Else():
                        with m.Switch(ent.kind):
                            for kind, q in queues.items():
                                with m.Case(kind):
                                    m.d.comb += [q.w_en.eq(1), q.w_data.eq(ent.body),
                                                 take.eq(q.w_rdy)]
                                    if kind == STRIPE_KIND:
                                        m.d.comb += q.w_data.eq(self._stripe_job(m, ent))
                            # settings: each field into the output of its name
                            for kind, lay, prefix in ((EntryKind.ROUTE, ROUTE, ""),
                                                      (EntryKind.VEC, VEC_CFG, "vec_")):
                                with m.Case(kind.value):
                                    v = data.View(lay, ent.body[:lay.size])
                                    m.d.sync += [getattr(self, prefix + f).eq(v[f])
                                                 for f, _ in lay]
                                    m.d.comb += take.eq(1)
                            with m.Default():
                                m.d.comb += take.eq(1)
                                m.d.sync += st.bad_entries.eq(st.bad_entries + 1)
                                abort()
                        with m.If(take & (ent.kind <= last_kind)):
                            m.d.sync += st.entries.eq(st.entries + 1)
                            with m.If(fences):
                                m.d.sync += st.fences.eq(st.fences + 1)
                            with m.If(rd.o.payload.last):
                                m.next = "FINAL"
                m.d.comb += rd.o.ready.eq(take)
            with m.State("DRAIN"):
                # an aborted JOB: skip the rest of its entries, retire at once
                m.d.comb += rd.o.ready.eq(1)
                with m.If(rd.o.valid & rd.o.payload.last):
                    retire()
                    m.next = "IDLE"
            with m.State("FINAL"):
                with m.If(idle):
                    m.d.sync += st.fences.eq(st.fences + 1)
                    retire()
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += st.fence_cycles.eq(st.fence_cycles + 1)
        return m


    def _stripe_job(self, m: Module, ent) -> data.View:
        """A STRIPE entry as the stripe readers' job: the body's transfer (stripe 0), ``pitch``
        from ``ext``."""
        d = data.View(DMA_DESC, ent.body[:DMA_DESC.size])
        job = Signal(self.w_job.payload.shape(), name="stripe_job")
        m.d.comb += [job.addr.eq(d.addr), job.length.eq(d.length), job.stride.eq(d.stride),
                     job.count.eq(d.count),
                     job.pitch.eq(ent.ext << (STRIPE_ALIGN.bit_length() - 1))]
        return job


STREAMS = ("rd_desc0", "rd_desc1", "wr_desc", "gemm_job")
SETTINGS = ("rd_dest0", "rd_dest1", "wr_src", "vec_op", "vec_n_beats", "vec_eps")


def connect_engine(m: Module, walker: JobWalker, engine) -> None:
    """Wire ``walker`` to a :class:`~mcf.hdl.compute.gemm_top.MatrixEngine`: the descriptor
    streams with ``wiring.connect``, the settings and busy flags member to member."""
    for name in STREAMS:
        wiring.connect(m, getattr(walker, name), getattr(engine, name))
    if walker.stripes:
        wiring.connect(m, walker.w_job, engine.w_job)
    m.d.comb += [getattr(engine, n).eq(getattr(walker, n)) for n in SETTINGS]
    m.d.comb += [walker.wr_busy.eq(engine.wr_busy), walker.gemm_busy.eq(engine.gemm_busy)]
