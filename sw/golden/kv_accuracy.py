"""Accuracy of the two KV formats on keys with outlier channels (issue #10 §5).

:func:`kv_format_error` draws float Q/K/V for a GQA layer (head_dim 128, a few hundred keys),
optionally with Qwen2-like K statistics (a per-channel K bias and 4 of 128 channels scaled 8×),
runs the bit-exact golden path for one KV format — ACT codes, the on-chip K/V quantiser of that
format, the vector unit's query quantisation, :func:`mcf.golden.attention.attend_single` and
``o / l`` — and compares the attention output with float64 attention on the unquantised data.

Run ``python -m mcf.golden.kv_accuracy`` for the table (2 formats × with/without outliers).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from mcf.abi.kv import quantize_kv_rows, quantize_q, to_act
from mcf.abi.kv_channel import KV_GROUP, KVFormat
from mcf.abi.softmax import NORM_OUT

from .attention import KVBlock, KVChannelCache, attend_single, normalize_state

__all__ = ["make_qkv", "quantized_blocks", "kv_format_error", "OUTLIER_CHANNELS",
           "OUTLIER_GAIN", "main"]

OUTLIER_CHANNELS = 4
OUTLIER_GAIN = 8.0
K_BIAS_SIGMA = 1.0


def make_qkv(rng: np.random.Generator, outliers: bool, n_keys: int = 300, head_dim: int = 128,
             kv_heads: int = 2, group_heads: int = 6, n_queries: int = 4):
    """Float ``q[kv_heads, n_queries, group_heads, d]``, ``k``/``v`` ``[kv_heads, n_keys, d]``,
    elements N(0, 1). With ``outliers``: a per-channel K bias N(0, K_BIAS_SIGMA²) (as Qwen2's
    K projection bias) and :data:`OUTLIER_CHANNELS` random channels per KV head scaled by
    :data:`OUTLIER_GAIN` (bias included)."""
    q = rng.normal(0.0, 1.0, (kv_heads, n_queries, group_heads, head_dim))
    k = rng.normal(0.0, 1.0, (kv_heads, n_keys, head_dim))
    v = rng.normal(0.0, 1.0, (kv_heads, n_keys, head_dim))
    if outliers:
        k += rng.normal(0.0, K_BIAS_SIGMA, (kv_heads, 1, head_dim))
        for h in range(kv_heads):
            ch = rng.choice(head_dim, OUTLIER_CHANNELS, replace=False)
            k[h, :, ch] *= OUTLIER_GAIN
    return q, k, v


def quantized_blocks(fmt: KVFormat, k, v, max_block: int = 256, group: int = KV_GROUP):
    """One KV head's float rows ``[T, d]`` → the blocks an attention job reads, through ACT and
    the on-chip quantiser of ``fmt``. PER_TOKEN: blocks of ``max_block`` tokens.
    PER_CHANNEL_K: :class:`KVChannelCache` (closed groups, then the per-token residual)."""
    ka, va = to_act(k), to_act(v)
    n = ka.shape[0]
    if fmt == KVFormat.PER_TOKEN:
        out = []
        for lo in range(0, n, max_block):
            k4, sk = quantize_kv_rows(ka[lo:lo + max_block])
            v4, sv = quantize_kv_rows(va[lo:lo + max_block])
            out.append(KVBlock(k4, sk, v4, sv, np.arange(lo, lo + k4.shape[0])))
        return out
    if fmt == KVFormat.PER_CHANNEL_K:
        cache = KVChannelCache(ka.shape[1], group)
        cache.append(ka, va)
        return cache.blocks(max_block)
    raise ValueError(f"unknown KV format {fmt!r}")


def _float_attention(q, k, v):
    t = q @ k.T / np.sqrt(q.shape[-1])
    p = np.exp(t - t.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def kv_format_error(fmt: KVFormat, outliers: bool, seed: int = 0, n_keys: int = 300,
                    group: int = KV_GROUP) -> dict:
    """Relative L2 error and cosine of the golden fixed-point attention output (``o / l``, all
    heads and query tokens) against float64 attention on the unquantised Q/K/V."""
    rng = np.random.default_rng(seed)
    q, k, v = make_qkv(rng, outliers, n_keys)
    got, ref = [], []
    for h in range(k.shape[0]):
        blocks = quantized_blocks(KVFormat(fmt), k[h], v[h], group=group)
        for qt in q[h]:
            qc, sq = quantize_q(qt)
            out = normalize_state(attend_single(qc, sq, blocks))
            got.append(out / (1 << NORM_OUT.frac))
            ref.append(_float_attention(qt, k[h], v[h]))
    got, ref = np.concatenate(got).ravel(), np.concatenate(ref).ravel()
    rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    cos = float(got @ ref / (np.linalg.norm(got) * np.linalg.norm(ref)))
    return {"rel_l2": rel, "cosine": cos}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keys", type=int, default=300)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = {f"{fmt.name}/{'outliers' if o else 'plain'}":
            kv_format_error(fmt, o, args.seed, args.keys)
            for fmt in KVFormat for o in (False, True)}
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'format / K data':28} {'rel_l2':>8} {'cosine':>8}")
    for name, r in rows.items():
        print(f"{name:28} {r['rel_l2']:8.4f} {r['cosine']:8.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
