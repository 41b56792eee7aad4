"""The golden model of a decode token on the node tops (:mod:`mcf.node.decode`, docs/node.md
§7): what the root's layer outputs, the nodes' ATTEND state payloads, the merged states, the
OBUF rows, the query records and the new token's INT4 K/V must be, bit for bit.

:func:`golden_decode` follows the hardware: per node the ATTEND's single-pass online softmax
over its block list (:func:`mcf.golden.attention.attend_single`), the state payloads merged per
node in the reduction engine's order (:func:`merge_tree`) — its own state, then its children's
results (``merge_state`` of two states is commutative bit for bit, so with ≤ 2 contributions
per engine, as on N = 2, the result does not depend on arrival order; with 3 it does, and the
golden's order is own, then children by id) — and the root's lander's ``normalize``. Neither of
:class:`mcf.golden.model.IntModel`'s decode modes is this: ``single`` is one list over every
block (this golden equals it, and the prefill of one more token, when one node holds every
block); ``two_phase`` is what ``golden_decode(two_phase=True)`` computes for any split of the
blocks over nodes. :func:`prompt_blocks` names each node's KV blocks as its ATTEND lists do,
from :func:`mcf.golden.node_prefill.golden_prefill`'s records and MARS's plan (the block
placement helpers of :mod:`mcf.node.decode` and :mod:`mcf.node.layer`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..abi.decode_land import normalized_row
from ..abi.kv import kv_token_bytes, pack_kv_block, quantize_kv_rows, unpack_kv_block
from ..abi.quant import requantize, rope_pair_order
from ..abi.query import pack_query
from ..abi.softmax import empty_state, pack_state
from ..node.decode import owned_blocks, slice_tokens
from ..node.layer import slice_positions
from .attention import KVBlock, attend_fixed, attend_max, attend_single
from .nic import softmax_payload_merge
from .qwen_layer import LayerConfig, QuantLayer, layer_fixed

__all__ = ["GoldenDecodeLayer", "merge_tree", "golden_decode", "with_new_token", "prompt_blocks"]


@dataclass
class GoldenDecodeLayer:
    """One layer of a decode token: ``y`` (the layer output row, ACT), ``att`` (the root's OBUF
    rows ``[H_q·d]``: the normalised merged states), ``kv`` (per KV head the new token's INT4
    record, K in RoPE pair order — what the root's EMIT lands), ``states`` (per node, per query
    head: the state payload its ATTEND stages), ``merged`` (per query head: the root's final
    state payload) and ``queries`` (per KV head: the query payload the root's JOB writes and
    multicasts, Q in RoPE pair order)."""
    y: np.ndarray
    att: np.ndarray
    kv: list[bytes]
    states: dict[int, list[bytes]]
    merged: list[bytes]
    queries: list[bytes]


def merge_tree(states: dict[int, bytes], root: int, parents: dict[int, int]) -> bytes:
    """The state payload the reduction engines leave at ``root``: ``states[node]`` merged
    along the tree ``parents`` (every non-root node's parent), per engine its own state first,
    then each child's result in id order (:func:`mcf.golden.nic.softmax_payload_merge`)."""
    children: dict[int, list[int]] = {}
    for n, p in sorted(parents.items()):
        children.setdefault(p, []).append(n)

    def result(v: int) -> bytes:
        acc = states[v]
        for c in children.get(v, []):
            acc = softmax_payload_merge(acc, result(c))
        return acc

    return result(root)


def golden_decode(x, layers: list[QuantLayer], cfg: LayerConfig, position: int, root: int,
                  parents: dict[int, int], blocks_of, *,
                  open_block: tuple[int, int] | None = None,
                  two_phase: bool = False) -> list[GoldenDecodeLayer]:
    """The decode step's arithmetic for the root's input row ``x`` (ACT codes ``[hidden]``) at
    ``position``. ``parents``: every non-root node's parent on the reduction tree
    (:func:`mcf.node.decode.reduction_parents`; ``{}`` for one node). ``blocks_of(node, layer, g)``:
    the :class:`~mcf.golden.attention.KVBlock` list (K in RoPE pair order) ``node``'s ATTEND names
    before the new token, in list order (:func:`prompt_blocks`). Each node's state: one
    ``attend_single`` over its list (the root's ends with the new token); merged per engine as its
    own state, then each child's result in id order; the root's ``normalize``d. ``open_block =
    (first decode position, T)``: the root's list names its decode tokens in blocks of ``T``
    (:func:`mcf.node.decode._list_blocks`), so when its last block is a decode block with fewer than
    ``T`` tokens the new token joins that block (one ATTEND list entry) instead of following it —
    the online softmax depends on the partition. ``two_phase``: the maxima over every node's list
    first (:func:`~mcf.golden.attention.attend_max`; the ``ReduceOp.MAX`` all-reduce), then each
    node's :func:`~mcf.golden.attention.attend_fixed` against them, merged the same way (equal
    ``m``: exact sums, so neither the partition nor the tree matters)."""
    hd, rep = cfg.head_dim, cfg.heads // cfg.kv_heads
    pk = rope_pair_order(hd, hd)
    nodes = sorted({root, *parents})
    out: list[GoldenDecodeLayer] = []
    xa = np.asarray(x, dtype=np.int64).reshape(1, -1)
    for li, ql in enumerate(layers):
        kept = {}

        def attn(q, k, v, pos, li=li, kept=kept):
            kv, queries, states = [], [], {n: [None] * cfg.heads for n in nodes}
            for g in range(cfg.kv_heads):
                entry, new, qc, sq, query = decode_head_inputs(q, k, v, pos, g, hd, rep, pk, li)
                kv.append(entry)
                queries.append(query)
                lists = {}
                for n in nodes:
                    blocks = list(blocks_of(n, li, g))
                    if n == root:
                        blocks = with_new_token(blocks, new, open_block)
                    lists[n] = blocks
                if two_phase:
                    m_all = np.max([attend_max(qc[:, pk], sq, b) for b in lists.values()],
                                   axis=0)
                for n, blocks in lists.items():
                    if not blocks:
                        pay = [pack_state(*empty_state(hd))] * rep
                        states[n][g * rep:(g + 1) * rep] = pay
                        continue
                    if two_phase:
                        st = attend_fixed(qc[:, pk], sq, blocks, m_all)[0]
                    else:
                        st = attend_single(qc[:, pk], sq, blocks, int(pos[0]), causal=False)
                    pay = [pack_state(st.m[h], st.l[h], st.o[h]) for h in range(rep)]
                    states[n][g * rep:(g + 1) * rep] = pay
            merged = [merge_tree({n: states[n][h] for n in nodes}, root, parents)
                      for h in range(cfg.heads)]
            att = np.concatenate([np.frombuffer(normalized_row(m, hd), dtype="<i4")
                                  for m in merged]).astype(np.int64)
            kept.update(kv=kv, states=states, merged=merged, att=att, queries=queries)
            return att.reshape(1, -1)

        xa = layer_fixed(xa, ql, cfg, np.array([position]), attn=attn, act_in=True)
        out.append(GoldenDecodeLayer(xa[0].copy(), kept["att"], kept["kv"], kept["states"],
                                     kept["merged"], kept["queries"]))
    return out


def decode_head_inputs(q, k, v, pos, g: int, hd: int, rep: int, pk, layer: int):
    """KV head ``g``'s inputs of a decode token's attention (``q``: the token's query row,
    ``k``/``v``: its K/V rows, ``pos`` its position; ``rep`` query heads per KV head, ``pk``
    the RoPE pair order): ``(entry, new, qc, sq, query)`` — the token's packed KV entry, its
    :class:`KVBlock`, the group's requantised query codes and scales, and its packed query."""
    k4, sk = quantize_kv_rows(k[:, g * hd:(g + 1) * hd])
    v4, sv = quantize_kv_rows(v[:, g * hd:(g + 1) * hd])
    new = KVBlock(k4[:, pk], sk, v4, sv, np.asarray(pos, dtype=np.int64))
    qc, qm, qe = requantize(q[0, g * rep * hd:(g + 1) * rep * hd].reshape(rep, hd))
    sq = np.stack([qm, qe], axis=-1)
    return (pack_kv_block(k4[:, pk], sk, v4, sv), new, qc, sq,
            pack_query(qc[:, pk], sq, int(pos[0]), layer, g * rep))


def with_new_token(blocks: list[KVBlock], new: KVBlock, open_block) -> list[KVBlock]:
    """The root's list with the new token's block ``new``: joined to the last block when that
    is a decode block (at or after ``open_block[0]``) of fewer than ``open_block[1]`` tokens,
    else appended (``open_block`` as in :func:`golden_decode`)."""
    last = blocks[-1] if blocks else None
    if open_block and last is not None and int(last.pos[0]) >= open_block[0] and \
            len(last) < open_block[1]:
        joined = KVBlock(*(np.concatenate([a, b]) for a, b in (
            (last.k, new.k), (last.sk, new.sk), (last.v, new.v), (last.sv, new.sv),
            (last.pos, new.pos))))
        return blocks[:-1] + [joined]
    return blocks + [new]


def prompt_blocks(plan, prefill, extra=None):
    """``blocks_of`` for :func:`golden_decode` from :func:`mcf.golden.node_prefill.golden_prefill`'s
    layers (``prefill[layer].kv[g]``: every prompt token's record): each node's owned prompt blocks
    (:func:`mcf.node.decode.owned_blocks`), then its earlier decode tokens ``extra[node] = (records,
    positions)`` (``records[layer][g]``: their INT4 records in order) cut into decode blocks of
    ``⌈B/N⌉`` tokens, as the node's list names them."""
    owned = owned_blocks(plan)
    hd = plan.model.head_dim
    rec = kv_token_bytes(hd)
    T = slice_tokens(plan)

    def blocks_of(node: int, layer: int, g: int) -> list[KVBlock]:
        out = []
        for b, s in owned[node]:
            p0, n = slice_positions(plan, b, s)
            k4, sk, v4, sv = unpack_kv_block(prefill[layer].kv[g][p0 * rec:(p0 + n) * rec], hd)
            out.append(KVBlock(k4, sk, v4, sv, p0 + np.arange(n, dtype=np.int64)))
        if extra and extra.get(node):
            raw, pos = extra[node]
            k4, sk, v4, sv = unpack_kv_block(raw[layer][g], hd)
            for a in range(0, len(pos), T):
                out.append(KVBlock(k4[a:a + T], sk[a:a + T], v4[a:a + T], sv[a:a + T],
                                   np.asarray(pos[a:a + T], dtype=np.int64)))
        return out

    return blocks_of
