"""Float32 reference forward of a Qwen2 causal LM (numpy), the model the integer golden model
(:mod:`mcf.golden.model`) is measured against and that is itself checked against
``transformers``' ``Qwen2ForCausalLM`` (``tests/fixtures/qwen2_tiny_logits.npz``).

Per layer: ``n1 = rmsnorm(x)·γ1``; ``q, k, v = n1·Wᵀ + b``; RoPE (``rotate_half``: pairs
``(i, i + d/2)``, ``θ^(−2i/d)``) on q and k; grouped-query causal softmax attention
(``1/sqrt(d)``) over the KV cache and the new tokens; ``h = x + attn·W_oᵀ``;
``n2 = rmsnorm(h)·γ2``; ``y = h + (silu(n2·W_gᵀ) ⊙ n2·W_uᵀ)·W_dᵀ``. Then the final RMSNorm and
the lm_head (the embedding table when tied) → logits.

:class:`FloatModel` keeps a :class:`FloatKVCache` (post-RoPE K and V per layer), so
:meth:`FloatModel.forward` serves prefill (many tokens) and decode (one token) alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .checkpoint import EMBED, LM_HEAD, NORM, expected_shapes, layer_weights
from .config import Qwen2Config, token_ids

__all__ = ["FloatKVCache", "FloatModel", "Generation", "rope_f32"]


def rope_f32(x, pos, head_dim: int, theta: float) -> np.ndarray:
    """RoPE of ``x[T, H·d]`` at positions ``pos[T]`` (angles in float64, rotation in float32)."""
    inv = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.asarray(pos, dtype=np.float64)[:, None] * inv[None, :]
    c = np.cos(ang).astype(np.float32)[:, None, :]
    s = np.sin(ang).astype(np.float32)[:, None, :]
    t = x.shape[0]
    xr = x.reshape(t, -1, 2, head_dim // 2)
    x0, x1 = xr[:, :, 0], xr[:, :, 1]
    return np.stack([x0 * c - x1 * s, x1 * c + x0 * s], axis=2).reshape(t, -1)


@dataclass
class FloatKVCache:
    """Post-RoPE keys and values per layer, ``[T, kv_heads·d]`` float32."""
    k: list = field(default_factory=list)
    v: list = field(default_factory=list)

    @property
    def length(self) -> int:
        return 0 if not self.k else int(self.k[0].shape[0])


@dataclass
class Generation:
    """A prompt's logits and the greedy continuation."""
    prompt_logits: np.ndarray   # [P, V]: logits after each prompt token
    tokens: np.ndarray          # [K] generated token ids
    step_logits: np.ndarray     # [K, V]: step i's logits (the argmax of row i is tokens[i])


class FloatModel:
    """float32 forward of ``cfg`` with ``tensors`` (HF names, e.g. :func:`load_checkpoint`)."""

    def __init__(self, cfg: Qwen2Config, tensors: dict):
        missing = [n for n in expected_shapes(cfg) if n not in tensors]
        if missing:
            raise ValueError(f"missing tensor {missing[0]}")
        self.cfg = cfg
        self.layers = [{k: np.asarray(v, np.float32) for k, v in layer_weights(tensors, i).items()}
                       for i in range(cfg.num_hidden_layers)]
        self.embed = np.asarray(tensors[EMBED], np.float32)
        self.norm = np.asarray(tensors[NORM], np.float32)
        self.lm_head = self.embed if cfg.tie_word_embeddings else \
            np.asarray(tensors[LM_HEAD], np.float32)

    def new_cache(self) -> FloatKVCache:
        n = self.cfg.num_key_value_heads * self.cfg.head_dim
        z = [np.zeros((0, n), np.float32) for _ in range(self.cfg.num_hidden_layers)]
        return FloatKVCache(list(z), list(z))

    def _rmsnorm(self, x, g):
        var = np.mean(x * x, axis=-1, keepdims=True)
        return (x / np.sqrt(var + np.float32(self.cfg.rms_norm_eps))).astype(np.float32) * g

    def _attention(self, q, k, v, qpos, kpos):
        c = self.cfg
        d, rep = c.head_dim, c.num_attention_heads // c.num_key_value_heads
        t = q.shape[0]
        qh = q.reshape(t, c.num_attention_heads, d)
        kh = k.reshape(-1, c.num_key_value_heads, d)
        vh = v.reshape(-1, c.num_key_value_heads, d)
        mask = kpos[None, :] <= qpos[:, None]
        out = np.empty_like(qh)
        scale = np.float32(1.0 / np.sqrt(d))
        for h in range(c.num_attention_heads):
            s = (qh[:, h] @ kh[:, h // rep].T) * scale
            s = np.where(mask, s, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            out[:, h] = p @ vh[:, h // rep]
        return out.reshape(t, -1)

    def forward(self, tokens, cache: FloatKVCache) -> np.ndarray:
        """Run ``tokens`` (positions ``cache.length ..``), append their K/V to ``cache``;
        returns logits ``[T, V]`` float32. A token id outside the vocabulary raises
        ``ValueError``."""
        c = self.cfg
        tokens = token_ids(tokens, c.vocab_size)
        pos0 = cache.length
        pos = np.arange(pos0, pos0 + len(tokens))
        x = self.embed[tokens]
        for i, w in enumerate(self.layers):
            n1 = self._rmsnorm(x, w["g1"])
            q = rope_f32(n1 @ w["q"].T + w["bq"], pos, c.head_dim, c.rope_theta)
            k = rope_f32(n1 @ w["k"].T + w["bk"], pos, c.head_dim, c.rope_theta)
            v = n1 @ w["v"].T + w["bv"]
            cache.k[i] = np.concatenate([cache.k[i], k])
            cache.v[i] = np.concatenate([cache.v[i], v])
            att = self._attention(q, cache.k[i], cache.v[i], pos, np.arange(pos0 + len(tokens)))
            h = x + att @ w["o"].T
            n2 = self._rmsnorm(h, w["g2"])
            g = n2 @ w["gate"].T
            x = h + ((g / (1 + np.exp(-g))) * (n2 @ w["up"].T)) @ w["down"].T
        return (self._rmsnorm(x, self.norm) @ self.lm_head.T).astype(np.float32)

    def generate(self, prompt, k: int) -> Generation:
        """Prefill ``prompt``, then ``k`` greedy decode steps with the KV cache."""
        cache = self.new_cache()
        pl = self.forward(prompt, cache)
        last, toks, steps = pl[-1], [], []
        for _ in range(k):
            toks.append(int(np.argmax(last)))
            steps.append(last)
            last = self.forward([toks[-1]], cache)[-1]
        v = self.cfg.vocab_size
        return Generation(pl, np.array(toks, dtype=np.int64),
                          np.array(steps, dtype=np.float32).reshape(k, v))
