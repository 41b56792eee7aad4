"""Cycle measurement of the attention engine for :mod:`mcf.sim.perf.attention`: per case, jobs
run back to back at full rate (no idle, no backpressure); cycles from the first submission to the
case's last output beat. Every output is compared with the golden model and the status counters
are read after each case; mismatches and counters are reported in the JSON written to
``params["out"]`` (the host side refuses the figures), not asserted here, so a bad case cannot
hide behind a failed simulation.

Case parameters (``params["cases"]``, a list): ``name``, ``kind`` (``decode``: ``jobs`` jobs over
``blocks`` full blocks each, state output; ``prefill``: query tokens at ``q_offsets`` of the last
chunk over ``blocks`` full blocks, causal, ``o/l``; ``two_phase``: a MAX job and a FIXED job over
the same ``blocks``), ``heads``, and optionally ``fault`` (``"expected"``: the expectation of the
first measured job is corrupted; ``"bad_job"``: a job with ``heads = 0`` is sent before the
measured jobs). Every case is framed by warm-up jobs before and cool-down jobs after the measured
jobs (a SINGLE job over ``blocks`` full blocks; for ``two_phase`` a MAX and a FIXED job, so that
the QK bank's lead is the same at both ends): ``steady_cycles`` run from the last warm-up job's
last output beat to the last measured job's last output beat, so that both ends of the window see
the same full pipeline; ``cycles`` from the first submission to the very last beat.
"""

from __future__ import annotations

import json

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge, with_timeout

from mcf.abi.kv import AttnMode
from mcf.golden.attention import attend_max, random_blocks, random_query
from mcf.sim import bench_params
from mcf.sim.attention_jobs import Job, expected_words
from mcf.sim.benches.attention_engine import TB, D, T

P = bench_params()


def case_jobs(case: dict, rng) -> tuple[list[Job], dict]:
    """The case's jobs and their useful work: visible (query, key, head) pairs for the QK and
    the PV bank."""
    heads, n_blocks = case["heads"], case["blocks"]
    jobs, qk_pairs, pv_pairs = [], 0, 0
    frame, frame_qk, frame_pv = [], 0, 0
    for _ in range(2):
        q, sq = random_query(rng, heads, D)
        blocks = random_blocks(rng, [T] * n_blocks, D)
        if case["kind"] == "two_phase":
            frame.append([Job(AttnMode.MAX, q, sq, blocks),
                          Job(AttnMode.FIXED, q, sq, blocks, m_fix=attend_max(q, sq, blocks))])
            frame_qk += 2 * T * n_blocks * heads
        else:
            frame.append([Job(AttnMode.SINGLE, q, sq, blocks)])
            frame_qk += T * n_blocks * heads
        frame_pv += T * n_blocks * heads
    if case["kind"] == "decode":
        for _ in range(case.get("jobs", 1)):
            blocks = random_blocks(rng, [T] * n_blocks, D)
            q, sq = random_query(rng, heads, D)
            jobs.append(Job(AttnMode.SINGLE, q, sq, blocks))
            qk_pairs += T * n_blocks * heads
        pv_pairs = qk_pairs
    elif case["kind"] == "prefill":
        blocks = random_blocks(rng, [T] * n_blocks, D)
        first = int(blocks[-1].pos[0])
        for off in case["q_offsets"]:
            q, sq = random_query(rng, heads, D)
            q_pos = first + off
            jobs.append(Job(AttnMode.SINGLE, q, sq, blocks, normalize=True, causal=True,
                            q_pos=q_pos))
            qk_pairs += (q_pos + 1) * heads       # causally visible pairs
        pv_pairs = qk_pairs
    elif case["kind"] == "two_phase":
        blocks = random_blocks(rng, [T] * n_blocks, D)
        q, sq = random_query(rng, heads, D)
        jobs.append(Job(AttnMode.MAX, q, sq, blocks))
        jobs.append(Job(AttnMode.FIXED, q, sq, blocks, m_fix=attend_max(q, sq, blocks)))
        qk_pairs = 2 * T * n_blocks * heads
        pv_pairs = T * n_blocks * heads
    else:
        raise ValueError(f"unknown case kind {case['kind']!r}")
    return [*frame[0], *jobs, *frame[1]], {
        "qk_pairs": frame_qk + qk_pairs, "pv_pairs": frame_pv + pv_pairs,
        "steady_qk_pairs": qk_pairs, "steady_pv_pairs": pv_pairs,
        "warm_jobs": len(frame[0]), "measured_jobs": len(jobs)}


async def _count(dut, box):
    while True:
        await RisingEdge(dut.clk)
        box[0] += 1


async def _measure(tb, jobs, expected, limit_cycles):
    """Cycle at which each job's output completed (rejected jobs: none), and the number of jobs
    whose words differ."""
    box = [0]
    task = cocotb.start_soon(_count(tb.dut, box))
    for job in jobs:
        tb.submit(job)
    bad = 0
    timed_out = False
    done = []
    for job, exp in zip(jobs, expected):
        if exp is None:             # a job the engine must reject: no output
            continue
        try:
            got = await with_timeout(tb.result(job), limit_cycles * 10, "ns")
        except cocotb.triggers.SimTimeoutError:
            timed_out = True
            break
        bad += got != exp
        done.append(box[0])
    task.cancel()
    return done, bad, timed_out


@cocotb.test()
async def perf(dut):
    tb = TB(dut)
    await tb.reset()
    rng = np.random.default_rng(P.get("seed", 5))
    out = {}
    for case in P["cases"]:
        jobs, work = case_jobs(case, rng)
        expected = [expected_words(j) for j in jobs]
        fault = case.get("fault")
        w = work["warm_jobs"]
        if fault == "expected":
            expected[w] = [expected[w][0] ^ 1, *expected[w][1:]]
        elif fault == "bad_job":
            bad = Job(AttnMode.SINGLE, jobs[0].q[:0], jobs[0].sq[:0], [])
            jobs, expected = [*jobs[:w], bad, *jobs[w:]], [*expected[:w], None, *expected[w:]]
        elif fault is not None:
            raise ValueError(f"unknown fault {fault!r}")
        before = tb.status()
        limit = 40 * sum(len(j.blocks) * T * D // tb_lanes() * max(j.heads, 1) + 2000
                         for j in jobs)
        done, bad_jobs, timed_out = await _measure(tb, jobs, expected, limit)
        for _ in range(20):
            await RisingEdge(dut.clk)
        after = tb.status()
        out[case["name"]] = {
            **work, "cycles": done[-1] if done else 0,
            "steady_cycles": (done[w + work["measured_jobs"] - 1] - done[w - 1]
                              if len(done) == len(jobs) else 0),
            "jobs": len(jobs), "mismatched_jobs": int(bad_jobs),
            "timed_out": timed_out,
            "counters": {k: after[k] - before[k] for k in ("err_rows", "err_max", "err_job")},
            "completed": after["jobs"] - before["jobs"],
            "busy": after["busy"],
        }
        if timed_out:
            break
    with open(P["out"], "w") as f:
        json.dump(out, f)


def tb_lanes() -> int:
    return P.get("lanes", 16)
