"""Integer end-to-end golden model of the Qwen2 forward: the bit-exact contract the RTL cluster
matches (issue #14 item 1). Every number is an integer code of an :mod:`mcf.abi` format.

* **Weights** (:func:`quantize_model`): per layer :func:`mcf.golden.qwen_layer.quantize_layer`
  (INT4 group-wise weights, ACT biases, GAMMA norm weights); the embedding table (= the tied
  lm_head) by :func:`mcf.quant.quantize_weight`; the final norm weight as GAMMA codes.
* **Embedding lookup** (host, :func:`embed_codes`): the INT4 row dequantised exactly into ACT:
  ``x = sat32(round_half_even(q · m_g, −(e + ACT_FRAC)))`` (a left shift when
  ``e + ACT_FRAC ≥ 0``).
* **Layer**: :func:`mcf.golden.qwen_layer.layer_fixed` with its ``attn`` hook set to
  :meth:`IntModel._attention` (so norms, projections, RoPE, SiLU and residuals are the
  GEMM/vector golden models).
* **KV** (:class:`KVStore`): each new token's post-RoPE K row and its V row of every KV head are
  requantised on chip to INT4 with a per-token KV_SCALE (:func:`mcf.abi.kv.quantize_kv_rows`)
  and stored. Attention reads them as **blocks aligned to multiples of** ``block_tokens``
  positions (block ``b`` holds positions ``b·B .. b·B + B − 1``), in position order.
* **KV format** (``kv_format``): ``KVFormat.PER_TOKEN`` (default) as above;
  ``KVFormat.PER_CHANNEL_K``: each KV head's cache is a
  :class:`mcf.golden.attention.KVChannelCache` — K quantised per channel over groups of
  ``KV_GROUP`` tokens once a group is full, the tokens of the group not yet full kept as ACT rows
  and read as an open group, V per token — read as blocks of at most ``block_tokens`` tokens of
  whole groups, then the open group (causality by the keys' positions).
* **Query**: per token and query head, the ACT row requantised to INT8 + scale
  (:func:`mcf.abi.quant.requantize`, as the vector unit does); the ``G`` query heads of one KV
  head form one attention job.
* **Prefill attention** (:meth:`IntModel.prefill`), ``prefill_mode``: ``"single"`` (default):
  the ATTEND PREFILL rule — single pass, causal, over the blocks up to the query's, normalised
  ``o / l`` (:func:`mcf.golden.attention.attend_single`,
  :func:`~mcf.golden.attention.normalize_state`); ``"exact"``: the ATTEND PREFILL EXACT rule —
  the causal maximum first, then exact sums against it
  (:func:`~mcf.golden.attention.attend_exact_rows`), independent of ``block_tokens``;
  ``"tiled"``: the ATTEND PREFILL_TILE rule of a node with the tiled path — single pass with
  P·V in the 8-bit row-scaled :data:`mcf.abi.attn_tile.P8`
  (:func:`mcf.golden.attention_tiled.attend_prefill_tiled`), whose rows differ from
  ``"single"``'s; ATTN_OUT codes are ACT codes.
* **Decode attention** (:meth:`IntModel.decode`), ``decode_mode``:
  ``"two_phase"`` (default): the global maximum over every block
  (:func:`~mcf.golden.attention.attend_max`), then exponentials against it with exact sums
  (:func:`~mcf.golden.attention.attend_fixed`), normalised — the result does not depend on how
  the blocks are split over nodes or ordered; ``"single"``: the prefill rule on one token (then a
  decode step equals the same position in a longer prefill, bit for bit).
* **Head** (host): final RMSNorm (:func:`mcf.golden.vector.rmsnorm`), requantisation and the
  INT4 GEMM with the lm_head (:func:`mcf.golden.gemm.gemm`) → ACT logits; greedy is the first
  index of the largest logit code.

Every operation is per token except attention, so a prefill split into chunks at multiples of
``block_tokens`` gives the same bits as one prefill.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import numpy as np

from mcf.abi.attn_tile import P8
from mcf.abi.fixed import round_shift, saturate
from mcf.abi.kv import quantize_kv_rows
from mcf.abi.kv_channel import KV_GROUP, KVFormat
from mcf.abi.quant import ACT, ACT_FRAC, GAMMA, requantize
from mcf.model.checkpoint import EMBED, LM_HEAD, NORM, layer_names, layer_weights
from mcf.model.config import Qwen2Config, token_ids
from mcf.quant import QuantWeight, from_act, quantize_weight

from . import vector as V
from .attention import (
    KVBlock,
    KVChannelCache,
    attend_fixed,
    attend_max,
    attend_prefill,
    attend_single,
    normalize_state,
)
from .attention_tiled import attend_prefill_tiled
from .qwen_layer import QuantLayer, _linear, layer_fixed, quantize_layer

__all__ = ["QuantModel", "quantize_model", "embed_codes", "KVStore", "IntModel",
           "IntGeneration", "DECODE_MODES", "PREFILL_MODES", "DEFAULT_BLOCK_TOKENS"]

DECODE_MODES = ("two_phase", "single")
PREFILL_MODES = ("single", "exact", "tiled")
DEFAULT_BLOCK_TOKENS = 16
"""KV block length (positions) of the golden model unless told otherwise."""


@dataclass
class QuantModel:
    """A quantised Qwen2: per-layer :class:`QuantLayer`, the INT4 embedding table, the INT4
    lm_head (the same object when tied) and the final norm's GAMMA codes."""
    cfg: Qwen2Config
    layers: list[QuantLayer]
    embed: QuantWeight
    lm_head: QuantWeight
    norm: np.ndarray

    def dequantized(self) -> dict[str, np.ndarray]:
        """float32 tensors (HF names) of the quantised weights, for the float reference."""
        out = {EMBED: self.embed.dequantize().astype(np.float32),
               NORM: GAMMA.to_float(self.norm).astype(np.float32)}
        for i, ql in enumerate(self.layers):
            names = layer_names(i)
            out.update({names[k]: v for k, v in ql.dequantized().items()})
        if not self.cfg.tie_word_embeddings:
            out[LM_HEAD] = self.lm_head.dequantize().astype(np.float32)
        return out


def quantize_model(cfg: Qwen2Config, tensors: dict) -> QuantModel:
    """Quantise a float checkpoint (HF names) with the project's quantiser."""
    lay = cfg.layer
    for n, k in (("hidden_size", cfg.hidden_size), ("intermediate_size", cfg.intermediate_size)):
        if k % lay.group:
            raise ValueError(f"{n} {k} is not a multiple of the weight group {lay.group}")
    layers = [quantize_layer(layer_weights(tensors, i), lay)
              for i in range(cfg.num_hidden_layers)]
    embed = quantize_weight(tensors[EMBED], lay.group)
    head = embed if cfg.tie_word_embeddings else quantize_weight(tensors[LM_HEAD], lay.group)
    return QuantModel(cfg, layers, embed, head, GAMMA.quantize(tensors[NORM]))


def embed_codes(qw: QuantWeight, tokens) -> np.ndarray:
    """ACT codes ``[T, hidden]`` of the INT4 rows ``tokens`` (exact up to one rounding)."""
    tokens = token_ids(tokens, qw.q.shape[0])
    prod = (qw.q[tokens].astype(np.int64)
            * np.repeat(qw.m[tokens].astype(np.int64), qw.group, axis=1))
    sh = int(qw.e) + ACT_FRAC
    val = prod << sh if sh >= 0 else round_shift(prod, -sh, "half_even")
    return saturate(val, ACT.width)


@dataclass
class KVStore:
    """INT4 KV of one layer and one KV head, token by token (positions 0, 1, ...)."""
    head_dim: int
    k: np.ndarray = None
    sk: np.ndarray = None
    v: np.ndarray = None
    sv: np.ndarray = None

    def __post_init__(self):
        d = self.head_dim
        self.k = np.zeros((0, d), np.int64)
        self.v = np.zeros((0, d), np.int64)
        self.sk = np.zeros(0, np.int64)
        self.sv = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return int(self.sk.shape[0])

    def append(self, k_act, v_act) -> None:
        """Requantise ACT rows ``[T, d]`` (the on-chip quantiser) and store them."""
        k4, sk = quantize_kv_rows(k_act)
        v4, sv = quantize_kv_rows(v_act)
        self.k = np.concatenate([self.k, k4])
        self.sk = np.concatenate([self.sk, sk])
        self.v = np.concatenate([self.v, v4])
        self.sv = np.concatenate([self.sv, sv])

    def blocks(self, block_tokens: int, upto: int | None = None) -> list[KVBlock]:
        """Position-aligned blocks of at most ``block_tokens`` tokens; ``upto``: only the blocks
        that hold a position ``<= upto``."""
        n = len(self)
        end = n if upto is None else min(n, (upto // block_tokens + 1) * block_tokens)
        pos = np.arange(n, dtype=np.int64)
        return [KVBlock(self.k[lo:min(lo + block_tokens, end)],
                        self.sk[lo:min(lo + block_tokens, end)],
                        self.v[lo:min(lo + block_tokens, end)],
                        self.sv[lo:min(lo + block_tokens, end)],
                        pos[lo:min(lo + block_tokens, end)])
                for lo in range(0, end, block_tokens)]


@dataclass
class IntGeneration:
    """Integer counterpart of :class:`mcf.model.reference.Generation` (ACT logit codes)."""
    prompt_logits: np.ndarray   # [P, V] ACT codes
    tokens: np.ndarray          # [K]
    step_logits: np.ndarray     # [K, V] ACT codes

    def float_logits(self) -> tuple[np.ndarray, np.ndarray]:
        return from_act(self.prompt_logits), from_act(self.step_logits)


@dataclass
class IntModel:
    """The integer forward of a :class:`QuantModel` with its INT4 KV cache."""
    qm: QuantModel
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    decode_mode: str = "two_phase"
    prefill_mode: str = "single"
    kv_format: KVFormat = KVFormat.PER_TOKEN
    kv_group: int = KV_GROUP       # tokens per K channel-scale group (PER_CHANNEL_K only)
    kv: list[list[KVStore | KVChannelCache]] = field(default_factory=list)
    max_violations: int = 0

    def __post_init__(self):
        if self.decode_mode not in DECODE_MODES:
            raise ValueError(f"decode_mode must be one of {DECODE_MODES}")
        if self.prefill_mode not in PREFILL_MODES:
            raise ValueError(f"prefill_mode must be one of {PREFILL_MODES}")
        if self.block_tokens < 1:
            raise ValueError("block_tokens must be at least 1")
        self.kv_format = KVFormat(self.kv_format)
        self.reset()

    @property
    def cfg(self) -> Qwen2Config:
        return self.qm.cfg

    @property
    def length(self) -> int:
        """Tokens in the KV cache (the next token's position)."""
        return len(self.kv[0][0])

    def reset(self) -> None:
        c = self.cfg
        store = (partial(KVStore, c.head_dim) if self.kv_format == KVFormat.PER_TOKEN
                 else partial(KVChannelCache, c.head_dim, self.kv_group))
        self.kv = [[store() for _ in range(c.num_key_value_heads)]
                   for _ in range(c.num_hidden_layers)]
        self.max_violations = 0

    def _attention(self, layer: int, decode: bool):
        c = self.cfg
        d, rep = c.head_dim, c.num_attention_heads // c.num_key_value_heads

        def attn(q, k, v, pos):
            t = q.shape[0]
            for g, store in enumerate(self.kv[layer]):
                store.append(k[:, g * d:(g + 1) * d], v[:, g * d:(g + 1) * d])
            out = np.empty((t, c.num_attention_heads, d), dtype=np.int64)
            qc, qm_, qe = requantize(q.reshape(t, c.num_attention_heads, d))  # per query head
            sq = np.stack([qm_, qe], axis=-1)
            for g, store in enumerate(self.kv[layer]):
                hs = slice(g * rep, (g + 1) * rep)
                blocks = store.blocks(self.block_tokens)
                if not decode and self.prefill_mode == "tiled":     # PREFILL_TILE (P8)
                    out[:, hs] = attend_prefill_tiled(qc[:, hs], sq[:, hs], blocks, pos,
                                                      p_format=P8)
                    continue
                if not decode:        # every query token of the chunk at once, causally
                    out[:, hs] = attend_prefill(qc[:, hs], sq[:, hs], blocks, pos,
                                                exact=self.prefill_mode == "exact")
                    continue
                for i in range(t):
                    if self.decode_mode == "two_phase":
                        m = attend_max(qc[i, hs], sq[i, hs], blocks)
                        st, bad = attend_fixed(qc[i, hs], sq[i, hs], blocks, m)
                        self.max_violations += bad
                    else:
                        st = attend_single(qc[i, hs], sq[i, hs], blocks)
                    out[i, hs] = normalize_state(st)
            return out.reshape(t, -1)

        return attn

    def _run(self, tokens, decode: bool) -> np.ndarray:
        c = self.cfg
        tokens = token_ids(tokens, c.vocab_size)
        pos = np.arange(self.length, self.length + len(tokens))
        if pos[-1] >= c.max_position_embeddings:
            raise ValueError(f"position {pos[-1]} beyond max_position_embeddings "
                             f"{c.max_position_embeddings}")
        x = embed_codes(self.qm.embed, tokens)
        for i, ql in enumerate(self.qm.layers):
            x = layer_fixed(x, ql, c.layer, pos, attn=self._attention(i, decode), act_in=True)
        return self.head(x)

    def head(self, x) -> np.ndarray:
        """Final RMSNorm and lm_head of ACT hidden states → ACT logit codes ``[T, V]``."""
        n = V.rmsnorm(x, self.qm.norm, self.cfg.rms_norm_eps)
        return _linear(n, self.qm.lm_head)

    def prefill(self, tokens) -> np.ndarray:
        """Prefill ``tokens`` at the next positions (any number; chunks of a prompt in order);
        returns ACT logit codes ``[T, V]``."""
        if len(np.ravel(tokens)) == 0:
            raise ValueError("empty prefill")
        return self._run(tokens, decode=False)

    def decode(self, token: int) -> np.ndarray:
        """One decode step: ACT logit codes ``[V]``."""
        return self._run([token], decode=True)[0]

    def generate(self, prompt, k: int, chunk: int | None = None) -> IntGeneration:
        """Reset, prefill ``prompt`` (in chunks of ``chunk`` tokens if given), ``k`` greedy
        decode steps."""
        self.reset()
        prompt = token_ids(prompt, self.cfg.vocab_size)
        step = len(prompt) if chunk is None else chunk
        pl = np.concatenate([self.prefill(prompt[i:i + step])
                             for i in range(0, len(prompt), step)])
        last, toks, steps = pl[-1], [], []
        for _ in range(k):
            toks.append(int(np.argmax(last)))
            steps.append(last)
            last = self.decode(toks[-1])
        return IntGeneration(pl, np.array(toks, dtype=np.int64),
                             np.array(steps, dtype=np.int64).reshape(k, self.cfg.vocab_size))
