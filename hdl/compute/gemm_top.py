"""The matrix half of a node's compute engine (paper §5, Fig. 2): two DMA loaders on two AXI4
HP ports, the INT4 GEMM engine and the vector unit, joined by stream routing that the PS sets per
transfer — the PS only issues descriptors and configuration, every byte moves in the PL."""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.compute import DMA_STATUS, GEMM_STATUS, VECTOR_STATUS
from mcf.abi.fixed import INT8
from mcf.abi.quant import GROUP_SIZE, ReadDest, WriteSrc

from ..mem.dma import DmaLoader
from ..mem.stripe import StripeReader
from .gemm import GemmEngine
from .gemm_shared import SharedGemm
from .vector import VectorUnit

__all__ = ["MatrixEngine", "ReadDest", "WriteSrc"]


class MatrixEngine(wiring.Component):
    """DMA loaders + GEMM + vector unit.

    ``arrays`` is the GEMM's number of token-parallel 16 × 16 arrays (:class:`GemmEngine`; 1
    today, 4 on the kr260 node, docs/node.md §11); ports and stream formats do not depend on
    it. ``chain``, ``dsp``: the arrays' post-adder chain length and how its slices are built
    (:class:`GemmArray`); ``tile_ram``: the weight tile banks' RAM (:class:`GemmEngine`);
    ``rd_align``, ``wr_align``: the DMA loaders' readers' and writer's ``align``
    (:class:`~mcf.hdl.mem.dma.DmaReader`; the node's walker issues only reads on
    :data:`mcf.abi.jobs.JOB_ALIGN` and writes on :data:`~mcf.abi.jobs.JOB_WR_ALIGN`: no byte
    realigner on the reads, one stage on the writes).

    Weights: with ``w_ports = 0`` they come from port 1 (``rd_dest1 = GEMM_W``; ``w_in`` =
    ``data_width``): with 4 arrays the GEMM runs at full rate from 32-token jobs up and at the
    port's rate below. With ``w_ports = P`` > 0 (the node top: one per HP port, docs/node.md
    §4) a :class:`~mcf.hdl.mem.stripe.StripeReader` of ``P`` ports feeds the GEMM's
    ``P · data_width``-bit ``w_in`` (:func:`mcf.quant.gemm_stripe_image` layout), one job per
    GEMM job on ``w_job``; ``GEMM_W`` is then no destination of port 0 or 1 (port 1 reads the
    vector unit's second operand only).

    Members
    -------
    m_axi0, m_axi1 : Out(AXI4Signature)
        Two HP ports. Port 0 reads and writes, port 1 reads (its write path is idle).
    rd_desc0, rd_desc1, wr_desc : In(stream)
        DMA descriptors (:data:`mcf.abi.compute.DMA_DESC`).
    rd_dest0, rd_dest1 : In(ReadDest)
        Where each port's read data go (change only between descriptors).
    wr_src : In(WriteSrc)
        Which result stream port 0 writes.
    gemm_job : In(stream.Signature(:data:`mcf.abi.compute.GEMM_JOB`))
        GEMM jobs, queued and run back to back (:class:`GemmEngine`; with the ``acc_out`` /
        ``acc_in`` flags of tensor-parallel decode).
    vec_op, vec_n_beats, vec_eps : In
        Configuration of :class:`VectorUnit`.
    dma0_status, dma1_status : Out(:data:`mcf.abi.compute.DMA_STATUS`)
    gemm_status : Out(:data:`mcf.abi.compute.GEMM_STATUS`)
    vec_status : Out(:data:`mcf.abi.compute.VECTOR_STATUS`)
        Status counters of the parts.
    w_job : In(stream.Signature(:func:`mcf.abi.compute.stripe_job_layout`)) — ``w_ports`` > 0
        only: the weight matrix of each GEMM job, in job order.
    m_axi_w0 … m_axi_w{P-1} : Out(AXI4Signature) — ``w_ports`` > 0 only: the stripe readers'
        read masters, one per HP port (R only).
    stripe_status : Out(:data:`mcf.abi.compute.STRIPE_STATUS`) — ``w_ports`` > 0 only.
    c{n}_st, c{n}_res, 1 ≤ n ≤ ``clients`` : the GEMM's arrays offered to others
        (``clients`` > 0 only; :class:`~.gemm_shared.SharedGemm`): whole dot products of whole
        ``group``-channel groups in, results back in each client's step order — the node's
        tiled prefill attention (S and P·V, :class:`~.array_attend.ArrayAttention`).
    wr_busy, gemm_busy : Out(1)
        Port 0's write path has something outstanding; the GEMM has a job queued or in
        flight (or, with stripe readers, a weight job is queued or not yet consumed).

    Latency: the sum of the parts; the routing adds none (combinational).
    """

    def __init__(self, rows=16, lanes=16, group=GROUP_SIZE, k_max=8960, m_max=64,
                 vec_n_max=8960, data_width=128, outstanding=8, arrays=1, chain=1,
                 dsp="fabric", w_ports=0, clients=0, tile_ram="block", rd_align=1,
                 wr_align=1):
        vec_lanes = data_width // 32
        if lanes * INT8.width != data_width:
            raise ValueError("the GEMM beat (lanes·8) must equal the port width")
        self.w_ports = w_ports
        self.dma0 = DmaLoader(data_width, outstanding=outstanding, align=rd_align,
                              wr_align=wr_align)
        self.dma1 = DmaLoader(data_width, outstanding=outstanding, align=rd_align,
                              wr_align=wr_align)
        gemm_kw = dict(rows=rows, lanes=lanes, group=group, k_max=k_max, m_max=m_max,
                       arrays=arrays, w_width=data_width * (w_ports or 1), chain=chain, dsp=dsp,
                       tile_ram=tile_ram)
        self.clients = clients
        self.gemm = SharedGemm(clients + 1, **gemm_kw) if clients else GemmEngine(**gemm_kw)
        self.stripes = (StripeReader(w_ports, data_width, outstanding=outstanding)
                        if w_ports else None)
        self.vec = VectorUnit(vec_lanes, vec_n_max)
        d0 = self.dma0.signature.members
        g = self.gemm.signature.members
        v = self.vec.signature.members
        super().__init__({
            "m_axi0": d0["m_axi"], "m_axi1": d0["m_axi"],
            "rd_desc0": d0["rd_desc"], "rd_desc1": d0["rd_desc"], "wr_desc": d0["wr_desc"],
            "rd_dest0": In(ReadDest), "rd_dest1": In(ReadDest), "wr_src": In(WriteSrc),
            "gemm_job": g["job"],
            "vec_op": v["op"], "vec_n_beats": v["n_beats"], "vec_eps": v["eps"],
            "dma0_status": Out(DMA_STATUS), "dma1_status": Out(DMA_STATUS),
            "gemm_status": Out(GEMM_STATUS), "vec_status": Out(VECTOR_STATUS),
            "wr_busy": d0["wr_busy"], "gemm_busy": g["busy"],
            **(self._stripe_members() if w_ports else {}),
            **{f"c{n}_{p}": g[f"c{n}_{p}"] for n in range(1, clients + 1) for p in ("st", "res")},
        })

    def _stripe_members(self) -> dict:
        s = self.stripes.signature.members
        return {"w_job": s["job"], "stripe_status": s["status"],
                **{f"m_axi_w{p}": s[f"bus{p}"] for p in range(self.w_ports)}}

    def elaborate(self, platform):
        m = Module()
        m.submodules.dma0 = d0 = self.dma0
        m.submodules.dma1 = d1 = self.dma1
        m.submodules.gemm = g = self.gemm
        m.submodules.vec = v = self.vec
        wiring.connect(m, wiring.flipped(self.m_axi0), d0.m_axi)
        wiring.connect(m, wiring.flipped(self.m_axi1), d1.m_axi)
        wiring.connect(m, wiring.flipped(self.rd_desc0), d0.rd_desc)
        wiring.connect(m, wiring.flipped(self.rd_desc1), d1.rd_desc)
        wiring.connect(m, wiring.flipped(self.wr_desc), d0.wr_desc)
        m.d.comb += d1.wr_desc.valid.eq(0)
        wiring.connect(m, wiring.flipped(self.gemm_job), g.job)
        for n in range(1, self.clients + 1):
            wiring.connect(m, wiring.flipped(getattr(self, f"c{n}_st")), getattr(g, f"c{n}_st"))
            wiring.connect(m, getattr(g, f"c{n}_res"), wiring.flipped(getattr(self, f"c{n}_res")))
        m.d.comb += [v.op.eq(self.vec_op), v.n_beats.eq(self.vec_n_beats),
                     v.eps.eq(self.vec_eps),
                     self.dma0_status.eq(d0.status), self.dma1_status.eq(d1.status),
                     self.gemm_status.eq(g.status), self.vec_status.eq(v.status),
                     self.wr_busy.eq(d0.wr_busy),
                     self.gemm_busy.eq(g.busy | self.stripes.busy if self.w_ports else g.busy)]

        sinks = {ReadDest.GEMM_X: g.x_in, ReadDest.GEMM_W: g.w_in, ReadDest.VEC_A: v.a,
                 ReadDest.VEC_B: v.b}
        if self.w_ports:
            m.submodules.stripes = s = self.stripes
            del sinks[ReadDest.GEMM_W]
            wiring.connect(m, wiring.flipped(self.w_job), s.job)
            wiring.connect(m, s.o, g.w_in)
            for p in range(self.w_ports):
                wiring.connect(m, getattr(s, f"bus{p}"),
                               wiring.flipped(getattr(self, f"m_axi_w{p}")))
            m.d.comb += self.stripe_status.eq(s.status)
        for dest, sink in sinks.items():
            sel1 = Signal(name=f"from1_{dest.name.lower()}")
            m.d.comb += sel1.eq((self.rd_dest1 == dest) & (self.rd_dest0 != dest))
            m.d.comb += [sink.valid.eq(((self.rd_dest0 == dest) & d0.rd.valid) |
                                       (sel1 & d1.rd.valid)),
                         sink.payload.eq(d0.rd.payload.data)]
            with m.If(sel1):
                m.d.comb += sink.payload.eq(d1.rd.payload.data)
        for dest, sink in sinks.items():
            with m.If(self.rd_dest0 == dest):
                m.d.comb += d0.rd.ready.eq(sink.ready)
            with m.If((self.rd_dest1 == dest) & (self.rd_dest0 != dest)):
                m.d.comb += d1.rd.ready.eq(sink.ready)

        with m.If(self.wr_src == WriteSrc.GEMM):
            m.d.comb += [d0.wr.valid.eq(g.o.valid), d0.wr.payload.eq(g.o.payload),
                         g.o.ready.eq(d0.wr.ready)]
        with m.Else():
            m.d.comb += [d0.wr.valid.eq(v.o.valid), d0.wr.payload.eq(v.o.payload.data),
                         v.o.ready.eq(d0.wr.ready)]
        return m
