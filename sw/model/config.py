"""The model's geometry: :class:`Qwen2Config`, read from and written to a Hugging Face
``config.json``, and :data:`TINY_MODEL`, the CI model (the layer geometry of
:data:`mcf.golden.qwen_layer.TINY`, 2 layers, a 256-token vocabulary, tied embeddings).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mcf.golden.qwen_layer import TINY, LayerConfig

__all__ = ["Qwen2Config", "ConfigError", "TINY_MODEL", "QWEN2_ARCH", "QWEN2_MODEL_TYPE"]

QWEN2_MODEL_TYPE = "qwen2"
QWEN2_ARCH = "Qwen2ForCausalLM"

_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
             "intermediate_size")


class ConfigError(ValueError):
    """A ``config.json`` that is not a usable Qwen2 configuration (one-line message)."""


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
            if int(getattr(self, f)) <= 0:
                raise ConfigError(f"{f} must be positive, got {getattr(self, f)}")
        if self.head_dim * self.num_attention_heads != self.hidden_size:
            raise ConfigError(f"head_dim {self.head_dim} x {self.num_attention_heads} heads != "
                              f"hidden_size {self.hidden_size}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"{self.num_attention_heads} query heads are not a multiple of "
                              f"{self.num_key_value_heads} KV heads")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim {self.head_dim} must be even (RoPE pairs)")

    @property
    def layer(self) -> LayerConfig:
        """The per-layer geometry as :mod:`mcf.golden.qwen_layer` takes it."""
        return LayerConfig(hidden=self.hidden_size, heads=self.num_attention_heads,
                           kv_heads=self.num_key_value_heads, head_dim=self.head_dim,
                           intermediate=self.intermediate_size, theta=float(self.rope_theta),
                           eps=float(self.rms_norm_eps))

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
        """From a parsed Hugging Face ``config.json``; raises :class:`ConfigError` when it is
        not a Qwen2 causal LM or lacks a field."""
        mt = d.get("model_type")
        archs = d.get("architectures") or []
        if mt != QWEN2_MODEL_TYPE and QWEN2_ARCH not in archs:
            raise ConfigError(f"not a Qwen2 checkpoint (model_type {mt!r}, architectures "
                              f"{archs})")
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise ConfigError(f"config.json lacks {', '.join(missing)}")
        heads = int(d["num_attention_heads"])
        hidden = int(d["hidden_size"])
        if hidden % heads:
            raise ConfigError(f"hidden_size {hidden} is not a multiple of {heads} heads")
        head_dim = hidden // heads
        if d.get("head_dim") not in (None, head_dim):
            raise ConfigError(f"head_dim {d['head_dim']} != hidden_size / heads = {head_dim}")
        theta = d.get("rope_theta")
        if theta is None:   # newer transformers keep it in rope_parameters
            theta = (d.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        scaling = d.get("rope_scaling")
        if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
            raise ConfigError(f"rope scaling {scaling} is not supported")
        if d.get("use_sliding_window"):
            raise ConfigError("sliding-window attention is not supported")
        return cls(hidden_size=hidden, num_hidden_layers=int(d["num_hidden_layers"]),
                   num_attention_heads=heads,
                   num_key_value_heads=int(d.get("num_key_value_heads", heads)),
                   head_dim=head_dim, intermediate_size=int(d["intermediate_size"]),
                   vocab_size=int(d["vocab_size"]), rope_theta=float(theta),
                   rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                   tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                   max_position_embeddings=int(d.get("max_position_embeddings", 32768)))

    def to_hf(self) -> dict:
        """A ``config.json`` dictionary ``transformers``' ``Qwen2ForCausalLM`` loads."""
        d = asdict(self)
        d.update({"model_type": QWEN2_MODEL_TYPE, "architectures": [QWEN2_ARCH],
                  "hidden_act": "silu", "attention_dropout": 0.0, "use_sliding_window": False,
                  "rope_scaling": None, "torch_dtype": "float32", "use_cache": True,
                  "bos_token_id": 0, "eos_token_id": 0})
        return d


TINY_MODEL = Qwen2Config.from_layer(TINY, layers=2, vocab=256, tied=True, max_positions=4096)
"""The CI model: :data:`mcf.golden.qwen_layer.TINY` (hidden 128, 4 query / 2 KV heads of 32,
intermediate 256, θ = 10^6, ε = 10^-6), 2 layers, vocabulary 256, tied embeddings."""
