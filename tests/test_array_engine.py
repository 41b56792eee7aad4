"""amaranth.sim tests of the attention engine on the arrays (issue #33,
mcf.hdl.compute.array_engine): :class:`ArrayEngine` takes AttentionEngine's jobs, query beats
and K/V blocks and must emit its words bit for bit in every mode — decode states, causal
normalised prefill, MAX, FIXED (violations counted), empty shards, GQA up to 6:1 — against the
golden model (:mod:`mcf.golden.attention` through ``tests/test_attention_hdl.py``'s harness),
under random idle input and output backpressure; malformed blocks and rejected jobs are
counted and the jobs after them stay exact."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_attention_hdl import FX, MX, D, L, S, T, check, run_engine

from mcf.golden.attention import attend_fixed
from mcf.hdl.compute.array_engine import ArrayEngine
from mcf.sim.benches.attention_common import (
    expected_words,
    job_k_words,
    k_words,
    make_jobs,
    v_words,
)


def array_engine(d, lanes, g, t, dw):
    """The small geometry on 4 arrays of 8 keys × 4 lanes (16-key tiles: ``max_block``)."""
    return ArrayEngine(head_dim=d, lanes=lanes, max_heads=g, max_block=t, data_width=dw,
                       keys=4, arr_lanes=4, arrays=4, array_rows=8)


def test_decode_states_gqa_unequal_and_empty_shards():
    jobs = make_jobs(1, D, T, [
        (S, 6, [16, 3, 9], {}),
        (S, 2, [], {}),                       # empty shard
        (S, 2, [1], {}),
        (S, 1, [16, 16], {"peaked": True}),
    ])
    status = check(jobs, idle=0.2, backpressure=0.3, seed=1, make=array_engine)
    assert status["jobs"] == 4 and status["blocks"] == 6
    assert status["err_rows"] == status["err_max"] == status["err_job"] == 0
    assert status["busy"] == 0


def test_prefill_causal_normalized():
    jobs = make_jobs(2, D, T, [
        (S, 6, [8, 8, 5], {"normalize": True, "causal": True, "q_pos": 13}),
        (S, 2, [12, 4], {"normalize": True, "causal": True, "q_pos": 0}),
        (S, 2, [12, 4], {"normalize": True, "causal": True, "q_pos": 15, "pos0": 20}),  # masked
        (S, 2, [10], {"normalize": True}),
    ])
    check(jobs, backpressure=0.5, seed=2, make=array_engine)


@pytest.mark.parametrize("split", [1, 3])
def test_two_phase_modes(split):
    configs = [
        (MX, 6, [5] * split, {}),
        (MX, 2, [], {}),
        (FX, 6, [15 // split] * split, {}),
        (FX, 2, [7, 1], {"causal": True, "q_pos": 3}),
        (FX, 2, [], {}),
        (S, 3, [16, 2], {}),
    ]
    jobs = make_jobs(3 + split, D, T, configs)
    status = check(jobs, idle=0.1, seed=split, make=array_engine)
    assert status["err_max"] == 0 and status["jobs"] == 6


def test_fixed_mode_violation_counted():
    jobs = make_jobs(9, D, T, [(FX, 2, [6], {"m_delta": 300}), (FX, 6, [16, 9], {})])
    j = jobs[0]
    exp_bad = attend_fixed(j.q, j.sq, j.blocks, j.m_fix)[1]
    assert exp_bad > 0
    status = check(jobs, make=array_engine)
    assert status["err_max"] == exp_bad


def test_malformed_v_block_counted_and_recovers():
    """A V block missing one row is completed with a zero row and counted; the next job is
    still exact."""
    jobs = make_jobs(10, D, T, [(S, 2, [4], {}), (S, 2, [3], {})])
    bad = v_words(jobs[0].blocks[0], L)
    bad = bad[:-(D // L) - 1] + [bad[-1]]          # drop one V row but keep the `last` beat
    words = bad + v_words(jobs[1].blocks[0], L)
    (got, ends), status = run_engine(jobs, v_override=words, make=array_engine)
    assert status["err_rows"] == 1 and status["jobs"] == 2
    assert got[ends[1]:] == expected_words(jobs[1])


def test_malformed_k_blocks_counted_and_recover():
    """K blocks with a partial row (completed, masked: no score; its V row weighs 0) and with
    more rows than max_block (cut there, and its V block too): one count per malformed K or V
    block, the blocks' results
    those of the well-formed rows, the following jobs exact."""
    jobs = make_jobs(12, D, T, [(S, 2, [4], {}), (S, 2, [T + 2], {}), (S, 2, [3], {}),
                                (FX, 2, [5], {}), (MX, 3, [4], {})])
    partial = k_words(jobs[0].blocks[0], L)
    partial = partial[:-2] + [partial[-1]]         # the last row lacks a beat
    last = k_words(jobs[4].blocks[0], L)
    last = last[:-2] + [last[-1]]
    kw = (partial + [w for j in jobs[1:4] for w in job_k_words(j, L)] + last)
    (got, ends), status = run_engine(jobs, k_override=kw, make=array_engine)
    # the partial rows of jobs 0 and 4; job 1's K block and its V block, both cut
    assert status["err_rows"] == 4 and status["jobs"] == 5
    trimmed = [replace(jobs[0], blocks=[jobs[0].blocks[0].slice(0, 3)]),
               replace(jobs[1], blocks=[jobs[1].blocks[0].slice(0, T)]), jobs[2], jobs[3],
               replace(jobs[4], blocks=[jobs[4].blocks[0].slice(0, 3)])]
    assert got == [w for j in trimmed for w in expected_words(j)]


def test_bad_job_dropped_and_counted():
    """heads = 0, heads > max_heads and a MAX job with heads > max_heads (no V blocks): the
    job, its query and its blocks are dropped and counted; the good jobs are exact."""
    jobs = make_jobs(11, D, T, [(S, 2, [5], {}), (S, 7, [3, 2], {}), (S, 2, [4], {}),
                                (S, 2, [2], {}), (MX, 7, [3], {}), (FX, 1, [4], {})])
    jobs[3].q = jobs[3].q[:0]                       # heads = 0: no query beats
    jobs[3].sq = jobs[3].sq[:0]
    good = [jobs[0], jobs[2], jobs[5]]
    (got, ends), status = run_engine(jobs, n_outputs=5, idle=0.1, backpressure=0.2, seed=5,
                                     make=array_engine)
    assert got == [w for j in good for w in expected_words(j)] and len(ends) == 5
    assert status["err_job"] == 3 and status["jobs"] == 3 and status["busy"] == 0


@pytest.mark.slow
def test_kr260_geometry_decode_cycles():
    """The kr260 node's engine shape (head_dim 128, 32 lanes in, GQA 6:1, blocks of 256) on the
    GEMM's 4 arrays of 16 × 16: two decode jobs over 1,024 keys each, bit-exact; the cycles
    against AttentionEngine's on the same jobs printed (amaranth.sim, a few minutes).

        pytest -m slow -s tests/test_array_engine.py -k kr260
    """
    d, lanes, g, t = 128, 32, 6, 256
    jobs = make_jobs(71, d, t, [(S, 6, [t] * 4, {}), (S, 6, [t] * 4, {})])
    expect = [w for j in jobs for w in expected_words(j)]
    cycles = {}
    for name, make in (("arrays", lambda *a: ArrayEngine(
            head_dim=d, lanes=lanes, max_heads=g, max_block=t, data_width=a[4], keys=4,
            arr_lanes=16, arrays=4, array_rows=16)), ("engine", None)):
        cyc = []
        (words, _), status = run_engine(jobs, cycles=cyc, max_cycles=400000,
                                        geometry=(d, lanes, g, t), make=make)
        assert words == expect, name
        assert status["jobs"] == 2 and status["err_rows"] == 0
        cycles[name] = cyc[0]
    print(f"two decode jobs, 6 heads × 1,024 keys: arrays {cycles['arrays']} cycles, "
          f"AttentionEngine (32 lanes) {cycles['engine']} cycles")
