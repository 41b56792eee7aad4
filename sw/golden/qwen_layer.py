"""A Qwen2-style decoder layer twice: float32 (the reference) and in the engine's fixed-point
formats (:mod:`mcf.golden.gemm`, :mod:`mcf.golden.vector`), to bound the quantisation error
(paper §6.1: weights and KV in INT4 in the FPGA's fixed-point format).

Layer: ``h = x + o(attn(rope(q(n1)), rope(k(n1)), v(n1)))``, ``n1 = rmsnorm(x)``;
``y = h + down(silu(gate(n2)) · up(n2))``, ``n2 = rmsnorm(h)``. Q/K/V have biases; attention is
causal with grouped query heads; RoPE uses the ``rotate_half`` convention.

In the fixed path every projection is the INT4 GEMM on INT8 activations requantised per token,
every other op is the vector unit's. Attention itself (the attention kernel's area) is computed
in float64 on the dequantised ACT Q/K/V and re-quantised to ACT; swap in the attention golden
model for a fully integer layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mcf.abi.quant import GAMMA, GROUP_SIZE, requantize, rope_table
from mcf.quant import QuantWeight, from_act, quantize_weight, to_act

from . import gemm as G
from . import vector as V

__all__ = ["LayerConfig", "TINY", "QWEN25_1P5B", "random_layer", "layer_float", "attention",
           "layer_fixed", "QuantLayer", "quantize_layer"]


@dataclass(frozen=True)
class LayerConfig:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    theta: float = 1e6
    eps: float = 1e-6
    group: int = GROUP_SIZE


TINY = LayerConfig(hidden=128, heads=4, kv_heads=2, head_dim=32, intermediate=256)
QWEN25_1P5B = LayerConfig(hidden=1536, heads=12, kv_heads=2, head_dim=128, intermediate=8960)


def random_layer(cfg: LayerConfig, seed: int = 0) -> dict:
    """Float32 weights with Qwen-like statistics (W ~ N(0, 1/K), γ ≈ 1)."""
    rng = np.random.default_rng(seed)
    h, hd = cfg.hidden, cfg.head_dim

    def lin(n, k):
        return (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)

    return {
        "q": lin(cfg.heads * hd, h), "k": lin(cfg.kv_heads * hd, h),
        "v": lin(cfg.kv_heads * hd, h), "o": lin(h, cfg.heads * hd),
        "gate": lin(cfg.intermediate, h), "up": lin(cfg.intermediate, h),
        "down": lin(h, cfg.intermediate),
        "bq": (0.1 * rng.standard_normal(cfg.heads * hd)).astype(np.float32),
        "bk": (0.1 * rng.standard_normal(cfg.kv_heads * hd)).astype(np.float32),
        "bv": (0.1 * rng.standard_normal(cfg.kv_heads * hd)).astype(np.float32),
        "g1": (1 + 0.1 * rng.standard_normal(h)).astype(np.float32),
        "g2": (1 + 0.1 * rng.standard_normal(h)).astype(np.float32),
    }


def _rope_f(x, pos, cfg):
    hd = cfg.head_dim
    inv = cfg.theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.asarray(pos, dtype=np.float64)[:, None] * inv[None, :]
    c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    m = x.shape[0]
    xr = x.reshape(m, -1, 2, hd // 2)
    x0, x1 = xr[:, :, 0], xr[:, :, 1]
    return np.stack([x0 * c[:, None] - x1 * s[:, None], x1 * c[:, None] + x0 * s[:, None]],
                    axis=2).reshape(m, -1)


def attention(q, k, v, cfg, dtype=np.float32):
    m = q.shape[0]
    hd = cfg.head_dim
    q = q.reshape(m, cfg.heads, hd).astype(dtype)
    k = k.reshape(m, cfg.kv_heads, hd).astype(dtype)
    v = v.reshape(m, cfg.kv_heads, hd).astype(dtype)
    rep = cfg.heads // cfg.kv_heads
    out = np.zeros((m, cfg.heads, hd), dtype=dtype)
    mask = np.tril(np.ones((m, m), dtype=bool))
    for h in range(cfg.heads):
        s = q[:, h] @ k[:, h // rep].T / np.sqrt(hd).astype(dtype)
        s = np.where(mask, s, -np.inf)
        s = s - s.max(axis=1, keepdims=True)
        p = np.exp(s)
        p = p / p.sum(axis=1, keepdims=True)
        out[:, h] = p @ v[:, h // rep]
    return out.reshape(m, -1)


def layer_float(x, w: dict, cfg: LayerConfig, positions=None):
    """The float32 reference (weights as given: pass dequantised weights to isolate the
    activation arithmetic from the INT4 weight error)."""
    x = np.asarray(x, dtype=np.float32)
    pos = np.arange(x.shape[0]) if positions is None else positions

    def norm(t, g):
        return t / np.sqrt(np.mean(t * t, axis=1, keepdims=True) + cfg.eps) * g

    n1 = norm(x, w["g1"])
    q = _rope_f(n1 @ w["q"].T + w["bq"], pos, cfg)
    k = _rope_f(n1 @ w["k"].T + w["bk"], pos, cfg)
    v = n1 @ w["v"].T + w["bv"]
    h = x + attention(q, k, v, cfg) @ w["o"].T
    n2 = norm(h, w["g2"])
    g = n2 @ w["gate"].T
    mlp = (g / (1 + np.exp(-g))) * (n2 @ w["up"].T)
    return (h + mlp @ w["down"].T).astype(np.float32)


@dataclass
class QuantLayer:
    qw: dict          # name → QuantWeight
    bias: dict        # name → ACT codes
    gamma: dict       # name → GAMMA codes

    def dequantized(self) -> dict:
        out = {n: q.dequantize().astype(np.float32) for n, q in self.qw.items()}
        out.update({f"b{n}": from_act(self.bias[n]).astype(np.float32) for n in "qkv"})
        out.update({n: GAMMA.to_float(self.gamma[n]).astype(np.float32) for n in ("g1", "g2")})
        return out


def quantize_layer(w: dict, cfg: LayerConfig) -> QuantLayer:
    names = ("q", "k", "v", "o", "gate", "up", "down")
    return QuantLayer({n: quantize_weight(w[n], cfg.group) for n in names},
                      {n: to_act(w[f"b{n}"]) for n in "qkv"},
                      {n: GAMMA.quantize(w[n]) for n in ("g1", "g2")})


def _linear(xa, qw: QuantWeight, bias=None):
    xq, xm, xe = requantize(xa)
    return G.gemm(xq, xm, xe, qw.q, qw.m, qw.e, bias, qw.group)


def layer_fixed(x, ql: QuantLayer, cfg: LayerConfig, positions=None, *, attn=None,
                act_in: bool = False):
    """The engine's arithmetic: returns ACT codes of the layer output.

    ``attn(q, k, v, positions)`` (optional) replaces the float64 attention: it takes the ACT
    codes of the post-RoPE Q ``[T, heads·d]``, K and V ``[T, kv_heads·d]`` and returns the ACT
    codes ``[T, heads·d]`` of the attention output (e.g. the integer attention over a KV cache
    of :mod:`mcf.golden.model`). ``act_in``: ``x`` already holds ACT codes (not floats)."""
    xa = np.asarray(x, dtype=np.int64) if act_in else to_act(x)
    pos = np.arange(xa.shape[0]) if positions is None else positions
    cos, sin = rope_table(pos, cfg.head_dim, cfg.theta)
    n1 = V.rmsnorm(xa, ql.gamma["g1"], cfg.eps)
    q = V.rope(_linear(n1, ql.qw["q"], ql.bias["q"]), cos, sin, cfg.head_dim)
    k = V.rope(_linear(n1, ql.qw["k"], ql.bias["k"]), cos, sin, cfg.head_dim)
    v = _linear(n1, ql.qw["v"], ql.bias["v"])
    if attn is None:
        att = to_act(attention(from_act(q), from_act(k), from_act(v), cfg, np.float64))
    else:
        att = np.asarray(attn(q, k, v, pos), dtype=np.int64)
    h = V.residual_add(xa, _linear(att, ql.qw["o"]))
    n2 = V.rmsnorm(h, ql.gamma["g2"], cfg.eps)
    mlp = V.silu_mul(_linear(n2, ql.qw["gate"]), _linear(n2, ql.qw["up"]))
    return V.residual_add(h, _linear(mlp, ql.qw["down"]))
