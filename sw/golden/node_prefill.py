"""The golden model of a prefill step's layer program (:mod:`mcf.node.layer`, docs/node.md §3):
the engines' golden models chained in the order and block partition the node's COMPUTE records
run them, over the whole prompt — what the RTL's layer outputs, attention rows and landed INT4
KV are compared with bit for bit.

* :func:`golden_prefill` — every layer: :func:`mcf.golden.qwen_layer.layer_fixed` with the
  ATTEND records' attention (K/V quantised per token and KV head as the emitter does, Q per
  query head as the vector unit does);
* :func:`prefill_attention` — one ATTEND's rows: PREFILL, PREFILL EXACT or PREFILL_TILE (P8).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..abi.attn_tile import P8
from ..abi.kv import pack_kv_block, quantize_kv_rows
from ..abi.quant import requantize, rope_pair_order
from ..quant import to_act
from .attention import KVBlock, attend_prefill
from .attention_tiled import attend_prefill_tiled
from .qwen_layer import LayerConfig, QuantLayer, layer_fixed

__all__ = ["GoldenLayer", "prefill_attention", "golden_prefill"]


@dataclass
class GoldenLayer:
    """One layer's results over the whole prompt: ``y`` (output ACT rows), ``att`` (attention
    output rows), ``kv`` (per KV head, every token's INT4 record with K in RoPE pair order —
    the bytes the node lands)."""
    y: np.ndarray
    att: np.ndarray
    kv: list[bytes]


def prefill_attention(qc, sq, blocks: list, pos, *, exact: bool = False,
                      tiled: bool = False) -> np.ndarray:
    """The prefill attention ``o / l`` (``[t, G, d]``) of query heads ``qc[t, G, d]`` (scales
    ``sq[t, G, 2]``) at positions ``pos[t]`` over ``blocks`` in list order, as the node's
    ATTEND records compute it: PREFILL (:func:`mcf.golden.attention.attend_prefill`; ``exact``:
    PREFILL EXACT) or, with ``tiled``, PREFILL_TILE — the tiled prefill with P·V in
    :data:`mcf.abi.attn_tile.P8` (:func:`mcf.golden.attention_tiled.attend_prefill_tiled`,
    SINGLE only; rows are independent, so the chunking into records and the query tile do not
    change the bits)."""
    if tiled:
        if exact:
            raise ValueError("PREFILL_TILE runs SINGLE only: a two_phase run keeps PREFILL EXACT")
        return attend_prefill_tiled(qc, sq, blocks, pos, p_format=P8)
    return attend_prefill(qc, sq, blocks, pos, exact)


def golden_prefill(x, layers: list[QuantLayer], cfg: LayerConfig,
                   block_slices, *, act_in: bool = False,
                   exact: bool = False, tiled: bool = False) -> list[GoldenLayer]:
    """The layer program's arithmetic over the whole prompt: ``x`` float rows ``[S, hidden]``
    (ACT codes with ``act_in``: the embedding lookup's rows);
    ``block_slices`` = ``[(p0, tokens), ...]`` the KV blocks in list order (MARS's slices).
    :func:`mcf.golden.qwen_layer.layer_fixed` with the engines' attention: K/V quantised per
    token and head as the emitter does, Q per head as the vector unit does, each query over
    the blocks at or before it (causal inside), block by block, as the ATTEND executor does.
    (Q and K in pair order on the node give the same scores: the permutation is shared.)
    ``exact``: the PREFILL EXACT rule (a ``two_phase`` run), whose rows do not depend on
    ``block_slices``; ``tiled``: the PREFILL_TILE records' P8 attention (a program of a
    :class:`mcf.node.layer.ModelImage` with ``tile_chunk`` > 0; :func:`prefill_attention`)."""
    hd, rep = cfg.head_dim, cfg.heads // cfg.kv_heads
    pk = rope_pair_order(hd, hd)
    out: list[GoldenLayer] = []
    xa = np.asarray(x, dtype=np.int64) if act_in else to_act(x)
    for ql in layers:
        kept = {}

        def attn(q, k, v, pos, kept=kept):
            S = q.shape[0]
            att = np.zeros_like(q)
            kept["kv"] = []
            for g in range(cfg.kv_heads):
                k4, sk = quantize_kv_rows(k[:, g * hd:(g + 1) * hd])
                v4, sv = quantize_kv_rows(v[:, g * hd:(g + 1) * hd])
                kept["kv"].append(pack_kv_block(k4[:, pk], sk, v4, sv))
                blocks = [KVBlock(k4[p0:p0 + n], sk[p0:p0 + n], v4[p0:p0 + n],
                                  sv[p0:p0 + n], pos[p0:p0 + n]) for p0, n in block_slices]
                hs = slice(g * rep * hd, (g + 1) * rep * hd)
                qc, qm, qe = requantize(q[:, hs].reshape(S, rep, hd))
                att[:, hs] = prefill_attention(qc, np.stack([qm, qe], axis=-1), blocks,
                                               pos, exact=exact,
                                               tiled=tiled).reshape(S, rep * hd)
            kept["att"] = att
            return att

        xa = layer_fixed(xa, ql, cfg, attn=attn, act_in=True)
        out.append(GoldenLayer(xa, kept["att"], kept["kv"]))
    return out
