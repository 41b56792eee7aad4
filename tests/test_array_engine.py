"""amaranth.sim tests of the attention engine on the arrays (issue #33,
mcf.hdl.compute.array_engine) where it differs from AttentionEngine: malformed K blocks
(completed or cut, one count per block) and rejected jobs, the jobs after them exact; and its
cycles at the kr260 shape (slow). The tests both engines pass with the same words — decode
states, causal normalised prefill, MAX, FIXED (violations counted), empty shards, GQA up to
6:1, a malformed V block — are ``tests/test_attention_hdl.py``'s, run on both (``ENGINES``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_attention_hdl import FX, MX, D, L, S, T, array_engine, run_engine

from mcf.hdl.compute.array_engine import ArrayEngine
from mcf.sim.attention_jobs import (
    expected_words,
    job_k_words,
    k_words,
    make_jobs,
)


def test_malformed_k_blocks_counted_and_recover():
    """K blocks with a partial row (completed, masked: no score; its V row weighs 0) and with
    more rows than max_block (cut there, and its V block too): one count per malformed K or V
    block, the blocks' results those of the well-formed rows, the following jobs exact."""
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
