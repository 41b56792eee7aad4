"""The model's geometry: :class:`Qwen2Config`, read from and written to a Hugging Face
``config.json``, :data:`TINY_MODEL`, the CI model (the layer geometry of
:data:`mcf.golden.qwen_layer.TINY`, 2 layers, a 256-token vocabulary, tied embeddings), and
:data:`QWEN25_1P5B_MODEL`, Qwen2.5-1.5B's published configuration.

:meth:`Qwen2Config.from_hf` reads a ``config.json`` with ``transformers``' ``Qwen2Config``
semantics: a missing or ``null`` ``num_key_value_heads`` or ``head_dim`` takes the value
``transformers`` derives (the attention heads; ``hidden_size / heads``), missing optional fields
take ``transformers``' defaults (``tie_word_embeddings`` false, ``rope_theta`` 10⁴,
``rms_norm_eps`` 10⁻⁶, ``hidden_act`` silu), fields that only matter in training are ignored.
Anything the float and integer models do not implement and that would change the outputs —
RoPE scaling of any ``rope_type`` but ``default`` (``rope_scaling`` or the newer
``rope_parameters``), a ``hidden_act`` other than SiLU, sliding-window layers, a
``quantization_config`` — and every field of the wrong type raises :class:`ConfigError`, whose
one-line message names the field.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from mcf.golden.qwen_layer import QWEN25_1P5B, TINY, LayerConfig

__all__ = ["Qwen2Config", "ConfigError", "CheckpointError", "TINY_MODEL", "QWEN25_1P5B_MODEL",
           "QWEN2_ARCH", "QWEN2_MODEL_TYPE", "token_ids"]

QWEN2_MODEL_TYPE = "qwen2"
QWEN2_ARCH = "Qwen2ForCausalLM"

_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
             "intermediate_size")
SILU_NAMES = ("silu", "swish")
"""``hidden_act`` values ``transformers`` maps to SiLU (``ACT2FN``)."""


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be used (one-line message)."""


class ConfigError(CheckpointError):
    """A ``config.json`` that is not a usable Qwen2 configuration (one-line message naming the
    field). A :class:`CheckpointError`, so one ``except`` covers a bad directory and a bad
    configuration."""


def _what(v) -> str:
    return "null" if v is None else f"{v!r} ({type(v).__name__})"


def _int(d: dict, key: str, default=None) -> int:
    """``d[key]`` as a JSON integer (``default`` when missing or null, if given)."""
    v = d.get(key)
    if v is None and default is not None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{key} must be an integer, got {_what(v)}")
    return v


def _float(d: dict, key: str, default: float | None = None, *, where: str = "") -> float:
    v = d.get(key)
    if v is None and default is not None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ConfigError(f"{where}{key} must be a finite number, got {_what(v)}")
    return float(v)


def _bool(d: dict, key: str, default: bool) -> bool:
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ConfigError(f"{key} must be true or false, got {_what(v)}")
    return v


def _rope(d: dict) -> float:
    """θ of a plain (unscaled) RoPE; raises on any scaling, by the field that asks for it."""
    thetas = []
    if d.get("rope_theta") is not None:
        thetas.append(("rope_theta", _float(d, "rope_theta")))
    for key in ("rope_scaling", "rope_parameters"):
        p = d.get(key)
        if p is None:
            continue
        if not isinstance(p, dict):
            raise ConfigError(f"{key} must be an object or null, got {_what(p)}")
        # transformers 5 may hold one parameter set per attention type
        sets = p.items() if p and all(isinstance(v, dict) for v in p.values()) \
            else [("", p)]
        for sub, ps in sets:
            name = f"{key}.{sub}" if sub else key
            kind = ps.get("rope_type", ps.get("type", "default"))
            if kind != "default":
                raise ConfigError(f"{name}: rope_type {_what(kind)} is not supported (only "
                                  "unscaled RoPE, rope_type 'default')")
            prf = ps.get("partial_rotary_factor")
            if prf is not None and prf != 1:
                raise ConfigError(f"{name}: partial_rotary_factor {_what(prf)} is not "
                                  "supported (RoPE on every channel)")
            if ps.get("rope_theta") is not None:
                thetas.append((f"{name}.rope_theta",
                               _float(ps, "rope_theta", where=f"{name}: ")))
    if len({t for _, t in thetas}) > 1:
        raise ConfigError("RoPE θ given twice, differently: "
                          + ", ".join(f"{k} {t:g}" for k, t in thetas))
    theta = thetas[0][1] if thetas else 10000.0     # transformers' Qwen2Config default
    if theta <= 0:
        raise ConfigError(f"{thetas[0][0]} must be positive, got {theta:g}")
    return theta


def _attention_types(d: dict) -> None:
    """Refuse sliding-window attention: ``layer_types`` other than ``full_attention``, or
    ``use_sliding_window`` true with a window (``sliding_window``, ``transformers``' default
    4096 when missing). Which layers then slide (``max_window_layers``) has differed between
    ``transformers`` versions, so any such configuration is refused."""
    types = d.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise ConfigError(f"layer_types must be a list of names, got {_what(types)}")
        other = sorted({t for t in types if t != "full_attention"})
        if other:
            raise ConfigError(f"layer_types {other}: only full_attention layers are supported")
    if _bool(d, "use_sliding_window", False) and d.get("sliding_window", 4096) is not None:
        raise ConfigError(f"use_sliding_window true (window {d.get('sliding_window', 4096)}): "
                          "sliding-window attention is not supported")


@dataclass(frozen=True)
class Qwen2Config:
    """The Qwen2 hyper-parameters the forward passes use (Hugging Face names)."""
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float = 1e6
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 32768

    def __post_init__(self):
        for f in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
                  "max_position_embeddings"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ConfigError(f"{f} must be an integer, got {_what(v)}")
            if v <= 0:
                raise ConfigError(f"{f} must be positive, got {v}")
        if not self.rope_theta > 0 or not self.rms_norm_eps > 0:
            raise ConfigError(f"rope_theta ({self.rope_theta}) and rms_norm_eps "
                              f"({self.rms_norm_eps}) must be positive")
        if self.head_dim * self.num_attention_heads != self.hidden_size:
            raise ConfigError(f"head_dim {self.head_dim} x {self.num_attention_heads} heads != "
                              f"hidden_size {self.hidden_size}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"{self.num_attention_heads} query heads are not a multiple of "
                              f"{self.num_key_value_heads} KV heads (num_key_value_heads)")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim {self.head_dim} must be even (RoPE pairs)")

    @property
    def layer(self) -> LayerConfig:
        """The per-layer geometry as :mod:`mcf.golden.qwen_layer` takes it."""
        return LayerConfig(hidden=self.hidden_size, heads=self.num_attention_heads,
                           kv_heads=self.num_key_value_heads, head_dim=self.head_dim,
                           intermediate=self.intermediate_size, theta=float(self.rope_theta),
                           eps=float(self.rms_norm_eps))

    def truncated(self, layers: int) -> Qwen2Config:
        """The same model cut to its first ``layers`` layers (embedding, those layers, final
        norm, lm_head)."""
        if isinstance(layers, bool) or not isinstance(layers, (int, np.integer)) or \
                not 1 <= layers <= self.num_hidden_layers:
            raise ConfigError(f"layers {layers!r}: the model has 1..{self.num_hidden_layers} "
                              "layers")
        return replace(self, num_hidden_layers=int(layers))

    @classmethod
    def from_layer(cls, layer: LayerConfig, layers: int, vocab: int, *, tied: bool = True,
                   max_positions: int = 32768) -> Qwen2Config:
        return cls(hidden_size=layer.hidden, num_hidden_layers=layers,
                   num_attention_heads=layer.heads, num_key_value_heads=layer.kv_heads,
                   head_dim=layer.head_dim, intermediate_size=layer.intermediate,
                   vocab_size=vocab, rope_theta=layer.theta, rms_norm_eps=layer.eps,
                   tie_word_embeddings=tied, max_position_embeddings=max_positions)

    @classmethod
    def from_hf(cls, d: dict) -> Qwen2Config:
        """From a parsed Hugging Face ``config.json`` with ``transformers``' semantics (module
        docstring); raises :class:`ConfigError` naming the field when it is not a Qwen2 causal
        LM the models implement exactly."""
        if not isinstance(d, dict):
            raise ConfigError(f"the configuration must be a JSON object, got a "
                              f"{type(d).__name__}")
        mt = d.get("model_type")
        archs = d.get("architectures") or []
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise ConfigError(f"architectures must be a list of names, got {_what(archs)}")
        if (mt is not None and mt != QWEN2_MODEL_TYPE) or (archs and QWEN2_ARCH not in archs) \
                or (mt is None and not archs):
            raise ConfigError(f"not a Qwen2 checkpoint (model_type {mt!r}, architectures "
                              f"{archs}): only {QWEN2_MODEL_TYPE} / {QWEN2_ARCH}")
        missing = [k for k in _REQUIRED if d.get(k) is None]
        if missing:
            raise ConfigError(f"config.json lacks {', '.join(missing)}")
        if d.get("quantization_config") is not None:
            raise ConfigError("quantization_config: a pre-quantised checkpoint is not "
                              "supported (give the bf16/f32 weights)")
        act = d.get("hidden_act", "silu")
        if act not in SILU_NAMES:
            raise ConfigError(f"hidden_act {_what(act)} is not supported (only silu)")
        heads = _int(d, "num_attention_heads")
        hidden = _int(d, "hidden_size")
        layers = _int(d, "num_hidden_layers")
        if heads <= 0:
            raise ConfigError(f"num_attention_heads must be positive, got {heads}")
        if hidden % heads:
            raise ConfigError(f"hidden_size {hidden} is not a multiple of {heads} heads")
        head_dim = hidden // heads
        got = _int(d, "head_dim", head_dim)
        if got != head_dim:
            raise ConfigError(f"head_dim {got} != hidden_size / heads = {head_dim}")
        theta = _rope(d)
        _attention_types(d)
        return cls(hidden_size=hidden, num_hidden_layers=layers,
                   num_attention_heads=heads,
                   num_key_value_heads=_int(d, "num_key_value_heads", heads),
                   head_dim=head_dim, intermediate_size=_int(d, "intermediate_size"),
                   vocab_size=_int(d, "vocab_size"), rope_theta=theta,
                   rms_norm_eps=_float(d, "rms_norm_eps", 1e-6),
                   tie_word_embeddings=_bool(d, "tie_word_embeddings", False),
                   max_position_embeddings=_int(d, "max_position_embeddings", 32768))

    def to_hf(self) -> dict:
        """A ``config.json`` dictionary ``transformers``' ``Qwen2ForCausalLM`` loads."""
        d = asdict(self)
        d.update({"model_type": QWEN2_MODEL_TYPE, "architectures": [QWEN2_ARCH],
                  "hidden_act": "silu", "attention_dropout": 0.0, "use_sliding_window": False,
                  "rope_scaling": None, "torch_dtype": "float32", "use_cache": True,
                  "bos_token_id": 0, "eos_token_id": 0})
        return d


def token_ids(tokens, vocab_size: int) -> np.ndarray:
    """``tokens`` as an int64 vector, every id in ``0 .. vocab_size - 1``; anything else (an id
    out of range, a fractional or non-numeric id) raises ``ValueError`` — never wraps."""
    a = np.asarray(tokens)
    if a.size == 0:
        return np.zeros(0, np.int64)
    if a.dtype.kind not in "iu":
        if a.dtype.kind == "f" and np.all(np.isfinite(a)) and np.all(a == np.round(a)):
            a = a.astype(np.int64)
        else:
            raise ValueError(f"token ids must be integers, got {a.dtype} values")
    a = a.astype(np.int64).ravel()
    bad = a[(a < 0) | (a >= vocab_size)]
    if bad.size:
        raise ValueError(f"token id {int(bad[0])} outside 0..{vocab_size - 1} (the "
                         f"vocabulary of {vocab_size})")
    return a


TINY_MODEL = Qwen2Config.from_layer(TINY, layers=2, vocab=256, tied=True, max_positions=4096)
"""The CI model: :data:`mcf.golden.qwen_layer.TINY` (hidden 128, 4 query / 2 KV heads of 32,
intermediate 256, θ = 10^6, ε = 10^-6), 2 layers, vocabulary 256, tied embeddings."""

QWEN25_1P5B_MODEL = Qwen2Config.from_layer(QWEN25_1P5B, layers=28, vocab=151936, tied=True,
                                           max_positions=32768)
"""Qwen2.5-1.5B(-Instruct) as published: :data:`mcf.golden.qwen_layer.QWEN25_1P5B` (hidden
1,536, 12 query / 2 KV heads of 128, intermediate 8,960, θ = 10^6, ε = 10^-6), 28 layers, the
151,936-token vocabulary, tied embeddings, 32,768 positions (the Instruct model's; the base
model's config.json says 131,072)."""
