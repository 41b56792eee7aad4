"""Attention engine (amaranth.sim, small configuration) bit-exact against the golden model:
every mode, GQA, causal mask, empty shards, malformed input counted (paper §5)."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from mcf.abi.kv import AttnMode
from mcf.golden.attention import attend_fixed
from mcf.hdl.compute.attention import AttentionEngine
from mcf.sim.benches.attention_common import (
    expected_ends,
    expected_words,
    job_word,
    kv_words,
    make_jobs,
    q_words,
    words_from_beats,
)

D, L, G, T, DW = 16, 4, 6, 16, 64


def run_engine(jobs, *, idle=0.0, backpressure=0.0, seed=0, kv_override=None, max_cycles=200000,
               n_outputs=None, merge_lanes=None):
    dut = AttentionEngine(head_dim=D, lanes=L, max_heads=G, max_block=T, data_width=DW,
                          merge_lanes=merge_lanes)
    rng = np.random.default_rng(seed)
    beats = []
    n_expected = (sum(len(expected_ends(j)) for j in jobs) if n_outputs is None
                  else n_outputs)
    status = {}

    async def send(ctx, s, words):
        for w in words:
            while idle and rng.random() < idle:
                await ctx.tick()
            ctx.set(s.valid, 1)
            ctx.set(s.payload.as_value(), w)
            await ctx.tick().until(s.ready)
            ctx.set(s.valid, 0)

    async def tb_job(ctx):
        await send(ctx, dut.job, [job_word(j, G) for j in jobs])

    async def tb_q(ctx):
        await send(ctx, dut.q, [w for j in jobs for w in q_words(j, L)])

    async def tb_kv(ctx):
        if kv_override is not None:
            words = kv_override
        else:
            words = [w for j in jobs for b in j.blocks for w in kv_words(b, L, j.v_rows)]
        await send(ctx, dut.kv, words)

    async def tb_out(ctx):
        ends = 0
        for _ in range(max_cycles):
            ready = not (backpressure and rng.random() < backpressure)
            ctx.set(dut.o.ready, int(ready))
            data, keep, last, valid = (await ctx.tick().sample(
                dut.o.payload.data, dut.o.payload.keep, dut.o.payload.last, dut.o.valid))[2:]
            if valid and ready:
                beats.append((data, keep, last))
                ends += last
                if ends == n_expected:
                    break
        for _ in range(4):
            await ctx.tick()
        for name in ("jobs", "blocks", "err_rows", "err_max", "err_job", "busy"):
            status[name] = ctx.get(getattr(dut.status, name))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for tb in (tb_job, tb_q, tb_kv):
        sim.add_testbench(tb, background=True)
    sim.add_testbench(tb_out)
    sim.run()
    return words_from_beats(beats, DW), status


def check(jobs, **kw):
    (words, ends), status = run_engine(jobs, **kw)
    exp, exp_ends = [], []
    for j in jobs:
        exp_ends += [len(exp) + e for e in expected_ends(j)]
        exp += expected_words(j)
    assert ends == exp_ends
    for n, (a, b) in enumerate(zip(words, exp)):
        assert a == b, f"word {n}: got {a:#x} expected {b:#x}"
    assert len(words) == len(exp)
    return status


S, MX, FX = AttnMode.SINGLE, AttnMode.MAX, AttnMode.FIXED


@pytest.mark.parametrize("merge_lanes", [1, L])
def test_decode_states_gqa_unequal_and_empty_shards(merge_lanes):
    jobs = make_jobs(1, D, T, [
        (S, 6, [16, 3, 9], {}),
        (S, 2, [], {}),                       # empty shard
        (S, 2, [1], {}),
        (S, 1, [16, 16], {"peaked": True}),
    ])
    status = check(jobs, idle=0.2, backpressure=0.3, seed=1, merge_lanes=merge_lanes)
    assert status["jobs"] == 4 and status["blocks"] == 6
    assert status["err_rows"] == status["err_max"] == status["err_job"] == 0


def test_prefill_causal_normalized():
    jobs = make_jobs(2, D, T, [
        (S, 6, [8, 8, 5], {"normalize": True, "causal": True, "q_pos": 13}),
        (S, 2, [12, 4], {"normalize": True, "causal": True, "q_pos": 0}),
        (S, 2, [12, 4], {"normalize": True, "causal": True, "q_pos": 15, "pos0": 20}),  # masked
        (S, 2, [10], {"normalize": True}),
    ])
    check(jobs, backpressure=0.5, seed=2)


@pytest.mark.parametrize("split", [1, 2, 3])
def test_two_phase_modes(split):
    configs = [
        (MX, 6, [5] * split, {}),
        (MX, 2, [], {}),
        (FX, 6, [15 // split] * split, {}),
        (FX, 2, [7, 1], {"causal": True, "q_pos": 3}),
        (FX, 2, [], {}),
    ]
    jobs = make_jobs(3 + split, D, T, configs)
    jobs[1].v_rows = False
    status = check(jobs, idle=0.1, seed=split)
    assert status["err_max"] == 0


def test_fixed_mode_violation_counted():
    jobs = make_jobs(9, D, T, [(FX, 2, [6], {"m_delta": 300})])
    j = jobs[0]
    exp_bad = attend_fixed(j.q, j.sq, j.blocks, j.m_fix)[1]
    assert exp_bad > 0
    status = check(jobs)
    assert status["err_max"] == exp_bad


def test_malformed_block_counted_and_recovers():
    """A block whose V rows are missing one row is processed as far as it goes and counted;
    the next job is still exact."""
    jobs = make_jobs(10, D, T, [(S, 2, [4], {}), (S, 2, [3], {})])
    bad = kv_words(jobs[0].blocks[0], L)
    bad = bad[:-(D // L) - 1] + [bad[-1]]          # drop one V row but keep the `last` beat
    words = bad + kv_words(jobs[1].blocks[0], L)
    (got, ends), status = run_engine(jobs, kv_override=words)
    assert status["err_rows"] >= 1 and status["jobs"] == 2
    assert got[ends[1]:] == expected_words(jobs[1])


def test_bad_job_dropped_and_counted():
    """heads = 0 and heads > max_heads: the job, its query and its blocks are dropped and
    counted; the surrounding good jobs are exact."""
    jobs = make_jobs(11, D, T, [(S, 2, [5], {}), (S, 7, [3, 2], {}), (S, 2, [4], {}),
                                (S, 2, [2], {})])
    jobs[3].q = jobs[3].q[:0]                       # heads = 0: no query beats
    jobs[3].sq = jobs[3].sq[:0]
    good = [jobs[0], jobs[2]]
    dut_words = []
    (got, ends), status = run_engine(jobs, n_outputs=4)
    for j in good:
        dut_words += expected_words(j)
    assert got == dut_words and len(ends) == 4
    assert status["err_job"] == 2 and status["jobs"] == 2 and status["busy"] == 0
