"""Cycle measurement of the attention engine (used by scripts/bench_attention.py): jobs run back
to back at full rate (no idle, no backpressure); cycles from the first job's submission to each
job's last output beat, written as JSON to ``params["out"]``. Outputs are still checked against
the golden model."""

from __future__ import annotations

import json

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge

from mcf.abi.kv import AttnMode
from mcf.golden.attention import random_blocks, random_query
from mcf.sim import bench_params
from mcf.sim.benches.attention_common import Job, expected_words
from mcf.sim.benches.attention_engine import TB, D, T

P = bench_params()


async def _count(dut, box):
    while True:
        await RisingEdge(dut.clk)
        box[0] += 1


async def _measure(tb, jobs):
    box = [0]
    task = cocotb.start_soon(_count(tb.dut, box))
    for job in jobs:
        tb.submit(job)
    for job in jobs:
        got = await tb.result(job)
        assert got == expected_words(job)
    cycles = box[0]
    task.cancel()
    return cycles


@cocotb.test()
async def perf(dut):
    tb = TB(dut)
    await tb.reset()
    rng = np.random.default_rng(5)
    n_blocks = P.get("blocks", 4)
    out = {}
    for heads in P.get("heads", [6, 2]):
        # decode: one query, n_blocks full blocks of the local shard
        blocks = random_blocks(rng, [T] * n_blocks, D)
        q, sq = random_query(rng, heads, D)
        dec = [Job(AttnMode.SINGLE, q, sq, blocks)]
        keys = T * n_blocks
        out[f"decode_g{heads}"] = {"cycles": await _measure(tb, dec), "pairs": keys * heads,
                                   "mac_cycles": keys * heads * 2 * (D // tb_lanes())}
        # prefill: a slice of query tokens of the last chunk (causal, normalised output)
        pjobs = []
        first = int(blocks[-1].pos[0])
        pairs = 0
        for q_pos in (first + T // 4, first + T // 2, first + T - 1):
            q, sq = random_query(rng, heads, D)
            pjobs.append(Job(AttnMode.SINGLE, q, sq, blocks, normalize=True, causal=True,
                             q_pos=q_pos))
            pairs += (q_pos + 1) * heads
        streamed = len(pjobs) * keys * heads
        # masked (future) keys are passed unscored, so useful work is the visible pairs
        out[f"prefill_g{heads}"] = {"cycles": await _measure(tb, pjobs), "pairs": pairs,
                                    "streamed_pairs": streamed,
                                    "mac_cycles": pairs * 2 * (D // tb_lanes())}
    with open(P["out"], "w") as f:
        json.dump(out, f)


def tb_lanes() -> int:
    return P.get("lanes", 16)
