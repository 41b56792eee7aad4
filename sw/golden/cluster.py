"""The integer golden model of a whole cluster run (issue #14 items 1 and 5): the prompt's
MARS prefill and the KV-stationary decode tokens, chained exactly as the node tops compute them,
with the embedding lookup and the token choice on the host (docs/cluster.md "Who runs what").

* **Embedding** (host): :func:`mcf.golden.model.embed_codes` — the INT4 row of the token
  dequantised into ACT codes, written into the node's input rows.
* **Prefill**: :func:`mcf.golden.node_prefill.golden_prefill` over MARS's slices (the ATTEND lists'
  block partition). A slice partition aligned to ``block_tokens`` positions gives the same bits
  as :meth:`mcf.golden.model.IntModel.prefill` (tested).
* **Decode token** ``k`` (0-based): :func:`mcf.golden.node_decode.golden_decode` at position
  ``S + k`` on the root MARS names (:func:`mcf.node.decode.decode_slot`), over every node's
  owned prompt blocks and the decode tokens each holds (KV-stationary: a decode token's KV stays
  on its root), merged along MARS's reduction tree.
* **Softmax** (``softmax``, :data:`mcf.abi.attend.RUN_SOFTMAX`): ``single`` — the online
  softmax, whose bits follow the block partition and so N; ``two_phase`` — PREFILL EXACT and
  the two-phase decode: the run equals :class:`~mcf.golden.model.IntModel` with
  ``prefill_mode="exact"``, ``decode_mode="two_phase"`` for every N (tested).
* **Tiled prefill** (``tiled``, off by default; a ``single`` run on nodes with the tiled path,
  :func:`mcf.node.layer.prefill_tile_chunk`): the prefill's attention is the PREFILL_TILE
  records' P8 rule (``golden_prefill(..., tiled=True)``; :class:`~mcf.golden.model.IntModel`'s
  ``prefill_mode="tiled"``).
* **Head** (node; :mod:`mcf.node.head`): :meth:`mcf.golden.model.IntModel.head` — final
  RMSNorm, requantisation, the INT4 lm_head GEMM — on the last prompt row, then on every decode
  token's last-layer row; the node's logits must equal these bit for bit. Greedy (host) is the
  first index of the largest logit code.

Token ``g_0`` comes from the prompt's last row; decode token ``k`` takes ``g_k`` as input and
yields ``g_{k+1}``.

**Tensor-parallel decode** (:class:`TPClusterGolden`, :func:`tp_golden_run`; issue #34,
docs/cluster.md "Tensor-parallel decode: the golden model"): MARS's prefill as above, then every
decode token by :func:`mcf.golden.tp_decode.tp_golden_decode` — the same bits as
:class:`ClusterGolden`'s replicated-root decode.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..node.decode import decode_slot, reduction_parents, slice_tokens
from ..node.layer import slice_positions
from .model import IntModel, QuantModel, embed_codes
from .node_decode import GoldenDecodeLayer, golden_decode, prompt_blocks
from .node_prefill import GoldenLayer, golden_prefill
from .qwen_layer import LayerConfig
from .tp_decode import tp_golden_decode, tp_split

__all__ = ["GoldenRun", "ClusterGolden", "golden_run", "TPClusterGolden", "tp_golden_run",
           "plan_slices", "greedy", "FloatAgreement", "float_agreement"]


def plan_slices(plan) -> list[tuple[int, int]]:
    """``(first position, tokens)`` of every ``(block, slice)`` in list order."""
    return [slice_positions(plan, b, s) for b in range(1, plan.num_chunks + 1)
            for s in range(plan.cluster.nodes)]


def greedy(logits) -> int:
    """The first index of the largest logit code."""
    return int(np.argmax(np.asarray(logits)))


@dataclass
class GoldenRun:
    """Everything a cluster run must reproduce bit for bit.

    ``prefill[l]``: layer ``l`` over the prompt (outputs, attention rows, INT4 KV per KV head);
    ``decode[k][l]``: layer ``l`` of decode token ``k``; ``logits[i]``: the ACT logit codes that
    chose ``tokens[i]`` (``i = 0``: the prompt's last row; ``i = k + 1``: decode token ``k``);
    ``roots[k]``: decode token ``k``'s root."""
    prompt: np.ndarray
    prefill: list[GoldenLayer]
    decode: list[list[GoldenDecodeLayer]] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    roots: list[int] = field(default_factory=list)


class ClusterGolden:
    """The golden run built step by step: :meth:`prefill` once, then :meth:`decode_token` per
    token (the RTL run checks each step as it goes)."""

    def __init__(self, qm: QuantModel, plan, softmax: str = "single", tiled: bool = False):
        self.qm, self.plan, self.softmax, self.tiled = qm, plan, softmax, tiled
        self.cfg: LayerConfig = qm.cfg.layer
        self._head = IntModel(qm).head
        self.run: GoldenRun | None = None
        self._extra: dict[int, tuple[list[list[bytes]], list[int]]] = {}

    @property
    def seq_len(self) -> int:
        return self.plan.num_chunks * self.plan.chunk

    def head(self, row) -> np.ndarray:
        """ACT logit codes ``[V]`` of one last-layer ACT row."""
        return self._head(np.asarray(row, dtype=np.int64).reshape(1, -1))[0]

    def embed(self, tokens) -> np.ndarray:
        return embed_codes(self.qm.embed, tokens)

    def prefill(self, prompt) -> GoldenRun:
        prompt = np.asarray(prompt, dtype=np.int64).ravel()
        if len(prompt) != self.seq_len:
            raise ValueError(f"the plan prefills {self.seq_len} tokens, the prompt has "
                             f"{len(prompt)}")
        pre = golden_prefill(self.embed(prompt), self.qm.layers, self.cfg,
                             plan_slices(self.plan), act_in=True,
                             exact=self.softmax == "two_phase", tiled=self.tiled)
        logits = self.head(pre[-1].y[-1])
        self.run = GoldenRun(prompt, pre, logits=[logits], tokens=[greedy(logits)])
        self._extra = {}
        return self.run

    def _decode_layers(self, x, position: int, root: int) -> list:
        """Every layer of one decode token (embedded row ``x``) rooted at ``root``: the
        replicated root's decode (:func:`mcf.golden.node_decode.golden_decode`)."""
        return golden_decode(x, self.qm.layers, self.cfg, position, root,
                             reduction_parents(self.plan, root),
                             prompt_blocks(self.plan, self.run.prefill, self._extra),
                             open_block=(self.seq_len, slice_tokens(self.plan)),
                             two_phase=self.softmax == "two_phase")

    def decode_token(self, k: int) -> list[GoldenDecodeLayer]:
        """Decode token ``k`` (the next one: ``k = len(run.decode)``)."""
        run = self.run
        if run is None or k != len(run.decode):
            raise ValueError(f"decode token {k} out of order")
        root, _ = decode_slot(self.plan, k)
        position = self.seq_len + k
        layers = self._decode_layers(self.embed([run.tokens[-1]])[0], position, root)
        recs, pos = self._extra.setdefault(
            root, ([[b"" for _ in range(self.cfg.kv_heads)] for _ in layers], []))
        for li, gl in enumerate(layers):
            for g, raw in enumerate(gl.kv):
                recs[li][g] += raw
        pos.append(position)
        logits = self.head(layers[-1].y)
        run.decode.append(layers)
        run.roots.append(root)
        run.logits.append(logits)
        run.tokens.append(greedy(logits))
        return layers


def golden_run(qm: QuantModel, plan, prompt, decode_tokens: int,
               softmax: str = "single") -> GoldenRun:
    """The whole run: prefill of ``prompt``, then ``decode_tokens`` decode tokens."""
    g = ClusterGolden(qm, plan, softmax)
    g.prefill(prompt)
    for k in range(decode_tokens):
        g.decode_token(k)
    return g.run


class TPClusterGolden(ClusterGolden):
    """:class:`ClusterGolden` whose decode tokens run tensor-parallel over
    the plan's nodes (:func:`~mcf.golden.tp_decode.tp_golden_decode`, the split of
    :func:`~mcf.golden.tp_decode.tp_split`); the prefill, the roots, the KV placement and the
    head are the replicated run's. ``run.decode[k][l]`` is a
    :class:`~mcf.golden.tp_decode.TPDecodeLayer`."""

    def __init__(self, qm, plan, softmax: str = "single", order=None, tiled: bool = False):
        super().__init__(qm, plan, softmax, tiled=tiled)
        self.split = tp_split(self.cfg, plan.cluster.nodes)
        self.order = order

    def _decode_layers(self, x, position: int, root: int) -> list:
        return tp_golden_decode(x, self.qm.layers, self.cfg, position, root,
                                reduction_parents(self.plan, root),
                                prompt_blocks(self.plan, self.run.prefill, self._extra),
                                self.split, open_block=(self.seq_len, slice_tokens(self.plan)),
                                two_phase=self.softmax == "two_phase", order=self.order)


def tp_golden_run(qm, plan, prompt, decode_tokens: int, softmax: str = "single",
                  order=None) -> GoldenRun:
    """:func:`golden_run` with TP decode tokens."""
    g = TPClusterGolden(qm, plan, softmax, order)
    g.prefill(prompt)
    for k in range(decode_tokens):
        g.decode_token(k)
    return g.run


@dataclass(frozen=True)
class FloatAgreement:
    """The integer run against the float reference on the same tokens (teacher-forced):
    ``top1`` the share of generated positions whose float argmax equals the run's token,
    ``max_abs_logit_error`` and ``cosine`` (mean over positions) of the logits."""
    top1: float
    max_abs_logit_error: float
    cosine: float
    positions: int


def float_agreement(cfg, tensors: dict, prompt, tokens, logits) -> FloatAgreement:
    """:class:`mcf.model.FloatModel` on the checkpoint's float weights over ``prompt`` and the
    generated ``tokens`` but the last; compared at the positions that chose each token
    (``logits[i]``: ACT codes)."""
    from ..model import FloatModel
    from ..quant import from_act

    fm = FloatModel(cfg, tensors)
    seq = np.concatenate([np.asarray(prompt, dtype=np.int64),
                          np.asarray(tokens[:-1], dtype=np.int64)])
    ref = fm.forward(seq, fm.new_cache())[len(prompt) - 1:]
    got = from_act(np.asarray(logits, dtype=np.int64))
    cos = [float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) or 1.0))
           for a, b in zip(ref, got)]
    return FloatAgreement(float(np.mean(np.argmax(ref, axis=1) == np.asarray(tokens))),
                          float(np.max(np.abs(ref - got))), float(np.mean(cos)), len(tokens))
