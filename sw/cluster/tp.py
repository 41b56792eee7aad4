"""Tensor-parallel decode of a cluster run (issue #34 items 3–4; docs/cluster.md
"Tensor-parallel decode: the golden model"): the refusals a TP run gets before any build
(:func:`check_tp`) and the run's golden model with TP decode tokens (:class:`TPClusterGolden`:
MARS's prefill as today, then every decode token by :func:`mcf.golden.tp_decode.tp_golden_decode`
— the same bits as :class:`~mcf.cluster.golden.ClusterGolden`'s replicated-root decode).

The RTL run (``mcf run --decode tp``) is not built yet.
"""

from __future__ import annotations

from ..abi.node_config import NodeConfig
from ..golden.tp_decode import (
    TPError,
    TPSplit,
    gemm_blob_bytes,
    node_weight_bytes,
    tp_golden_decode,
    tp_split,
)
from ..mars.setting import BOARD_RESERVE_MIB, KR260_DDR_BYTES
from ..model.config import Qwen2Config
from ..node.decode import prompt_blocks, reduction_parents, slice_tokens
from .golden import ClusterGolden, GoldenRun

__all__ = ["TPError", "check_tp", "tp_node_bytes", "TPClusterGolden", "tp_golden_run"]

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


class TPClusterGolden(ClusterGolden):
    """:class:`~mcf.cluster.golden.ClusterGolden` whose decode tokens run tensor-parallel over
    the plan's nodes (:func:`~mcf.golden.tp_decode.tp_golden_decode`, the split of
    :func:`~mcf.golden.tp_decode.tp_split`); the prefill, the roots, the KV placement and the
    head are the replicated run's. ``run.decode[k][l]`` is a
    :class:`~mcf.golden.tp_decode.TPDecodeLayer`."""

    def __init__(self, qm, plan, softmax: str = "single", order=None):
        super().__init__(qm, plan, softmax)
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
    """:func:`~mcf.cluster.golden.golden_run` with TP decode tokens."""
    g = TPClusterGolden(qm, plan, softmax, order)
    g.prefill(prompt)
    for k in range(decode_tokens):
        g.decode_token(k)
    return g.run
