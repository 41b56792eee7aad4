"""The matrix half of a node's compute engine (paper §5, Fig. 2): two DMA loaders on two AXI4
HP ports, the INT4 GEMM engine and the vector unit, joined by stream routing that the PS sets per
transfer — the PS only issues descriptors and configuration, every byte moves in the PL."""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from mcf.abi.fixed import INT8
from mcf.abi.quant import ReadDest, WriteSrc

from ..mem.dma import DmaLoader
from .gemm import GemmEngine
from .vector import VectorUnit

__all__ = ["MatrixEngine", "ReadDest", "WriteSrc"]


class MatrixEngine(wiring.Component):
    """DMA loaders + GEMM + vector unit.

    Members
    -------
    m_axi0, m_axi1 : Out(AXI4Signature)
        Two HP ports. Port 0 reads and writes, port 1 reads (its write path is idle).
    rd_desc0, rd_desc1, wr_desc : In(stream)
        DMA descriptors (:func:`mcf.hdl.mem.axi.descriptor_layout`).
    rd_dest0, rd_dest1 : In(ReadDest)
        Where each port's read data go (change only between descriptors).
    wr_src : In(WriteSrc)
        Which result stream port 0 writes.
    gemm_*, vec_* : configuration of :class:`GemmEngine` and :class:`VectorUnit`.
    status: ``tiles_done``, ``tokens``, ``rd_errors0/1``, ``wr_errors``, ``wr_busy``,
    ``gemm_steps``, ``gemm_cycles``.

    Latency: the sum of the parts; the routing adds none (combinational).
    """

    def __init__(self, rows=16, lanes=16, group=128, k_max=8960, m_max=64, vec_n_max=1536,
                 data_width=128, outstanding=8):
        vec_lanes = data_width // 32
        if lanes * INT8.width != data_width:
            raise ValueError("the GEMM beat (lanes·8) must equal the port width")
        self.dma0 = DmaLoader(data_width, outstanding=outstanding)
        self.dma1 = DmaLoader(data_width, outstanding=outstanding)
        self.gemm = GemmEngine(rows, lanes, group, k_max, m_max)
        self.vec = VectorUnit(vec_lanes, vec_n_max)
        d0 = self.dma0.signature.members
        g = self.gemm.signature.members
        v = self.vec.signature.members
        super().__init__({
            "m_axi0": d0["m_axi"], "m_axi1": d0["m_axi"],
            "rd_desc0": d0["rd_desc"], "rd_desc1": d0["rd_desc"], "wr_desc": d0["wr_desc"],
            "rd_dest0": In(ReadDest), "rd_dest1": In(ReadDest), "wr_src": In(WriteSrc),
            "gemm_start": g["start"], "gemm_m_count": g["m_count"],
            "gemm_k_steps": g["k_steps"], "gemm_n_tiles": g["n_tiles"],
            "gemm_w_exp": g["w_exp"],
            "vec_op": v["op"], "vec_n_beats": v["n_beats"], "vec_eps": v["eps"],
            "tiles_done": g["tiles_done"], "tokens": v["tokens"],
            "gemm_steps": g["steps"], "gemm_cycles": g["cycles"],
            "rd_errors0": d0["rd_errors"], "rd_errors1": d0["rd_errors"],
            "wr_errors": d0["wr_errors"], "wr_busy": d0["wr_busy"],
        })

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
        m.d.comb += [g.start.eq(self.gemm_start), g.m_count.eq(self.gemm_m_count),
                     g.k_steps.eq(self.gemm_k_steps), g.n_tiles.eq(self.gemm_n_tiles),
                     g.w_exp.eq(self.gemm_w_exp), v.op.eq(self.vec_op),
                     v.n_beats.eq(self.vec_n_beats), v.eps.eq(self.vec_eps),
                     self.tiles_done.eq(g.tiles_done), self.tokens.eq(v.tokens),
                     self.gemm_steps.eq(g.steps), self.gemm_cycles.eq(g.cycles),
                     self.rd_errors0.eq(d0.rd_errors), self.rd_errors1.eq(d1.rd_errors),
                     self.wr_errors.eq(d0.wr_errors), self.wr_busy.eq(d0.wr_busy)]

        sinks = {ReadDest.GEMM_X: g.x_in, ReadDest.GEMM_W: g.w_in, ReadDest.VEC_A: v.a,
                 ReadDest.VEC_B: v.b}
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
