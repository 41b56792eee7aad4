"""Tensor-parallel decode of a cluster run (issue #34 items 3–4; docs/cluster.md
"Tensor-parallel decode: the golden model"): the refusals a TP run gets before any build
(:func:`check_tp`); the run's golden model with TP decode tokens is
:class:`mcf.golden.cluster.TPClusterGolden`.

The RTL run (``mcf run --decode tp``, :class:`mcf.node.tp_decode.TPDecodeImage` on two node
tops): :func:`check_tp_run` (its refusals before any build) and :func:`check_tp_token` (a
token's bits on every node).
"""

from __future__ import annotations

import numpy as np

from ..abi.node_config import NodeConfig
from ..golden.tp_decode import (
    TPError,
    TPSplit,
    gemm_blob_bytes,
    node_weight_bytes,
    tp_split,
    vocab_split,
)
from ..mars.setting import BOARD_RESERVE_MIB, KR260_DDR_BYTES
from ..model.config import Qwen2Config

__all__ = ["TPError", "check_tp", "check_tp_run", "check_tp_token", "tp_node_bytes"]

MIB = 2 ** 20


def tp_node_bytes(cfg: Qwen2Config, split: TPSplit, node: int) -> int:
    """DDR bytes of ``node``'s weights in a TP run: its shards of every layer
    (:func:`mcf.golden.tp_decode.node_weight_bytes`) and the host's INT4 embedding table (and
    LM head when untied), which the board's PS keeps in the same DDR."""
    lay = cfg.layer
    host = gemm_blob_bytes(cfg.vocab_size, cfg.hidden_size, lay.group)
    if not cfg.tie_word_embeddings:
        host *= 2
    return node_weight_bytes(lay, split, node, cfg.num_hidden_layers) + host


def check_tp(cfg: Qwen2Config, nodes: int, node_config: NodeConfig, *, layout_bytes: int = 0,
             ddr_bytes: int = KR260_DDR_BYTES,
             reserve_mib: float = BOARD_RESERVE_MIB) -> TPSplit:
    """The split of ``cfg`` over ``nodes`` nodes of ``node_config``, or :class:`TPError` with
    one line naming what does not fit: the shapes (:func:`mcf.golden.tp_decode.tp_split`), a
    shard's GEMM jobs against the node's engine (rows a multiple of ``gemm_rows``, K at most
    ``gemm_k_max``, the engine's weight group), a node's weights + ``layout_bytes`` (its other
    DDR regions, e.g. :func:`mcf.node.decode.decode_layout`'s size) + ``reserve_mib`` beyond
    ``ddr_bytes`` (the KR260's 4 GiB, :data:`mcf.mars.setting.KR260_DDR_BYTES`)."""
    lay = cfg.layer
    if node_config.group != lay.group:
        raise TPError(f"the {node_config.name} node's GEMM groups {node_config.group} weights, "
                      f"the model {lay.group}")
    split = tp_split(lay, nodes)
    rows, kmax = node_config.gemm_rows, node_config.gemm_k_max

    def padded(k) -> int:          # a row-parallel shard runs the whole groups it touches
        j0, j1 = split.groups(k)
        return (j1 - j0) * lay.group

    for i in range(nodes):
        jobs = {"q": (split.q_rows(i), lay.hidden), "k/v": (split.kv_rows[i], lay.hidden),
                "gate/up": (split.inter[i], lay.hidden),
                "o": ((0, lay.hidden), padded(split.q_rows(i))),
                "down": ((0, lay.hidden), padded(split.inter[i]))}
        for name, ((r0, r1), k) in jobs.items():
            if (r1 - r0) % rows:
                raise TPError(f"TP over {nodes} nodes: node {i}'s {name} shard has {r1 - r0} "
                              f"rows, not a multiple of the {node_config.name} GEMM's {rows}")
            if k > kmax:
                raise TPError(f"TP over {nodes} nodes: node {i}'s {name} GEMM has K = {k}, "
                              f"beyond the {node_config.name} GEMM's {kmax}")
    for i in range(nodes):
        w = tp_node_bytes(cfg, split, i)
        if w + layout_bytes + reserve_mib * MIB > ddr_bytes:
            raise TPError(f"TP over {nodes} nodes: node {i} needs {w / MIB:.1f} MiB of weights "
                          f"+ {layout_bytes / MIB:.1f} MiB of buffers + {reserve_mib:g} MiB "
                          f"reserved, more than its {ddr_bytes / MIB:.0f} MiB of DDR")
    return split


def check_tp_run(cfg: Qwen2Config, nodes: int, node_config: NodeConfig) -> TPSplit:
    """:func:`check_tp` and what the node program (:mod:`mcf.node.tp_decode`) needs on top, as
    :class:`TPError` (one line): the LM head's vocabulary in whole GEMM tiles, at least one
    per node (:func:`mcf.golden.tp_decode.vocab_split`); whole groups of query heads per node
    (one ATTEND reads a KV head's query record). With ``heads / N`` heads per node that is
    ``N`` dividing the KV heads, so each node's K/V rows are whole KV heads too (the EMIT
    quantises a head's row with one scale)."""
    split = check_tp(cfg, nodes, node_config)
    vocab_split(cfg.vocab_size, nodes, node_config.gemm_rows)   # each node's LM head rows
    lay = cfg.layer
    rep = lay.heads // lay.kv_heads
    for i in range(nodes):
        h0, h1 = split.heads[i]
        if h0 % rep or h1 % rep:
            raise TPError(f"TP over {nodes} nodes: node {i}'s query heads {h0}..{h1 - 1} are "
                          f"not whole groups of {rep} (partial KV heads are not built)")
    return split


def check_tp_token(mem, tpi, layers, p, k: int) -> None:
    """Decode token ``k`` of a TP run on node ``tpi.node`` (DDR ``mem``, its
    :class:`~mcf.node.tp_decode.TPDecodeImage`) bit for bit against ``layers`` (the golden's
    :class:`~mcf.golden.tp_decode.TPDecodeLayer` list, ``AssertionError``): the OBUF rows of
    its own heads per layer, every layer's output row; at the token's root, the new token's
    INT4 K/V of every KV head in its decode block."""
    from ..node.decode import decode_kv_id, decode_seq, decode_slot, slice_tokens

    dec, sp, i = tpi.dec, tpi.split, tpi.node
    cfg, lay = dec.cfg, dec.layout
    hd, h = cfg.head_dim, cfg.hidden
    h0, h1 = sp.heads[i]
    root, j = decode_slot(p, k)
    T = slice_tokens(p)
    for li, ((_, post), gl) in enumerate(zip(tpi.layers, layers, strict=True)):
        a = dec.obuf_rows(li) + h0 * hd * 4
        got = np.frombuffer(bytes(mem[a: a + (h1 - h0) * hd * 4]), dtype="<i4")
        bad = np.flatnonzero(got != gl.att[h0 * hd: h1 * hd])
        assert bad.size == 0, (f"TP token {k} node {i} layer {li}: OBUF rows of heads "
                               f"{h0}..{h1 - 1} differ at {bad.size} words")
        y = np.frombuffer(bytes(mem[post.buf.y: post.buf.y + h * 4]), dtype="<i4")
        bad = np.flatnonzero(y != gl.y)
        assert bad.size == 0, f"TP token {k} node {i} layer {li}: output differs at {bad.size}"
        if i == root:
            for g in range(cfg.kv_heads):
                at = lay.kv_address(decode_kv_id(p, li, root, j // T), decode_seq(p, j % T, g))
                assert bytes(mem[at: at + len(gl.kv[g])]) == gl.kv[g], \
                    f"TP token {k} root {root} layer {li}: new token's KV of head {g}"
