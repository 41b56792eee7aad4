"""The tiny Qwen2-style layer of ``sim/benches/gemm_layer.py`` with its linear parts run from JOB
templates (docs/node.md §3 "Job templates"): :class:`JobsBench` = :class:`JobWalker` +
:class:`MatrixEngine` (arrays=1), three AXI4 ports on one cocotbext-axi ``AxiRam``.

``mode = "template"``: the host builds two templates with :class:`mcf.abi.jobs.TemplateBuilder`
(the very calls the PS-driven bench makes): JOB 0 = RMSNorm, requant, Q/K/V projections, RoPE on
Q and K; JOB 1 = requant, O projection, residual add, RMSNorm, requant, gate/up projections,
SiLU·mul, requant, down projection, residual add. It writes them into DDR, sends JOB 0, computes
attention on the host from the Q/K/V in DDR (as the PS-driven bench does), sends JOB 1.
``mode = "ps"`` (on the plain ``MatrixEngine`` build): the same steps pushed from cocotb with
``gemm_layer.Engine``, for the cycle comparison.

Checks: the layer output in DDR equals :func:`mcf.golden.qwen_layer.layer_fixed` bit for bit;
no DMA errors; 7 GEMM jobs done, none rejected; template mode: a third template, one GEMM job of
``M_MAX + 1`` tokens, sent first, retires at once (``bad_gemm`` 1) and the layer runs behind it;
walker status as :func:`mcf.abi.jobs.walk`.
Reports ``cycles`` (the two phases, host attention excluded) to ``out``.

Params: ``seed``, ``tokens``, ``mode``, ``out`` (optional JSON).
"""

from __future__ import annotations

import json
import logging

import cocotb
import numpy as np
from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiBus, AxiRam

from mcf.abi.compute import DMA_STATUS, GEMM_STATUS, GemmLimits, status_values
from mcf.abi.jobs import (
    JOB_ALIGN,
    JOB_ARG,
    JOB_WR_ALIGN,
    JOBS_STATUS,
    TemplateBuilder,
    template_image,
    walk,
)
from mcf.abi.node import CMD, RecordClass
from mcf.abi.quant import VectorOp, norm_eps_code, rope_pair_order, rope_words
from mcf.golden.qwen_layer import TINY, attention, layer_fixed, quantize_layer, random_layer
from mcf.hdl.compute.gemm_top import MatrixEngine
from mcf.hdl.node.jobs import JobWalker, connect_engine
from mcf.quant import QuantWeight, from_act, gemm_tile_blob, to_act
from mcf.sim import bench_params
from mcf.sim.benches.gemm_layer import LANES, ROWS, Alloc, Engine

K_MAX, M_MAX = 256, 8                      # the bench engine's GEMM limits (the tiny layer's)
LIMITS = GemmLimits(M_MAX, K_MAX, LANES)


class JobsBench(wiring.Component):
    """Walker + matrix engine (the tiny layer's geometry; the engine's DMA engines aligned as the
    node's: :data:`~mcf.abi.jobs.JOB_ALIGN` reads, :data:`~mcf.abi.jobs.JOB_WR_ALIGN`
    writes): ports ``m_axi0/1`` (engine), ``m_axi2`` (walker), ``rec``, ``done``,
    ``table_base``, ``table_len`` and the statuses."""

    def __init__(self, k_max=K_MAX, m_max=M_MAX, vec_n_max=256):
        self.engine = MatrixEngine(k_max=k_max, m_max=m_max, vec_n_max=vec_n_max,
                                   rd_align=JOB_ALIGN, wr_align=JOB_WR_ALIGN)
        self.walker = JobWalker(self.engine.gemm.limits, vec_n_max=vec_n_max)
        e, w = self.engine.signature.members, self.walker.signature.members
        super().__init__({
            "m_axi0": e["m_axi0"], "m_axi1": e["m_axi1"], "m_axi2": w["m_axi"],
            "rec": In(stream.Signature(CMD)), "done": Out(1),
            "table_base": w["table_base"], "table_len": w["table_len"],
            "dma0_status": e["dma0_status"], "dma1_status": e["dma1_status"],
            "gemm_status": e["gemm_status"], "jobs_status": w["status"],
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine = e = self.engine
        m.submodules.walker = w = self.walker
        connect_engine(m, w, e)
        wiring.connect(m, wiring.flipped(self.m_axi0), e.m_axi0)
        wiring.connect(m, wiring.flipped(self.m_axi1), e.m_axi1)
        wiring.connect(m, wiring.flipped(self.m_axi2), w.m_axi)
        wiring.connect(m, wiring.flipped(self.rec), w.rec)
        m.d.comb += self.done.eq(w.done)
        m.d.comb += [w.table_base.eq(self.table_base), w.table_len.eq(self.table_len),
                     self.dma0_status.eq(e.dma0_status), self.dma1_status.eq(e.dma1_status),
                     self.gemm_status.eq(e.gemm_status), self.jobs_status.eq(w.status)]
        return m


def quiet(*rams):
    for r in rams:
        for side in (r.read_if, r.write_if):
            side.log.setLevel(logging.WARNING)


class Layer:
    """The tiny layer's data in DDR, as ``gemm_layer.tiny_layer`` lays it out, and its two
    phases as engine calls ``(method, args, kwargs)`` for ``Engine`` or ``TemplateBuilder``."""

    def __init__(self, mem, seed, m):
        cfg = self.cfg = TINY
        self.mem, self.m = mem, m
        self.w = random_layer(cfg, seed)
        self.x = np.random.default_rng(100 + seed).standard_normal(
            (m, cfg.hidden)).astype(np.float32)
        ql = self.ql = quantize_layer(self.w, cfg)
        hd, h = cfg.head_dim, cfg.hidden
        nq, nkv, inter = cfg.heads * hd, cfg.kv_heads * hd, cfg.intermediate
        self.nq, self.nkv = nq, nkv
        self.perm_q, self.perm_k = rope_pair_order(nq, hd), rope_pair_order(nkv, hd)

        def permuted(qw, perm):
            return QuantWeight(qw.q[perm], qw.m[perm], qw.e, qw.group)

        mats = {"q": (permuted(ql.qw["q"], self.perm_q), ql.bias["q"][self.perm_q]),
                "k": (permuted(ql.qw["k"], self.perm_k), ql.bias["k"][self.perm_k]),
                "v": (ql.qw["v"], ql.bias["v"]), "o": (ql.qw["o"], None),
                "gate": (ql.qw["gate"], None), "up": (ql.qw["up"], None),
                "down": (ql.qw["down"], None)}
        self.alloc = alloc = Alloc()

        def put(raw):
            a = alloc(len(raw))
            mem.write(a, raw)
            return a

        blobs = {}
        for name, (qw, b) in mats.items():
            raw = gemm_tile_blob(qw, ROWS, LANES, b)
            blobs[name] = (put(raw), len(raw))
        X = put(self.act_bytes(to_act(self.x)))
        G1 = put(self.act_bytes(ql.gamma["g1"] & 0xFFFF))
        G2 = put(self.act_bytes(ql.gamma["g2"] & 0xFFFF))
        pos = np.arange(m)
        RQ = put(self.act_bytes(rope_words(pos, nq, hd, cfg.theta)))
        RK = put(self.act_bytes(rope_words(pos, nkv, hd, cfg.theta)))
        buf = self.buf = {name: alloc(m * n * 4) for name, n in (
            ("n1", h), ("q", nq), ("k", nkv), ("v", nkv), ("qr", nq), ("kr", nkv),
            ("att", nq), ("o", h), ("h", h), ("n2", h), ("g", inter), ("u", inter),
            ("s", inter), ("d", h), ("y", h))}
        xq = {n: alloc(m * n + 64) for n in (h, nq, inter)}

        def mm(names, k, xa):
            return [(xq[xa], m, k, blobs[n], mats[n][0], buf[s]) for n, s in names]

        self.phase0 = [
            ("vector", (VectorOp.RMSNORM, h, m, X, G1, buf["n1"]), {}),
            ("requant", (h, m, buf["n1"], xq[h]), {}),
            ("gemms", (mm((("q", "q"), ("k", "k"), ("v", "v")), h, h),), {}),
            ("vector", (VectorOp.ROPE, nq, m, buf["q"], RQ, buf["qr"]), {"b_stride": nq * 4}),
            ("vector", (VectorOp.ROPE, nkv, m, buf["k"], RK, buf["kr"]),
             {"b_stride": nkv * 4}),
        ]
        self.phase1 = [
            ("requant", (nq, m, buf["att"], xq[nq]), {}),
            ("gemms", (mm((("o", "o"),), nq, nq),), {}),
            ("vector", (VectorOp.ADD, h, m, X, buf["o"], buf["h"]), {"b_stride": h * 4}),
            ("vector", (VectorOp.RMSNORM, h, m, buf["h"], G2, buf["n2"]), {}),
            ("requant", (h, m, buf["n2"], xq[h]), {}),
            ("gemms", (mm((("gate", "g"), ("up", "u")), h, h),), {}),
            ("vector", (VectorOp.SILU_MUL, inter, m, buf["g"], buf["u"], buf["s"]),
             {"b_stride": inter * 4}),
            ("requant", (inter, m, buf["s"], xq[inter]), {}),
            ("gemms", (mm((("down", "d"),), inter, inter),), {}),
            ("vector", (VectorOp.ADD, h, m, buf["h"], buf["d"], buf["y"]), {"b_stride": h * 4}),
        ]
        # a Q projection of M_MAX + 1 tokens, which the engine rejects: the walker refuses the
        # JOB at its GEMM entry, before its descriptors (else they would wait forever)
        big = M_MAX + 1
        self.refused = [("gemms", ([(alloc(big * h + 64), big, h, blobs["q"], mats["q"][0],
                                     alloc(big * nq * 4))],), {})]

    @staticmethod
    def act_bytes(a):
        return (np.asarray(a, dtype=np.int64) & 0xFFFFFFFF).astype("<u4").tobytes()

    def get_act(self, addr, rows, cols):
        raw = self.mem.read(addr, rows * cols * 4)
        return np.frombuffer(raw, dtype="<i4").astype(np.int64).reshape(rows, cols)

    def attention(self):
        """Host attention from the Q/K/V in DDR into ``att`` (as gemm_layer does)."""
        m, buf = self.m, self.buf
        q = np.empty((m, self.nq), dtype=np.int64)
        k = np.empty((m, self.nkv), dtype=np.int64)
        q[:, self.perm_q] = self.get_act(buf["qr"], m, self.nq)
        k[:, self.perm_k] = self.get_act(buf["kr"], m, self.nkv)
        v = self.get_act(buf["v"], m, self.nkv)
        att = to_act(attention(from_act(q), from_act(k), from_act(v), self.cfg, np.float64))
        self.mem.write(buf["att"], self.act_bytes(att))

    def check(self, dut):
        y = self.get_act(self.buf["y"], self.m, self.cfg.hidden)
        want = layer_fixed(self.x, self.ql, self.cfg)
        bad = np.argwhere(y != want)
        assert bad.size == 0, f"{len(bad)} mismatches vs golden, first {bad[0]}"
        for port in ("dma0", "dma1"):
            st = status_values(DMA_STATUS, getattr(dut, f"{port}_status").value)
            assert st["rd_errors"] == st["wr_errors"] == st["rd_rejects"] == \
                st["wr_rejects"] == 0
        gst = status_values(GEMM_STATUS, dut.gemm_status.value)
        assert gst["jobs_done"] == 7 and gst["bad_jobs"] == 0


class Cycles:
    def __init__(self, clk):
        self.n = 0
        cocotb.start_soon(self._count(clk))

    async def _count(self, clk):
        while True:
            await RisingEdge(clk)
            self.n += 1


async def reset(dut):
    cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
    dut.rst.value = 1
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 4)


async def run_template(dut, p):
    ram = AxiRam(AxiBus.from_prefix(dut, "m_axi0"), dut.clk, dut.rst, size=1 << 22)
    rams = [ram] + [AxiRam(AxiBus.from_prefix(dut, f"m_axi{i}"), dut.clk, dut.rst,
                           size=1 << 22, mem=ram.mem) for i in (1, 2)]
    quiet(*rams)
    dut.rec_tvalid.value = 0
    await reset(dut)
    layer = Layer(ram, p.get("seed", 0), p.get("tokens", 8))
    templates = []
    for phase in (layer.phase0, layer.phase1, layer.refused):
        b = TemplateBuilder(norm_eps_code(TINY.eps), ROWS, LANES)
        for name, args, kw in phase:
            getattr(b, name)(*args, **kw)
        templates.append(b.entries)
    table = layer.alloc(sum(16 * (len(t) + 1) for t in templates))
    image, n = template_image(templates, table)
    ram.write(table, image)
    dut.table_base.value = table
    dut.table_len.value = n
    clk = Cycles(dut.clk)
    per_job = []
    order = (2, 0, 1)                  # the refused JOB first: the layer runs behind it
    for j in order:
        dut.rec_tcls.value = RecordClass.JOB.value
        dut.rec_targ.value = JOB_ARG.const({"template": j}).as_bits()
        dut.rec_tvalid.value = 1
        await RisingEdge(dut.clk)
        while not dut.rec_tready.value:
            await RisingEdge(dut.clk)
        t0 = clk.n
        dut.rec_tvalid.value = 0
        for _ in range(100_000):
            await RisingEdge(dut.clk)
            if dut.done.value:
                break
        else:
            raise AssertionError(f"JOB {j} never retired")
        if j != 2:
            per_job.append(clk.n - t0)
        if j == 0:
            layer.attention()
    layer.check(dut)
    st = status_values(JOBS_STATUS, dut.jobs_status.value)
    want = [walk(ram.read, table, n, j, LIMITS)[1] for j in order]
    for name, _ in JOBS_STATUS:
        if name != "fence_cycles":
            assert st[name] == sum(w[name] for w in want), name
    assert st["bad_gemm"] == 1
    dut._log.info("templated: %s cycles per JOB, %d entries, %d fences, %d fence-wait cycles",
                  per_job, st["entries"], st["fences"], st["fence_cycles"])
    return {"cycles": sum(per_job), "cycles_job": per_job, "entries": st["entries"],
            "fence_cycles": st["fence_cycles"]}


async def run_ps(dut, p):
    eng = Engine(dut)
    await reset(dut)
    layer = Layer(eng.ram, p.get("seed", 0), p.get("tokens", 8))
    clk = Cycles(dut.clk)
    per_phase = []
    for k, phase in enumerate((layer.phase0, layer.phase1)):
        t0 = clk.n
        for name, args, kw in phase:
            await getattr(eng, name)(*args, **kw)
        per_phase.append(clk.n - t0)
        if k == 0:
            layer.attention()
    layer.check(dut)
    transfers = sum(len(ph) for ph in (layer.phase0, layer.phase1))
    dut._log.info("PS-driven: %s cycles per phase (%d transfers, each ending with the bench's "
                  "8 idle cycles)", per_phase, transfers)
    return {"cycles": sum(per_phase), "cycles_job": per_phase, "transfers": transfers}


@cocotb.test()
async def layer_jobs(dut):
    p = bench_params()
    res = await (run_template if p.get("mode", "template") == "template" else run_ps)(dut, p)
    if p.get("out"):
        with open(p["out"], "w") as f:
            json.dump(res, f)
