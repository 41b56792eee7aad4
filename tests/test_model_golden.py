"""mcf.golden.model: the integer end-to-end Qwen2 forward (bit-exact contract for the RTL).

Checks: determinism; chunked prefill = one prefill (chunks at block multiples); a single-mode
decode step = the same position of a longer prefill; two-phase decode independent of the KV
block split; fully masked blocks change nothing; the embedding lookup equals ACT of the
dequantised INT4 row; the error against the float reference, in three steps (activation
arithmetic, + INT4 KV, + INT4 weights), on three seeds; bad input. The per-channel-K KV format:
chunks at group multiples, two-phase decode split invariance, another format's bits."""

from __future__ import annotations

import numpy as np
import pytest

from mcf.abi.kv import KV_SCALE, dequantize, quantize_kv_float
from mcf.abi.kv_channel import KV_GROUP, KVFormat
from mcf.golden.attention import attend_single
from mcf.golden.model import IntModel, embed_codes, quantize_model
from mcf.golden.qwen_layer import layer_fixed
from mcf.model import TINY_MODEL, FloatModel, random_checkpoint
from mcf.quant import from_act, to_act

CFG = TINY_MODEL


@pytest.fixture(scope="module")
def qm():
    return quantize_model(CFG, random_checkpoint(CFG, 0))


def _prompt(seed, n=16):
    return np.random.default_rng(100 + seed).integers(0, CFG.vocab_size, n)


def test_deterministic(qm):
    a = IntModel(qm).generate(_prompt(0), 4)
    b = IntModel(qm).generate(_prompt(0), 4)
    assert np.array_equal(a.prompt_logits, b.prompt_logits)
    assert np.array_equal(a.step_logits, b.step_logits) and np.array_equal(a.tokens, b.tokens)
    assert a.prompt_logits.dtype == np.int64
    assert np.array_equal(a.step_logits[0], a.prompt_logits[-1])
    assert np.array_equal(a.tokens, a.step_logits.argmax(axis=1))


def test_chunked_prefill_equals_one_prefill(qm):
    one = IntModel(qm, block_tokens=8).generate(_prompt(1, 24), 2)
    chunked = IntModel(qm, block_tokens=8).generate(_prompt(1, 24), 2, chunk=8)
    assert np.array_equal(one.prompt_logits, chunked.prompt_logits)
    assert np.array_equal(one.step_logits, chunked.step_logits)
    # the block length is part of the contract: another split gives other bits
    other = IntModel(qm, block_tokens=5).generate(_prompt(1, 24), 0)
    assert not np.array_equal(one.prompt_logits, other.prompt_logits)


@pytest.mark.parametrize("block", [4, 16])
def test_single_mode_decode_equals_longer_prefill(qm, block):
    p = _prompt(2, 13)
    m = IntModel(qm, block_tokens=block, decode_mode="single")
    m.prefill(p[:10])
    steps = [m.decode(int(t)) for t in p[10:]]
    ref = IntModel(qm, block_tokens=block).prefill(p)
    assert np.array_equal(np.array(steps), ref[10:])
    assert m.length == 13


def test_two_phase_decode_is_split_invariant(qm):
    p = _prompt(3, 20)
    outs = []
    for block in (16, 3, 1, 64):
        m = IntModel(qm, block_tokens=16)
        m.prefill(p[:17])
        m.block_tokens = block            # the decode reads the same KV in other blocks
        outs.append([m.decode(int(t)) for t in p[17:]])
        assert m.max_violations == 0
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


def test_exact_prefill_does_not_depend_on_blocks_or_chunks(qm):
    """PREFILL EXACT: the causal maximum, then exact sums — the same bits for any block length
    and chunking (the single pass's bits follow the blocks), close to the single pass."""
    p = _prompt(4, 24)
    runs = [IntModel(qm, block_tokens=b, prefill_mode="exact").generate(p, 2, chunk=c)
            for b, c in ((8, None), (5, 8), (1, 12), (64, None))]
    for r in runs[1:]:
        assert np.array_equal(runs[0].prompt_logits, r.prompt_logits)
        assert np.array_equal(runs[0].step_logits, r.step_logits)
    single = IntModel(qm, block_tokens=8).generate(p, 0)
    assert not np.array_equal(single.prompt_logits, runs[0].prompt_logits)
    assert np.abs(single.prompt_logits - runs[0].prompt_logits).max() < \
        0.05 * np.abs(single.prompt_logits).max()


def test_masked_future_blocks_change_nothing(qm):
    m = IntModel(qm, block_tokens=4)
    m.prefill(_prompt(4, 14))
    store = m.kv[1][1]
    rng = np.random.default_rng(0)
    q = rng.integers(-128, 128, (2, CFG.head_dim))
    sq = np.array([[40000, -22], [50000, -23]])
    for pos in (0, 5, 13):
        a = attend_single(q, sq, store.blocks(4, upto=pos), pos, causal=True)
        b = attend_single(q, sq, store.blocks(4), pos, causal=True)
        assert a == b


def test_per_channel_k_format(qm):
    """``kv_format=PER_CHANNEL_K``: a prefill in chunks at multiples of ``KV_GROUP`` gives the
    bits of one prefill (a group's channel scales see the same tokens); the decode reads the
    closed groups and the open one, split-invariant under two-phase; the bits differ from the
    per-token format's (the option is not ignored), the greedy tokens stay close."""
    ch = KVFormat.PER_CHANNEL_K
    p = _prompt(5, 2 * KV_GROUP + 5)
    one = IntModel(qm, kv_format=ch).generate(p, 3)
    chunked = IntModel(qm, kv_format=ch).generate(p, 3, chunk=KV_GROUP)
    assert np.array_equal(one.prompt_logits, chunked.prompt_logits)
    assert np.array_equal(one.step_logits, chunked.step_logits)
    m = IntModel(qm, kv_format=ch)
    assert m.kv_format is ch and len(m.kv[0][0].closed) == 0
    m.prefill(p)
    assert len(m.kv[0][0].closed) == 2 and m.length == len(p)
    outs = []
    for block in (KV_GROUP, 2 * KV_GROUP, 256):
        m = IntModel(qm, kv_format=ch)
        m.prefill(p)
        m.block_tokens = block
        outs.append([m.decode(int(t)) for t in (1, 2, 3)])
        assert m.max_violations == 0
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    tok = IntModel(qm).generate(p, 3)
    assert not np.array_equal(one.prompt_logits, tok.prompt_logits)
    assert np.mean(one.prompt_logits.argmax(1) == tok.prompt_logits.argmax(1)) >= 0.5


def test_embedding_is_act_of_the_dequantised_row(qm):
    toks = np.arange(CFG.vocab_size)
    want = to_act(qm.embed.dequantize())
    assert np.array_equal(embed_codes(qm.embed, toks), want)
    with pytest.raises(ValueError, match="token id"):
        embed_codes(qm.embed, [CFG.vocab_size])


def test_layer_hook_defaults_unchanged(qm):
    """layer_fixed with ACT input and the float64 attention hook = the original call."""
    x = np.random.default_rng(5).standard_normal((5, CFG.hidden_size))
    ql = qm.layers[0]
    a = layer_fixed(x, ql, CFG.layer)
    b = layer_fixed(to_act(x), ql, CFG.layer, act_in=True)
    assert np.array_equal(a, b)


def _kv4(fm: FloatModel) -> FloatModel:
    """The float model with its K/V rows quantised to INT4 per token and head (host
    quantiser) before attention: isolates the INT4-KV error from the activation arithmetic."""
    d, attn = CFG.head_dim, fm._attention

    def q4(x):
        k, s = quantize_kv_float(x.reshape(x.shape[0], -1, d))
        return dequantize(k, s, KV_SCALE).reshape(x.shape).astype(np.float32)

    fm._attention = lambda q, k, v, qp, kp: attn(q, q4(k), q4(v), qp, kp)
    return fm


def _cos(a, b):
    a, b = a.ravel(), b.ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


# Bounds from the measurement on seeds 0..5 (docs/model.md): (min cosine, min top-1 rate).
#  * integer vs float on the dequantised weights with INT4 KV — the fixed-point activation
#    arithmetic alone: cos 0.994..0.998, top-1 0.89..1.00;
#  * + INT4 KV (float on the dequantised weights): cos 0.986..0.991, top-1 0.79..0.95;
#  * + INT4 weights (float on the checkpoint): cos 0.898..0.923, top-1 0.53..0.74 — the
#    INT4 weight error itself: group-128 absmax/7 codes leave ≈ 12 % relative RMS error per
#    matrix on Gaussian weights, compounded over 15 matrices; a random model's flat logits
#    make top-1 fragile.
BOUNDS = {"act": (0.99, 0.85), "kv": (0.98, 0.75), "weights": (0.88, 0.45)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_error_against_float_reference(seed):
    t = random_checkpoint(CFG, seed)
    qm = quantize_model(CFG, t)
    im = IntModel(qm)
    gen = im.generate(_prompt(seed), 4)
    assert im.max_violations == 0
    seq = np.concatenate([_prompt(seed), gen.tokens])[:-1]          # teacher-forced
    got = from_act(np.concatenate([gen.prompt_logits, gen.step_logits[1:]]))
    refs = {"act": _kv4(FloatModel(CFG, qm.dequantized())),
            "kv": FloatModel(CFG, qm.dequantized()),
            "weights": FloatModel(CFG, t)}
    for name, fm in refs.items():
        want = fm.forward(seq, fm.new_cache())
        cos = _cos(got, want)
        top1 = float(np.mean(got.argmax(axis=1) == want.argmax(axis=1)))
        lo_cos, lo_top1 = BOUNDS[name]
        assert cos >= lo_cos and top1 >= lo_top1, (name, cos, top1)


def test_bad_arguments(qm):
    with pytest.raises(ValueError, match="decode_mode"):
        IntModel(qm, decode_mode="ring")
    with pytest.raises(ValueError, match="prefill_mode"):
        IntModel(qm, prefill_mode="two_phase")
    with pytest.raises(ValueError, match="block_tokens"):
        IntModel(qm, block_tokens=0)
    m = IntModel(qm)
    with pytest.raises(ValueError, match="empty prefill"):
        m.prefill([])
    with pytest.raises(ValueError, match="token id"):
        m.prefill([CFG.vocab_size])
