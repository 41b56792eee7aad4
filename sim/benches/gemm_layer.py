"""One tiny Qwen2-style layer through the matrix engine (two DMA loaders on two AXI4 ports
backed by one cocotbext-axi AxiRam, the INT4 GEMM engine and the vector unit), orchestrated the
way the PS would: only descriptors and configuration, all data in DDR.

The Q, K, V projections and the gate / up projections are each queued as one run of GEMM jobs
back to back (their job descriptors first, then every port's descriptors in job order).

Checks: the layer output in DDR equals :func:`mcf.golden.qwen_layer.layer_fixed` bit for bit,
and its relative error against the float32 layer is below ``params["max_rel_err"]``. Attention
(the attention kernel's area) is computed on the host from the Q/K/V the engine left in DDR, with
the same function the golden layer uses. Q and K projection rows are stored in RoPE pair order.

Params: ``seed``, ``tokens``, ``max_rel_err`` (vs the float32 layer), ``max_rel_err_deq``
(vs the float32 layer run with the dequantised weights), ``out`` (optional JSON).
"""

from __future__ import annotations

import dataclasses
import json
import logging

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiBus, AxiRam

from mcf.abi.compute import DMA_STATUS, GEMM_STATUS, GemmJob, status_values
from mcf.abi.quant import (
    ReadDest,
    VectorOp,
    WriteSrc,
    norm_eps_code,
    rope_pair_order,
    rope_words,
)
from mcf.golden.qwen_layer import (
    TINY,
    attention,
    layer_fixed,
    layer_float,
    quantize_layer,
    random_layer,
)
from mcf.quant import QuantWeight, from_act, gemm_tile_blob, to_act
from mcf.sim import bench_params
from mcf.sim.benches.dma_desc import send_descriptor, send_job

ROWS, LANES, BEAT = 16, 16, 16
VLANES = BEAT // 4


class Alloc:
    def __init__(self):
        self.top = 0x1000

    def __call__(self, nbytes):
        base = self.top
        self.top += (nbytes + 0xFFF) & ~0xFFF
        return base


class Engine:
    def __init__(self, dut):
        self.dut = dut
        self.ram = AxiRam(AxiBus.from_prefix(dut, "m_axi0"), dut.clk, dut.rst, size=1 << 22)
        ram1 = AxiRam(AxiBus.from_prefix(dut, "m_axi1"), dut.clk, dut.rst, size=1 << 22,
                      mem=self.ram.mem)
        for r in (self.ram, ram1):
            for side in (r.read_if, r.write_if):
                side.log.setLevel(logging.WARNING)
        for p in ("rd_desc0", "rd_desc1", "wr_desc"):
            getattr(dut, f"{p}_tvalid").value = 0
        dut.gemm_job_tvalid.value = 0

    async def descs(self, prefix, items):
        for addr, length, stride, count in items:
            await send_descriptor(self.dut, prefix, addr, length, stride, count)

    async def transfer(self, rd0=(), rd1=(), wr=(), dest0=ReadDest.VEC_A,
                       dest1=ReadDest.VEC_B, src=WriteSrc.VECTOR):
        d = self.dut
        d.rd_dest0.value = dest0.value
        d.rd_dest1.value = dest1.value
        d.wr_src.value = src.value
        tasks = [cocotb.start_soon(self.descs(p, items))
                 for p, items in (("wr_desc", wr), ("rd_desc0", rd0), ("rd_desc1", rd1))
                 if items]
        for t in tasks:
            await t
        idle = 0
        while idle < 8:
            await RisingEdge(d.clk)
            idle = idle + 1 if not d.wr_busy.value else 0

    async def vector(self, op, n, m, a, b, out, a_stride=None, b_stride=0, out_stride=None):
        """``m`` tokens of ``n`` ACT values: a rows at ``a`` (stride), b rows, out rows."""
        d = self.dut
        d.vec_op.value = op.value
        d.vec_n_beats.value = n // VLANES
        d.vec_eps.value = norm_eps_code(TINY.eps)
        row = n * 4
        rd1 = [(b, row, b_stride, m)] if b is not None else []
        await self.transfer([(a, row, a_stride or row, m)], rd1,
                            [(out, row, out_stride or row, m)])

    async def requant(self, n, m, a, xq):
        """ACT rows → INT8 codes at ``xq`` (token-major) then scale words (GEMM x layout)."""
        d = self.dut
        d.vec_op.value = VectorOp.REQUANT.value
        d.vec_n_beats.value = n // VLANES
        wr = []
        for t in range(m):
            wr += [(xq + t * n, n, 0, 1), (xq + m * n + 4 * t, 4, 0, 1)]
        await self.transfer([(a, n * 4, n * 4, m)], [], wr)

    async def gemm(self, xq, m, k, blob, qw: QuantWeight, out):
        """``blob`` = (address, bytes) of the weight stream (:func:`gemm_tile_blob`)."""
        await self.gemms([(xq, m, k, blob, qw, out)])

    async def gemms(self, jobs):
        """Several GEMM jobs queued back to back: all job descriptors, then each port's
        descriptors in job order (the engine overlaps a job's loads with the previous one's
        compute)."""
        d = self.dut
        rd0, rd1, wr = [], [], []
        for xq, m, k, blob, qw, out in jobs:
            n = qw.q.shape[0]
            job = GemmJob.for_shape(m, n, k, qw.e, ROWS, LANES)
            await send_job(d, "gemm_job", job)
            rd0 += [dataclasses.astuple(x) for x in job.x_descriptors(xq, LANES)]
            rd1.append((blob[0], blob[1], 0, 1))
            wr += [(out + t * ROWS * 4, ROWS * 4, n * 4, m) for t in range(n // ROWS)]
        await self.transfer(rd0, rd1, wr, ReadDest.GEMM_X, ReadDest.GEMM_W, WriteSrc.GEMM)


@cocotb.test()
async def tiny_layer(dut):
    p = bench_params()
    cfg = TINY
    m = p.get("tokens", 8)
    cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
    dut.rst.value = 1
    eng = Engine(dut)
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 4)

    w = random_layer(cfg, p.get("seed", 0))
    x = np.random.default_rng(100 + p.get("seed", 0)).standard_normal(
        (m, cfg.hidden)).astype(np.float32)
    ql = quantize_layer(w, cfg)
    hd, h = cfg.head_dim, cfg.hidden
    nq, nkv, inter = cfg.heads * hd, cfg.kv_heads * hd, cfg.intermediate
    perm_q, perm_k = rope_pair_order(nq, hd), rope_pair_order(nkv, hd)

    def permuted(qw, perm):
        return QuantWeight(qw.q[perm], qw.m[perm], qw.e, qw.group)

    mats = {"q": (permuted(ql.qw["q"], perm_q), ql.bias["q"][perm_q]),
            "k": (permuted(ql.qw["k"], perm_k), ql.bias["k"][perm_k]),
            "v": (ql.qw["v"], ql.bias["v"]), "o": (ql.qw["o"], None),
            "gate": (ql.qw["gate"], None), "up": (ql.qw["up"], None),
            "down": (ql.qw["down"], None)}
    alloc = Alloc()
    mem = eng.ram

    def put(arr_bytes):
        a = alloc(len(arr_bytes))
        mem.write(a, arr_bytes)
        return a

    def act_bytes(a):
        return (np.asarray(a, dtype=np.int64) & 0xFFFFFFFF).astype("<u4").tobytes()

    def get_act(addr, rows, cols):
        raw = mem.read(addr, rows * cols * 4)
        return np.frombuffer(raw, dtype="<i4").astype(np.int64).reshape(rows, cols)

    blobs = {}
    for name, (qw, b) in mats.items():
        raw = gemm_tile_blob(qw, ROWS, LANES, b)
        blobs[name] = (put(raw), len(raw))
    xa = to_act(x)
    X = put(act_bytes(xa))
    G1 = put(act_bytes(np.tile(ql.gamma["g1"] & 0xFFFF, 1)))
    G2 = put(act_bytes(ql.gamma["g2"] & 0xFFFF))
    pos = np.arange(m)
    RQ = put(act_bytes(rope_words(pos, nq, hd, cfg.theta)))
    RK = put(act_bytes(rope_words(pos, nkv, hd, cfg.theta)))
    buf = {name: alloc(m * n * 4) for name, n in (
        ("n1", h), ("q", nq), ("k", nkv), ("v", nkv), ("qr", nq), ("kr", nkv), ("att", nq),
        ("o", h), ("h", h), ("n2", h), ("g", inter), ("u", inter), ("s", inter),
        ("d", h), ("y", h))}
    xq = {n: alloc(m * n + 64) for n in (h, nq, inter)}

    # attention block
    await eng.vector(VectorOp.RMSNORM, h, m, X, G1, buf["n1"])
    await eng.requant(h, m, buf["n1"], xq[h])
    await eng.gemms([(xq[h], m, h, blobs[name], mats[name][0], buf[name])
                     for name in ("q", "k", "v")])
    await eng.vector(VectorOp.ROPE, nq, m, buf["q"], RQ, buf["qr"], b_stride=nq * 4)
    await eng.vector(VectorOp.ROPE, nkv, m, buf["k"], RK, buf["kr"], b_stride=nkv * 4)
    q = np.empty((m, nq), dtype=np.int64)
    k = np.empty((m, nkv), dtype=np.int64)
    q[:, perm_q] = get_act(buf["qr"], m, nq)
    k[:, perm_k] = get_act(buf["kr"], m, nkv)
    v = get_act(buf["v"], m, nkv)
    att = to_act(attention(from_act(q), from_act(k), from_act(v), cfg, np.float64))
    mem.write(buf["att"], act_bytes(att))
    await eng.requant(nq, m, buf["att"], xq[nq])
    await eng.gemm(xq[nq], m, nq, blobs["o"], mats["o"][0], buf["o"])
    await eng.vector(VectorOp.ADD, h, m, X, buf["o"], buf["h"], b_stride=h * 4)
    # MLP block
    await eng.vector(VectorOp.RMSNORM, h, m, buf["h"], G2, buf["n2"])
    await eng.requant(h, m, buf["n2"], xq[h])
    await eng.gemms([(xq[h], m, h, blobs[name], mats[name][0], buf[short])
                     for name, short in (("gate", "g"), ("up", "u"))])
    await eng.vector(VectorOp.SILU_MUL, inter, m, buf["g"], buf["u"], buf["s"],
                     b_stride=inter * 4)
    await eng.requant(inter, m, buf["s"], xq[inter])
    await eng.gemm(xq[inter], m, inter, blobs["down"], mats["down"][0], buf["d"])
    await eng.vector(VectorOp.ADD, h, m, buf["h"], buf["d"], buf["y"], b_stride=h * 4)

    y = get_act(buf["y"], m, h)
    want = layer_fixed(x, ql, cfg)
    bad = np.argwhere(y != want)
    assert bad.size == 0, f"{len(bad)} mismatches vs golden, first {bad[0]}"
    for port in ("dma0", "dma1"):
        st = status_values(DMA_STATUS, getattr(dut, f"{port}_status").value)
        assert st["rd_errors"] == st["wr_errors"] == st["rd_rejects"] == st["wr_rejects"] == 0
    gst = status_values(GEMM_STATUS, dut.gemm_status.value)
    assert gst["jobs_done"] == 7 and gst["bad_jobs"] == 0
    yf = layer_float(x, w, cfg)
    rel = float(np.linalg.norm(from_act(y) - yf) / np.linalg.norm(yf))
    rel_deq = float(np.linalg.norm(from_act(y) - layer_float(x, ql.dequantized(), cfg)) /
                    np.linalg.norm(yf))
    dut._log.info("tiny layer: relative error vs float32 %.4f (vs dequantised weights %.4f)",
                  rel, rel_deq)
    assert rel < p.get("max_rel_err", 0.2)
    assert rel_deq < p.get("max_rel_err_deq", 0.03)
    if p.get("out"):
        with open(p["out"], "w") as f:
            json.dump({"rel_err": rel, "rel_err_deq_weights": rel_deq}, f)
