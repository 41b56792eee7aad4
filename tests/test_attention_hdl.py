"""Attention engine (amaranth.sim, small configuration) bit-exact against the golden model:
every mode, GQA, causal mask, empty shards, malformed input counted (paper §5)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from mcf.abi.kv import AttnMode, to_act
from mcf.abi.kv_channel import KVFormat
from mcf.golden.attention import KVChannelBlock, attend_fixed, attend_max, random_query
from mcf.hdl.compute.array_engine import ArrayEngine
from mcf.hdl.compute.attention import AttentionEngine
from mcf.sim.attention_drive import drive_engine
from mcf.sim.attention_jobs import (
    Job,
    expected_ends,
    expected_words,
    job_k_words,
    k_words,
    kh_words,
    make_jobs,
    v_words,
)

D, L, G, T, DW = 16, 4, 6, 16, 64


def run_engine(jobs, *, idle=0.0, backpressure=0.0, seed=0, k_override=None, v_override=None,
               max_cycles=200000, n_outputs=None, merge_lanes=None, score_slots=3, cycles=None,
               kh_words=None, geometry=None, make=None, **engine_kw):
    """``jobs`` through an engine in :func:`mcf.sim.attention_drive.drive_engine`: ``make``
    builds another engine with AttentionEngine's streams from ``(head_dim, lanes, max_heads,
    max_block, data_width)`` (default: AttentionEngine with the other arguments). Returns
    ``(words, ends), status``; ``cycles`` gets the cycle of the last payload's end."""
    d, lanes, g, t = geometry or (D, L, G, T)
    if make is None:
        dut = AttentionEngine(head_dim=d, lanes=lanes, max_heads=g, max_block=t, data_width=DW,
                              merge_lanes=merge_lanes, score_slots=score_slots, **engine_kw)
    else:
        dut = make(d, lanes, g, t, DW)
    run = drive_engine(dut, jobs, max_heads=g, lanes=lanes, data_width=DW, idle=idle,
                       backpressure=backpressure, seed=seed, k_override=k_override,
                       v_override=v_override, kh_words=kh_words, max_cycles=max_cycles,
                       n_outputs=n_outputs)
    if cycles is not None and not run.timed_out:
        cycles.append(run.end_cycles[-1])
    return (run.words, run.ends), run.status


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


def array_engine(d, lanes, g, t, dw):
    """:class:`~mcf.hdl.compute.array_engine.ArrayEngine` — the same streams and words on the
    arrays — in the small geometry, on 4 arrays of 8 keys × 4 lanes (16-key tiles)."""
    return ArrayEngine(head_dim=d, lanes=lanes, max_heads=g, max_block=t, data_width=dw,
                       keys=4, arr_lanes=4, arrays=4, array_rows=8)


ENGINES = pytest.mark.parametrize("make", [None, array_engine], ids=["vector", "arrays"])
"""The tests both engines pass with the same words (``make`` of :func:`run_engine`)."""


@pytest.mark.parametrize("merge_lanes,make", [(1, None), (L, None), (None, array_engine)],
                         ids=["vector1", f"vector{L}", "arrays"])
def test_decode_states_gqa_unequal_and_empty_shards(merge_lanes, make):
    jobs = make_jobs(1, D, T, [
        (S, 6, [16, 3, 9], {}),
        (S, 2, [], {}),                       # empty shard
        (S, 2, [1], {}),
        (S, 1, [16, 16], {"peaked": True}),
    ])
    status = check(jobs, idle=0.2, backpressure=0.3, seed=1, merge_lanes=merge_lanes,
                   make=make)
    assert status["jobs"] == 4 and status["blocks"] == 6
    assert status["err_rows"] == status["err_max"] == status["err_job"] == status["busy"] == 0


@ENGINES
def test_prefill_causal_normalized(make):
    jobs = make_jobs(2, D, T, [
        (S, 6, [8, 8, 5], {"normalize": True, "causal": True, "q_pos": 13}),
        (S, 2, [12, 4], {"normalize": True, "causal": True, "q_pos": 0}),
        (S, 2, [12, 4], {"normalize": True, "causal": True, "q_pos": 15, "pos0": 20}),  # masked
        (S, 2, [10], {"normalize": True}),
    ])
    check(jobs, backpressure=0.5, seed=2, make=make)


@ENGINES
@pytest.mark.parametrize("split", [1, 2, 3])
def test_two_phase_modes(split, make):
    configs = [
        (MX, 6, [5] * split, {}),
        (MX, 2, [], {}),
        (FX, 6, [15 // split] * split, {}),
        (FX, 2, [7, 1], {"causal": True, "q_pos": 3}),
        (FX, 2, [], {}),
        (S, 3, [16, 2], {}),                  # SINGLE after the two-phase jobs
    ]
    jobs = make_jobs(3 + split, D, T, configs)
    status = check(jobs, idle=0.1, seed=split, make=make)
    assert status["err_max"] == 0


@ENGINES
def test_fixed_mode_violation_counted(make):
    jobs = make_jobs(9, D, T, [(FX, 2, [6], {"m_delta": 300}), (FX, 6, [16, 9], {})])
    j = jobs[0]
    exp_bad = attend_fixed(j.q, j.sq, j.blocks, j.m_fix)[1]
    assert exp_bad > 0
    status = check(jobs, make=make)
    assert status["err_max"] == exp_bad


@ENGINES
def test_malformed_v_block_counted_and_recovers(make):
    """A V block missing one row is processed as far as it goes (the engine on the arrays
    completes it with a zero row) and counted; the next job is still exact."""
    jobs = make_jobs(10, D, T, [(S, 2, [4], {}), (S, 2, [3], {})])
    bad = v_words(jobs[0].blocks[0], L)
    bad = bad[:-(D // L) - 1] + [bad[-1]]          # drop one V row but keep the `last` beat
    words = bad + v_words(jobs[1].blocks[0], L)
    (got, ends), status = run_engine(jobs, v_override=words, make=make)
    assert status["err_rows"] >= 1 and status["jobs"] == 2
    assert got[ends[1]:] == expected_words(jobs[1])


def test_malformed_k_blocks_counted_and_recover():
    """K blocks with a partial row and with more rows than max_block: processed as far as they
    are well-formed, counted, and the following jobs are exact."""
    jobs = make_jobs(12, D, T, [(S, 2, [4], {}), (S, 2, [T + 2], {}), (S, 2, [3], {}),
                                (FX, 2, [5], {})])
    partial = k_words(jobs[0].blocks[0], L)
    partial = partial[:-2] + [partial[-1]]         # the last row lacks a beat
    kw = partial + [w for j in jobs[1:] for w in job_k_words(j, L)]
    (got, ends), status = run_engine(jobs, k_override=kw)
    # job 0: the partial row is counted and has no score, its V row is skipped and the V row
    # count mismatch counted; job 1: the 2 rows beyond max_block are counted and not scored
    assert status["err_rows"] == 1 + 1 + 2 and status["jobs"] == 4
    trimmed = [replace(jobs[0], blocks=[jobs[0].blocks[0].slice(0, 3)]),
               replace(jobs[1], blocks=[jobs[1].blocks[0].slice(0, T)]), jobs[2], jobs[3]]
    assert got == [w for j in trimmed for w in expected_words(j)]


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


@pytest.mark.parametrize("score_slots", [2, 3])
def test_banks_overlap(score_slots):
    """Decode and causal prefill jobs back to back: exact, and the QK and PV banks work at the
    same time — the run takes well under the sum of both banks' work (one (beat, head) pair per
    cycle each: heads · head_dim/lanes cycles per visible key and bank)."""
    causal = {"normalize": True, "causal": True}
    jobs = make_jobs(31, D, T, [
        (S, 6, [T] * 4, {}),
        (S, 6, [T] * 4, {**causal, "q_pos": 3 * T + 4}),
        (S, 6, [T] * 4, {**causal, "q_pos": 4 * T - 1}),
        (FX, 6, [T] * 4, {}),
    ])
    cycles = []
    status = check(jobs, cycles=cycles, score_slots=score_slots)
    assert status["jobs"] == 4 and status["err_rows"] == status["err_max"] == 0
    visible = 3 * 4 * T + (3 * T + 5)
    work = visible * 6 * (D // L)            # per bank
    assert cycles[0] < 1.35 * work           # sequential phases would take over 2 · work


GRP = 4     # per-channel K groups of 4 rows in the small configuration


def channel_jobs(seed, configs):
    """Jobs over per-channel-K blocks (groups of GRP rows, outlier K channels)."""
    rng = np.random.default_rng(seed)
    jobs = []
    for mode, heads, lens, kw in configs:
        kw = dict(kw)
        pos = kw.pop("pos0", 0)
        blocks = []
        for n in lens:
            kf = rng.normal(0.0, 1.0, (n, D))
            kf[:, :2] *= 8.0
            blk = KVChannelBlock.quantize(to_act(kf), to_act(rng.normal(0.0, 1.0, (n, D))),
                                          np.arange(pos, pos + n), group=GRP)
            blocks.append(blk)
            pos += n
        q, sq = random_query(rng, heads, D, sigma=1.5)
        job = Job(mode, q, sq, blocks, **kw)
        if mode == FX:
            job.m_fix = attend_max(q, sq, blocks, job.q_pos, job.causal)
        jobs.append(job)
    return jobs


def test_per_channel_k_all_modes():
    """PER_CHANNEL_K: the header of every group of GRP rows is folded into each head's query
    (fold_query) and the group scored by the per-token path: bit-exact with the golden model in
    every mode, causal prefill, partial last groups, a rejected job's headers dropped."""
    causal = {"normalize": True, "causal": True}
    jobs = channel_jobs(51, [
        (S, 6, [T, 7], {}),
        (S, 2, [T, T, 9], {**causal, "q_pos": 2 * T + 5}),
        (MX, 6, [10, 3], {}),
        (FX, 6, [10, 3], {}),
        (S, 7, [6, 5], {}),                   # rejected: query, K, headers and V dropped
        (FX, 2, [], {}),
        (S, 1, [5], {"normalize": True}),
    ])
    good = [j for j in jobs if j.heads <= G]
    hdr = [w for j in jobs for b in j.blocks for w in kh_words(b, L, GRP)]
    (words, ends), status = run_engine(jobs, kh_words=hdr, n_outputs=sum(
        len(expected_ends(j)) for j in good), backpressure=0.3, seed=5,
        kv_format=KVFormat.PER_CHANNEL_K, kv_group=GRP)
    assert words == [w for j in good for w in expected_words(j)]
    assert status["jobs"] == len(good) and status["err_job"] == 1
    assert status["err_rows"] == status["err_max"] == 0


@pytest.mark.slow
def test_per_channel_k_full_geometry():
    """PER_CHANNEL_K at the Qwen2.5-1.5B geometry (head_dim 128, 16 lanes, GQA 6:1, blocks of
    256, groups of KV_GROUP = 32, outlier K channels): bit-exact, and the fold's cost against the
    same jobs over per-token blocks (~75 s each in amaranth.sim).

        pytest -m slow tests/test_attention_hdl.py -k full_geometry
    """
    from mcf.abi.kv_channel import KV_GROUP
    from mcf.golden.attention import random_blocks

    d, lanes, g, t = 128, 16, 6, 256
    rng = np.random.default_rng(61)
    cycles = {}
    for fmt in (KVFormat.PER_TOKEN, KVFormat.PER_CHANNEL_K):
        jobs = []
        for _ in range(3):
            q, sq = random_query(rng, g, d)
            if fmt == KVFormat.PER_CHANNEL_K:
                blocks = []
                for b in range(2):
                    kf = rng.normal(0.0, 1.0, (t, d))
                    kf[:, :4] *= 8.0
                    blocks.append(KVChannelBlock.quantize(
                        to_act(kf), to_act(rng.normal(0.0, 1.0, (t, d))),
                        np.arange(b * t, (b + 1) * t)))
            else:
                blocks = random_blocks(rng, [t, t], d)
            jobs.append(Job(S, q, sq, blocks))
        kw = {}
        if fmt == KVFormat.PER_CHANNEL_K:
            kw = {"kv_format": fmt, "kh_words": [w for j in jobs for b in j.blocks
                                                  for w in kh_words(b, lanes, KV_GROUP)]}
        cyc = []
        (words, _), status = run_engine(jobs, cycles=cyc, max_cycles=400000,
                                        geometry=(d, lanes, g, t), **kw)
        assert words == [w for j in jobs for w in expected_words(j)]
        assert status["jobs"] == 3 and status["err_rows"] == 0
        cycles[fmt] = cyc[0]
    # the fold (≈ 9 % of the QK work per 32-row group) is partly hidden by the QK side's lead
    assert cycles[KVFormat.PER_CHANNEL_K] < 1.06 * cycles[KVFormat.PER_TOKEN]
