"""Model shape and the KV-cache size equations (paper §2.1 eq 1, §4 eq 3, 4, 6).

A :class:`ModelSpec` holds what MARS needs of a decoder-only transformer: layer count, query and
KV heads, head dimension, the KV element size ``b`` in bytes (INT4 = 0.5, INT8 = 1, FP16 = 2) and,
for the compute model of the linear layers, the hidden and MLP widths. Presets live in
:data:`MODELS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

__all__ = ["ModelSpec", "MODELS", "KV_ELEMENT_BYTES", "get_model"]

# KV element sizes in bytes, by name (eq 1's ``b``). Fractions keep INT4's half byte exact.
KV_ELEMENT_BYTES: dict[str, Fraction] = {
    "int4": Fraction(1, 2),
    "int8": Fraction(1),
    "fp16": Fraction(2),
}


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer as MARS sees it."""
    name: str
    layers: int           # L
    q_heads: int          # H_q
    kv_heads: int         # H_kv
    head_dim: int         # d
    kv_dtype: str = "int4"
    hidden: int = 0       # model width (linear-layer compute model; 0 = attention only)
    intermediate: int = 0  # MLP width (SiLU-gated: three hidden×intermediate matrices)
    vocab: int = 0        # embedding rows (tied LM head); weight memory only

    def __post_init__(self) -> None:
        if self.kv_dtype not in KV_ELEMENT_BYTES:
            raise ValueError(f"unknown KV element type {self.kv_dtype!r} "
                             f"(one of {', '.join(KV_ELEMENT_BYTES)})")
        for f in ("layers", "q_heads", "kv_heads", "head_dim"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1")
        if self.q_heads % self.kv_heads:
            raise ValueError("q_heads must be a multiple of kv_heads (grouped-query attention)")

    @property
    def kv_bytes(self) -> Fraction:
        """``b``: bytes per KV element."""
        return KV_ELEMENT_BYTES[self.kv_dtype]

    @property
    def m_token(self) -> int:
        """Eq 1: ``M_token = 2·L·H_kv·d·b`` bytes of KV cache per token (all layers)."""
        m = 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes
        if m.denominator != 1:
            raise ValueError("M_token is not a whole number of bytes")
        return int(m)

    @property
    def m_token_layer(self) -> int:
        """KV bytes of one token in one layer (eq 1 without the ``L``)."""
        return self.m_token // self.layers

    def m_chunk(self, chunk: int) -> int:
        """Eq 3: ``M_chunk = B·M_token``."""
        return chunk * self.m_token

    def m_hist(self, c: int, chunk: int) -> int:
        """Eq 4: ``M_hist(c) = c·M_chunk``."""
        return c * self.m_chunk(chunk)

    @property
    def attn_ops_per_pair(self) -> int:
        """Operations for one (query token, key token) pair over all layers: ``4·L·H_q·d``
        (QKᵀ and PV, one multiply-add = 2 operations each) — the numerator of eq 6."""
        return 4 * self.layers * self.q_heads * self.head_dim

    @property
    def linear_params_per_layer(self) -> int:
        """Weights of the Q, K, V, O projections and the SiLU-gated MLP of one layer."""
        qd, kvd = self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        return (self.hidden * qd + 2 * self.hidden * kvd + qd * self.hidden
                + 3 * self.hidden * self.intermediate)

    @property
    def weight_params(self) -> int:
        """Every weight the node stores: the linear layers of all layers plus the (tied)
        embedding."""
        return self.layers * self.linear_params_per_layer + self.vocab * self.hidden

    @property
    def linear_ops_per_token(self) -> int:
        """Linear-layer operations per token over all layers (2 per weight)."""
        return 2 * self.layers * self.linear_params_per_layer


TINY_LAYERS = 2
"""Layers of the ``tiny`` model (the golden layer is one layer; MARS needs more than one)."""


def _from_golden(name: str, cfg, layers: int, vocab: int = 0) -> ModelSpec:
    """A preset with the geometry of a golden :class:`mcf.golden.qwen_layer.LayerConfig`, so
    MARS, the golden models and the RTL share one shape."""
    return ModelSpec(name, layers=layers, q_heads=cfg.heads, kv_heads=cfg.kv_heads,
                     head_dim=cfg.head_dim, kv_dtype="int4", hidden=cfg.hidden,
                     intermediate=cfg.intermediate, vocab=vocab)


def _presets() -> dict[str, ModelSpec]:
    from ..golden.qwen_layer import QWEN25_1P5B, TINY
    return {
        # Qwen2.5-1.5B (/work/shared/design/platform.md): 28 layers, vocab 151,936; INT4 KV ->
        # M_token = 7168 B.
        "qwen2.5-1.5b": _from_golden("qwen2.5-1.5b", QWEN25_1P5B, 28, vocab=151_936),
        # The golden models' and the sim node's tiny layer (hidden 128, 4 query heads, 2 KV
        # heads, head_dim 32, intermediate 256), two layers: tests and the cluster simulation.
        "tiny": _from_golden("tiny", TINY, TINY_LAYERS),
    }


MODELS: dict[str, ModelSpec] = _presets()


def get_model(name: str, kv_dtype: str | None = None) -> ModelSpec:
    """A preset by name, optionally with another KV element type."""
    try:
        spec = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r} (presets: {', '.join(MODELS)})") from None
    if kv_dtype is not None and kv_dtype != spec.kv_dtype:
        from dataclasses import replace
        spec = replace(spec, kv_dtype=kv_dtype)
    return spec
