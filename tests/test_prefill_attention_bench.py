"""Prefill attention on the arrays, measured in RTL (issue #33; :func:`mcf.sim.perf.attention.
prefill_attention`, the bench ``mcf.sim.benches.tile_prefill_perf``): the MAC count's two
independent derivations, the tiled rate's records at a configuration's shape, and (slow: the
Verilator build of the kr260 NodeCompute takes tens of minutes the first time, a run a
few minutes) the reduced step on the real path — every row bit-exact, the MACs counted from the
causal mask, a figure reported (the refusal of a row off the golden model on the same build is
``tests/test_bench_attention_tiled.py``'s).

    pytest -m slow tests/test_prefill_attention_bench.py
"""

from __future__ import annotations

import pytest

from mcf.abi.attend import ATTEND_TILE_ROWS
from mcf.abi.node_config import KR260, SIM
from mcf.sim.perf import attention as bench
from mcf.sim.tile_records import causal_macs, schedule_macs


def _brute_force_macs(lens, tokens, heads, d):
    """One (query row, key) at a time: key ``j`` (position ``j``) is visible to the chunk's
    token ``i`` (position ``keys − tokens + i``) when ``j`` ≤ that position."""
    keys = sum(lens)
    n = 0
    for i in range(tokens):
        for j in range(keys):
            n += j <= keys - tokens + i
    return n * heads * 2 * d


@pytest.mark.parametrize("lens,tokens", [([4, 4], 3), ([32, 32, 12], 12), ([256, 256], 16),
                                         ([256] * 4, 256), ([64, 64, 64, 64, 256], 10)])
def test_causal_mac_count(lens, tokens):
    """The causal mask's count equals a pair-by-pair count and the tiled schedule's (the
    (query tile, block) pairs the hardware runs, their visibility masks); a hand value."""
    for heads, d in ((6, 128), (2, 32)):
        want = _brute_force_macs(lens, tokens, heads, d)
        assert causal_macs(lens, tokens, heads, d) == want
        assert schedule_macs(lens, tokens, heads, d, ATTEND_TILE_ROWS) == want
    assert causal_macs([4, 4], 3, 2, 1) == (6 + 7 + 8) * 2 * 2


def test_full_step_mac_count():
    """The full step at the kr260 shape: 256 tokens (positions 768..1023) × 6 heads
    against 1,024 keys: Σ (769 + i) visible keys, 256 MACs each."""
    lens, tokens = bench.prefill_shape(KR260)
    assert (lens, tokens) == ([256] * 4, 256)
    want = sum(769 + i for i in range(256)) * 6 * 256
    assert causal_macs(lens, tokens, 6, 128) == want == 352_518_144
    assert bench.prefill_shape(KR260, small=True) == ([256, 256], 16)


def test_tiled_plan():
    """At the sim shape the plan is the committed records themselves and the prefill step; at
    kr260 (small) the same records scaled to its blocks (256 keys) and query tile (10
    tokens of 6 heads)."""
    sim = bench.tiled_plan(SIM)
    assert [(n, lens, t) for n, lens, t, _ in sim] == [
        (n, list(lens), t) for n, lens, t in bench.TILED_FIT + bench.TILED_CHECK] + [
        ("step_t32_b32x4", [32] * 4, 32)]
    arr = bench.tiled_plan(KR260, small=True)
    assert [(n, lens, t) for n, lens, t, _ in arr] == [
        ("rows60_blocks1", [256], 10), ("rows60_blocks5", [64] * 4 + [256], 10),
        ("rows6_blocks1", [256], 1), ("rows6_blocks4", [256] * 4, 1),
        ("rows60_blocks4", [256] * 4, 10),
        ("t2_b64", [64], 2), ("t2_b64x4", [64] * 4, 2)]
    assert [r for *_, r in arr] == ["fit"] * 5 + ["check"] * 2


@pytest.mark.slow
def test_prefill_attention_small():
    """The reduced step (16 tokens × 6 heads against 2 blocks of 256 keys, the second the
    diagonal one) on the kr260 NodeCompute in Verilator: every row bit-exact (else
    BenchRefused), the MACs the causal mask's, a figure above 0 and below the peak."""
    got = bench.prefill_attention(KR260, small=True)
    print(f"\n{got}")
    assert got["rows"] == 96 and got["keys"] == 512 and got["tokens"] == 16
    assert got["macs"] == _brute_force_macs([256, 256], 16, 6, 128)
    assert got["macs"] <= got["scheduled_macs"] == 96 * 512 * 2 * 128
    assert got["macs_per_cycle_peak"] == KR260.macs_per_cycle == 1024
    assert got["cycles"] > 0
    assert 0 < got["prefill_attention_macs_per_cycle"] == round(got["macs"] / got["cycles"], 3)
    assert got["prefill_attention_macs_per_cycle"] <= got["macs_per_cycle_peak"]
    assert got["blocks_requested"] == 4                       # 2 query tiles × 2 blocks
