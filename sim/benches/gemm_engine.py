"""cocotb bench of the INT4 GEMM engine behind FlatTop: sequences of jobs back to back (job
descriptors, activation and tile streams from cocotbext-axi sources, results into a sink), every
job bit-exact against :func:`mcf.golden.gemm.gemm` (paper §5: ping-pong loading).

Params: ``rows``, ``lanes``, ``group``, ``w_bytes`` (optional: bytes per ``w_in`` word, when
wider than the beat — the weight stream is then :func:`mcf.abi.compute.gemm_w_stream`);
``sequences``: list of ``{"name", "jobs": [{m, n, k,
seed}, ...]}`` — each sequence's job descriptors are queued at once and its streams sent
without gaps; ``idle`` and ``backpressure`` (pause probabilities of the sources / the sink);
``seed``; ``sabotage`` (optional list of ``{"sequence", "job", "kind"}``: ``"weights"`` checks
that job against other weights, ``"bad_job"`` also queues a descriptor the engine rejects);
``out`` (optional JSON path). Per sequence the JSON has: ``cycles`` (first job descriptor
presented → last result beat), ``steps`` (k-steps, from the engine's status), ``first_out``
(cycle of the first result beat, relative) and ``steps_at_first_out``, ``x_bytes``,
``w_bytes``, ``mismatches`` per job and the status counter differences. The JSON is written
before the checks, so a refusing caller can tell why.
"""

from __future__ import annotations

import json
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge, with_timeout
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from mcf.abi.compute import (
    GEMM_STATUS,
    GemmJob,
    gemm_w_stream,
    gemm_x_stream,
    status_values,
)
from mcf.golden.gemm import gemm
from mcf.quant import QuantWeight, gemm_tile_blob, gemm_x_blob
from mcf.sim import bench_params
from mcf.sim.benches.dma_desc import send_job
from mcf.sim.tb import set_pauses

CLOCK_NS = 4


def make_case(m, n, k, group, seed):
    rng = np.random.default_rng(seed)
    xq = rng.integers(-128, 128, (m, k))
    x_m = rng.integers(1 << 15, 1 << 16, m)
    x_e = rng.integers(-26, -20, m)
    q = rng.integers(-8, 8, (n, k)).astype(np.int8)
    # a few all-extreme rows keep the INT4 corners in every shape
    q[0, :] = -8
    if n > 1:
        q[1, :] = 7
    wm = rng.integers(0, 1 << 16, (n, k // group))
    qw = QuantWeight(q, wm, int(rng.integers(-21, -19)), group)
    bias = rng.integers(-(1 << 24), 1 << 24, n)
    return xq, x_m, x_e, qw, bias


class TB:
    def __init__(self, dut, p):
        self.dut = dut
        self.cycle = 0
        cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns").start())
        self.xs = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_x"), dut.clk, dut.rst)
        self.ws = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_w"), dut.clk, dut.rst)
        self.ys = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_y"), dut.clk, dut.rst)
        rng = random.Random(p.get("seed", 1))
        set_pauses(rng, (self.xs, self.ws), (self.ys,), idle=p.get("idle", 0) or None,
                   backpressure=p.get("backpressure", 0) or None)
        dut.job_tvalid.value = 0

    async def count(self):
        while True:
            await RisingEdge(self.dut.clk)
            self.cycle += 1

    def status(self) -> dict[str, int]:
        return status_values(GEMM_STATUS, self.dut.status.value)


async def run_sequence(tb, seq, p, sabotage):
    rows, lanes, group = p["rows"], p["lanes"], p["group"]
    bb = lanes
    jobs = [make_case(j["m"], j["n"], j["k"], group, j["seed"]) for j in seq["jobs"]]
    before = tb.status()
    x_bytes = w_bytes = 0
    descs = []
    for i, (xq, _, _, qw, _) in enumerate(jobs):
        m, k = xq.shape
        if (i, "bad_job") in sabotage:
            descs.append(GemmJob(m, k // lanes + 1, 1, qw.e))    # not a whole group: reject
        descs.append(GemmJob.for_shape(m, qw.q.shape[0], k, qw.e, rows, lanes))
    xblobs = [gemm_x_stream(gemm_x_blob(xq, x_m, x_e, bb), xq.shape[0], xq.shape[1], bb)
              for xq, x_m, x_e, _, _ in jobs]
    wbb = p.get("w_bytes") or bb
    wblobs = [gemm_w_stream(gemm_tile_blob(qw, rows, lanes, bias), xq.shape[1] // lanes,
                            qw.q.shape[0] // rows, rows, lanes, wbb, group)
              for xq, _, _, qw, bias in jobs]
    t0 = tb.cycle

    async def push_jobs():
        for d in descs:
            await send_job(tb.dut, "job", d)

    cocotb.start_soon(push_jobs())
    for xb, wb in zip(xblobs, wblobs):
        x_bytes += len(xb)
        w_bytes += len(wb)
        await tb.xs.send(AxiStreamFrame(xb))
        await tb.ws.send(AxiStreamFrame(wb))
    n_bytes = sum(xq.shape[0] * qw.q.shape[0] * 4 for xq, _, _, qw, _ in jobs)
    got = bytearray()
    first_out = steps_at_first = None
    while len(got) < n_bytes:
        fr = await tb.ys.recv(compact=False)
        if first_out is None:
            first_out = tb.cycle - t0
            steps_at_first = tb.status()["steps"] - before["steps"]
        got += bytes(fr.tdata)
    cycles = tb.cycle - t0
    for _ in range(4):
        await RisingEdge(tb.dut.clk)
    after = tb.status()
    diff = {n: (after[n] - before[n]) % (1 << 32) for n in after}
    mismatches, pos = [], 0
    for i, (xq, x_m, x_e, qw, bias) in enumerate(jobs):
        m, n = xq.shape[0], qw.q.shape[0]
        vals = np.frombuffer(bytes(got[pos:pos + m * n * 4]), dtype="<i4").astype(np.int64)
        pos += m * n * 4
        y = vals.reshape(n // rows, m, rows).transpose(1, 0, 2).reshape(m, n)
        q = qw.q
        if (i, "weights") in sabotage:
            q = q.copy()
            q[-1, 0] = 7 if q[-1, 0] != 7 else -8
        want = gemm(xq, x_m, x_e, q, qw.m, qw.e, bias, group)
        mismatches.append(int(np.count_nonzero(y != want)))
    return {"name": seq["name"], "jobs": seq["jobs"], "cycles": cycles, "first_out": first_out,
            "steps_at_first_out": steps_at_first, "x_bytes": x_bytes, "w_bytes": w_bytes,
            "steps": diff["steps"], "status": diff, "mismatches": mismatches,
            "planned_steps": sum(j["m"] * (j["k"] // lanes) * (j["n"] // rows)
                                 for j in seq["jobs"]),
            "planned_bad_jobs": 0}


@cocotb.test()
async def gemm_sequences(dut):
    p = bench_params()
    tb = TB(dut, p)
    cocotb.start_soon(tb.count())
    dut.rst.value = 1
    for _ in range(3):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    results = []
    sab = p.get("sabotage") or []
    for si, seq in enumerate(p["sequences"]):
        budget = 20_000 + 4 * sum(j["m"] * (j["k"] // p["lanes"] + 40) * (j["n"] // p["rows"]) +
                                  j["n"] * j["k"] // 16 + j["m"] * j["k"] // 16
                                  for j in seq["jobs"])
        res = await with_timeout(
            run_sequence(tb, seq, p, {(s["job"], s["kind"]) for s in sab
                                      if s["sequence"] == si}),
            budget * CLOCK_NS, "ns")
        results.append(res)
    if p.get("out"):
        with open(p["out"], "w") as f:
            json.dump(results, f)
    for r in results:
        assert not any(r["mismatches"]), f"{r['name']}: mismatches per job {r['mismatches']}"
        st = r["status"]
        assert st["bad_jobs"] == r["planned_bad_jobs"], f"{r['name']}: status {st}"
        assert st["jobs_done"] == st["jobs"] == len(r["jobs"]), f"{r['name']}: status {st}"
        assert r["steps"] == r["planned_steps"], f"{r['name']}: {r['steps']} steps"
