"""Golden attention model: ABI formats, single-pass = in-order merge, two-phase split invariance,
accuracy against float64 (paper §4 end, §5)."""

from __future__ import annotations

import numpy as np
import pytest

from mcf.abi.kv import (
    ATTN_OUT,
    KV_SCALE,
    dequantize,
    dequantize_q,
    kv_token_bytes,
    pack_kv_block,
    quantize_kv_float,
    quantize_kv_rows,
    quantize_q,
    to_act,
    unpack_kv_block,
)
from mcf.abi.quant import ACT, requantize
from mcf.abi.softmax import (
    EXP_FRAC,
    M_EMPTY,
    NORM_OUT,
    SCORE_FRAC,
    merge_state,
    merge_states,
    pack_state,
    sum_states,
    unpack_state,
)
from mcf.golden.attention import (
    KVBlock,
    State,
    attend_fixed,
    attend_max,
    attend_single,
    block_state,
    float_attention,
    job_scores,
    normalize_state,
    random_blocks,
    random_query,
)

D = 128


def _heads_merge(states: list[State]) -> State:
    g = len(states[0].m)
    return State.from_heads([merge_states([s.head(h) for s in states]) for h in range(g)])


def _heads_sum(states: list[State]) -> State:
    g = len(states[0].m)
    out = []
    for h in range(g):
        acc = states[0].head(h)
        for s in states[1:]:
            acc = sum_states(acc, s.head(h))
        out.append(acc)
    return State.from_heads(out)


def test_kv_block_pack_roundtrip():
    rng = np.random.default_rng(1)
    (blk,) = random_blocks(rng, [5], 16)
    payload = pack_kv_block(blk.k, blk.sk, blk.v, blk.sv)
    assert len(payload) == 5 * kv_token_bytes(16)
    k, sk, v, sv = unpack_kv_block(payload, 16)
    assert np.array_equal(k, blk.k) and np.array_equal(v, blk.v)
    assert np.array_equal(sk, blk.sk) and np.array_equal(sv, blk.sv)
    with pytest.raises(ValueError):
        unpack_kv_block(payload[:-1], 16)


def test_quantize_kv_rows_matches_float_quantiser():
    """On-chip requantisation ACT → INT4 (reciprocal, no divider) stays within half an INT4 step
    (plus the reciprocal's 2^-14 relative error) of the exact value."""
    rng = np.random.default_rng(2)
    x = rng.normal(0, 2.0, (300, D)) * rng.uniform(0.01, 4.0, (300, 1))
    xa = to_act(x)
    k4, s4 = quantize_kv_rows(xa)
    assert k4.min() >= -8 and k4.max() <= 7
    ref = xa / (1 << ACT.frac)
    a = np.abs(ref).max(axis=1)
    exact = ref * 7 / a[:, None]
    assert np.all(np.abs(k4 - exact) <= 0.5 + 7 * 2.0 ** -14)
    s_exact = a / 7 * (1 << KV_SCALE.frac)
    assert np.all(np.abs(s4 - s_exact) <= 0.5 + 4e-6 * s_exact)   # 2^20/7 rounded: 2.9e-6
    zero4, zs = quantize_kv_rows(np.zeros((1, D), dtype=np.int64))
    assert not zero4.any() and zs[0] == 1


def test_attention_output_has_act_shape():
    """Prefill output feeds the next GEMM: the same 32-bit Q.16 code as mcf.abi.quant.ACT."""
    assert (ATTN_OUT.width, ATTN_OUT.frac, ATTN_OUT.signed) == (ACT.width, ACT.frac, ACT.signed)


def test_query_scale_is_the_vector_units():
    rng = np.random.default_rng(3)
    x = rng.normal(0, 3.0, (4, D))
    q, sq = quantize_q(x)
    q2, m, e = requantize(to_act(x))
    assert np.array_equal(q, q2) and np.array_equal(sq[:, 0], m) and np.array_equal(sq[:, 1], e)
    assert np.abs(dequantize_q(q, sq) - x).max() <= np.abs(x).max() / 127


def test_single_pass_is_in_order_merge_of_blocks():
    """The single pass over blocks equals merge_state folded over the per-block states, and a
    KV set split at arbitrary token boundaries into parts (one part per node, each its own
    block) merged in order gives the single-pass bits."""
    rng = np.random.default_rng(3)
    for trial in range(6):
        g = (6, 2, 1)[trial % 3]
        (kv,) = random_blocks(rng, [int(rng.integers(8, 300))], D)
        q, sq = random_query(rng, g, D)
        cuts = np.sort(rng.choice(np.arange(1, len(kv)), size=int(rng.integers(1, 6)),
                                  replace=False))
        parts = [kv.slice(lo, hi) for lo, hi in zip([0, *cuts], [*cuts, len(kv)])]
        single = attend_single(q, sq, parts)
        per_part = [attend_single(q, sq, [p]) for p in parts]
        assert _heads_merge(per_part) == single
        blocks = [block_state(*job_scores(q, sq, p), p) for p in parts]
        assert _heads_merge(blocks) == single
        # a node holding several blocks followed by nodes holding one block each
        first = attend_single(q, sq, parts[:2])
        assert _heads_merge([first, *per_part[2:]]) == single


def test_merge_order_matters_without_two_phase():
    """Documented limitation the two-phase mode removes: merge trees differ in rounding."""
    rng = np.random.default_rng(4)
    diffs = 0
    for _ in range(10):
        blocks = random_blocks(rng, [40, 40, 40], D)
        q, sq = random_query(rng, 2, D, sigma=2.0)
        left = attend_single(q, sq, blocks)
        right = _heads_merge([attend_single(q, sq, blocks[:1]),
                              attend_single(q, sq, blocks[1:])])
        diffs += left != right
    assert diffs > 0


@pytest.mark.parametrize("peaked", [False, True])
def test_two_phase_invariant_to_split_and_order(peaked):
    rng = np.random.default_rng(5 + peaked)
    for trial in range(4):
        g = 6 if trial % 2 else 2
        (kv,) = random_blocks(rng, [int(rng.integers(100, 400))], D)
        q, sq = random_query(rng, g, D, peak=kv if peaked else None,
                             peak_row=int(rng.integers(len(kv))))
        ref = None
        for n in (1, 2, 4, 8):
            owner = rng.integers(0, n, len(kv))          # random partition, not contiguous
            shards = []
            for node in range(n):
                idx = np.flatnonzero(owner == node)
                # each node cuts its shard into blocks of random sizes
                cuts = np.sort(rng.choice(np.arange(1, max(idx.size, 2)),
                                          size=min(2, max(idx.size - 1, 0)), replace=False))
                sl = [idx[a:b] for a, b in zip([0, *cuts], [*cuts, idx.size])]
                shards.append([KVBlock(kv.k[s], kv.sk[s], kv.v[s], kv.sv[s], kv.pos[s])
                               for s in sl if s.size])
            maxes = [attend_max(q, sq, sh) for sh in shards]
            m_glob = np.max(np.stack(maxes), axis=0)
            assert np.array_equal(m_glob, attend_max(q, sq, [kv]))
            states = [attend_fixed(q, sq, sh, m_glob)[0] for sh in shards]
            order = rng.permutation(n)
            total = _heads_sum([states[i] for i in order])
            assert _heads_sum(states) == total
            # SOFTMAX_MERGE of equal-m states is the same sum (no saturation here)
            assert _heads_merge([states[i] for i in order]) == total
            ref = total if ref is None else ref
            assert total == ref, f"split into {n} parts changed the bits"
        # and the two-phase result is the single pass against the global maximum
        assert np.array_equal(ref.m, attend_max(q, sq, [kv]))


def test_empty_shards():
    rng = np.random.default_rng(7)
    blocks = random_blocks(rng, [30], D)
    q, sq = random_query(rng, 2, D)
    empty = attend_single(q, sq, [])
    assert np.all(empty.m == M_EMPTY) and not empty.l.any() and not empty.o.any()
    full = attend_single(q, sq, blocks)
    assert _heads_merge([empty, full]) == full
    assert _heads_merge([full, empty]) == full
    assert np.all(attend_max(q, sq, []) == M_EMPTY)
    m = attend_max(q, sq, blocks)
    st, bad = attend_fixed(q, sq, [], m)
    assert bad == 0 and not st.l.any() and np.array_equal(st.m, m)


def test_fixed_mode_counts_max_violations():
    rng = np.random.default_rng(8)
    blocks = random_blocks(rng, [20], D)
    q, sq = random_query(rng, 2, D)
    m = attend_max(q, sq, blocks)
    _, bad = attend_fixed(q, sq, blocks, m)
    assert bad == 0
    _, bad = attend_fixed(q, sq, blocks, m - 1)
    assert bad >= 2     # at least the argmax key of each head


def test_causal_mask():
    rng = np.random.default_rng(9)
    blocks = random_blocks(rng, [16, 16], D, pos0=100)
    q, sq = random_query(rng, 6, D)
    qpos = 107
    causal = attend_single(q, sq, blocks, q_pos=qpos, causal=True)
    visible = [blocks[0].slice(0, qpos - 100 + 1)]
    assert causal == attend_single(q, sq, visible)
    none = attend_single(q, sq, blocks, q_pos=50, causal=True)
    assert np.all(none.m == M_EMPTY)


def test_state_payload_roundtrip():
    rng = np.random.default_rng(10)
    st = attend_single(*random_query(rng, 2, D), random_blocks(rng, [9], D))
    for h in range(2):
        m, l_sum, o = unpack_state(pack_state(*st.head(h)), D)
        assert m == st.m[h] and l_sum == st.l[h] and np.array_equal(o, st.o[h])


def _errors(peaked: bool, trials: int = 8):
    rng = np.random.default_rng(20 + peaked)
    out_err, l_rel, m_err = [], [], []
    for _ in range(trials):
        blocks = random_blocks(rng, [64] * 4, D)
        kv = KVBlock.concat(blocks)
        q, sq = random_query(rng, 6, D, peak=kv if peaked else None,
                             peak_row=int(rng.integers(len(kv))))
        st = attend_single(q, sq, blocks)
        out = normalize_state(st) / (1 << NORM_OUT.frac)
        ref, m_ref, l_ref, _ = float_attention(q, sq, blocks)
        vmax = np.abs(dequantize(kv.v, kv.sv, KV_SCALE)).max()
        out_err.append(np.abs(out - ref) / vmax)
        m_err.append(np.abs(st.m / (1 << SCORE_FRAC) - m_ref))
        l_rel.append(np.abs(st.l / (1 << EXP_FRAC) - l_ref) / l_ref)
    return (np.concatenate([e.ravel() for e in out_err]), np.concatenate(m_err),
            np.concatenate(l_rel))


@pytest.mark.parametrize("peaked", [False, True], ids=["random", "peaked"])
def test_accuracy_vs_float64(peaked):
    """Stated bounds (|out − ref| relative to max|v|; see docs/attention.md for the figures):
    max ≤ 2.5e-4, mean ≤ 5e-5; the maximum score within one 2^-8 step; l within 0.3 %."""
    out_err, m_err, l_rel = _errors(peaked)
    assert out_err.max() <= 2.5e-4, out_err.max()
    assert out_err.mean() <= 5e-5, out_err.mean()
    assert m_err.max() <= 2.0 ** -SCORE_FRAC
    assert l_rel.max() <= 3e-3


def test_merge_state_identity_with_empty():
    rng = np.random.default_rng(13)
    st = attend_single(*random_query(rng, 1, D), random_blocks(rng, [7], D))
    a = st.head(0)
    e = (np.int64(M_EMPTY), np.int64(0), np.zeros(D, dtype=np.int64))
    for got in (merge_state(e, a), merge_state(a, e)):
        assert got[0] == a[0] and got[1] == a[1] and np.array_equal(got[2], a[2])
    assert quantize_kv_float(np.zeros((1, D)))[1][0] == 1
