"""Schedule → per-node metadata streams of ABI :class:`~mcf.abi.meta.Meta` records (paper §5).

For every chunk step each node gets an ordered list of records — what its PYNQ driver pushes into
the packetizer's metadata FIFO, one record per packet:

1. ``plan``  (issued while chunk c−1 computes): DRAIN notices from owners to replica holders,
   FETCH_REQUESTs from requesters to their nearest copy, then the KV sends that serve chunk c's
   history reads (sources; ring baselines: each node forwards to its ring successor);
2. ``free``  (when chunk c−1 has finished): local FREE invalidations of drained replicas;
3. ``store`` (after chunk c's KV is computed): the owner's replica multicast, then the
   diagonal-block requests and sends.

Conventions (what the NIC and the node's KV directory rely on):

* ``kv_id = ((block − 1)·N + slice)·L + layer``: one id per (layer, chunk, owner slice). A KV
  payload is token-major ABI records (:func:`mcf.abi.kv.kv_token_bytes` per token and KV head,
  heads in order); it is cut into fragments of whole tokens no longer than the largest
  ``Meta.length``; ``seq`` is the fragment index.
* A transfer to one node is ``Collective.P2P`` with ``dst`` = that node and the static unicast
  route; to several nodes it is ``Collective.MULTICAST`` with the step's tree route id and
  ``dst`` = its lowest-numbered destination. Whether an arriving block is kept as a replica or
  only used for the current chunk is the receiving node's directory decision (kv_id lookup).
* ``Op.INVALIDATE`` carries an :class:`InvalidateKind` in ``seq``: ``DRAIN`` (owner → holder:
  stop offering this copy to new work) or ``FREE`` (holder, local: release the buffer).
* Decode (KV-stationary): the owner of the new token multicasts its query (``Op.QUERY``, one per
  layer, ``seq`` = layer) on its broadcast tree; every node then sends one online-softmax
  partial state per query head (``Op.PARTIAL_STATE``, ``ALL_REDUCE``, ``SOFTMAX_MERGE``,
  ``seq`` = layer, ``kv_id`` = :meth:`MetaEncoder.decode_tag`) on the root's reduction tree; each
  node's reduction engine merges ``1 + children`` contributions (the configuration returned with
  the streams) before forwarding towards the root.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ..abi import META, Collective, InvalidateKind, Meta, Op, ReduceOp, Stage
from ..abi.softmax import LANE_BITS, state_words

__all__ = ["InvalidateKind", "Record", "MetaEncoder", "pack_fast", "by_node", "PHASES"]

PHASES = ("plan", "free", "store", "handoff")


@dataclass(frozen=True)
class Record:
    node: int       # whose stream (the node that pushes it)
    phase: str
    meta: Meta


_ENUMS = ("stage", "op", "collective", "reduce_op")


def _fields(layout) -> tuple:
    return tuple((name, fld.offset, fld.width, name in _ENUMS) for name, fld in layout)


_META_FIELDS = _fields(META)


def pack_fast(meta: Meta, layout=META) -> int:
    """``meta.pack()`` by shifts from the layout's field offsets (same bits, far faster);
    raises on a field that does not fit, like :meth:`Meta.pack`."""
    raw = 0
    for name, offset, width, is_enum in (_META_FIELDS if layout is META else _fields(layout)):
        v = getattr(meta, name)
        if is_enum:
            v = v.value
        if not 0 <= v < (1 << width):
            raise ValueError(f"Meta.{name}={v} does not fit in {width} bits")
        raw |= v << offset
    return raw


class MetaEncoder:
    """Ids, fragment sizes and record generation for one plan."""

    def __init__(self, model, nodes: int, num_chunks: int, max_payload: int | None = None):
        self.model, self.nodes, self.num_chunks = model, nodes, num_chunks
        limit = (1 << META["length"].width) - 1
        self.max_payload = min(max_payload or limit, limit)
        if model.kv_dtype == "int4":
            from ..abi.kv import kv_token_bytes  # the ABI's INT4 KV token record
            self.token_layer_bytes = model.kv_heads * kv_token_bytes(model.head_dim)
        else:   # no wire format in the ABI for wider KV: raw K and V rows
            self.token_layer_bytes = model.m_token_layer
        self.tokens_per_fragment = self.max_payload // self.token_layer_bytes
        if self.tokens_per_fragment < 1:
            raise ValueError(f"one token's KV ({self.token_layer_bytes} B) exceeds the largest "
                             f"payload ({self.max_payload} B)")
        need = model.layers * num_chunks * nodes
        self.kv_id_capacity = 1 << META["kv_id"].width
        if need > self.kv_id_capacity:
            raise ValueError(f"the plan needs {need} KV ids (L·C·N = {model.layers}·"
                             f"{num_chunks}·{nodes}) but Meta.kv_id names only "
                             f"{self.kv_id_capacity}; use a larger chunk")
        self.seq_capacity = 1 << META["seq"].width
        if model.layers > self.seq_capacity:
            raise ValueError("more layers than Meta.seq tags")

    # --- ids and sizes -----------------------------------------------------------------------
    def kv_id(self, layer: int, block: int, slice_: int) -> int:
        return ((block - 1) * self.nodes + slice_) * self.model.layers + layer

    def kv_key(self, kv_id: int) -> tuple[int, int, int]:
        """Inverse of :meth:`kv_id`: ``(layer, block, slice)``."""
        rest, layer = divmod(kv_id, self.model.layers)
        block0, slice_ = divmod(rest, self.nodes)
        return layer, block0 + 1, slice_

    def fragments(self, tokens: int) -> list[int]:
        """Payload lengths (bytes) of the fragments of one layer of a ``tokens``-token slice."""
        tpf = self.tokens_per_fragment
        out = [tpf * self.token_layer_bytes] * (tokens // tpf)
        if tokens % tpf:
            out.append((tokens % tpf) * self.token_layer_bytes)
        if len(out) > self.seq_capacity:
            raise ValueError(f"a slice of {tokens} tokens needs {len(out)} fragments per layer; "
                             f"Meta.seq counts {self.seq_capacity}: use a smaller chunk")
        return out

    @property
    def query_bytes(self) -> int:
        """Decode query payload: ``H_q·d`` elements in the ABI query format plus one 32-bit
        scale lane per head."""
        from ..abi.kv import Q_ELEM
        return self.model.q_heads * (self.model.head_dim * Q_ELEM.width + LANE_BITS) // 8

    @property
    def state_bytes(self) -> int:
        """One head's online-softmax state ``(m, l, o[d])`` (:mod:`mcf.abi.softmax`)."""
        return state_words(self.model.head_dim) * LANE_BITS // 8

    def decode_tag(self, k: int, head: int) -> int:
        """``kv_id`` of decode token ``k``'s reduction for ``head`` (with ``seq`` = layer, the
        reduction engine's key ``(route_id, kv_id, seq)`` is unique among in-flight tokens)."""
        return (k * self.model.q_heads + head) % (1 << META["kv_id"].width)

    # --- prefill records -----------------------------------------------------------------------
    def _sends(self, t):
        coll = Collective.MULTICAST if len(t.dests) > 1 else Collective.P2P
        for layer in range(self.model.layers):
            kid = self.kv_id(layer, t.block, t.slice)
            for seq, length in enumerate(self.fragments(t.tokens)):
                yield Record(t.src, t.phase, Meta(
                    stage=Stage.PREFILL, op=Op.KV_REPLICA, collective=coll, src=t.src,
                    dst=t.dests[0], route_id=t.route_id, kv_id=kid, length=length, seq=seq))

    def _requests(self, t, unicast):
        if t.kind != "access" or t.chain:
            return
        for r in t.dests:
            for layer in range(self.model.layers):
                yield Record(r, t.phase, Meta(
                    stage=Stage.PREFILL, op=Op.FETCH_REQUEST, collective=Collective.P2P, src=r,
                    dst=t.src, route_id=unicast(t.src),
                    kv_id=self.kv_id(layer, t.block, t.slice)))

    def _invalidate(self, key, src, dst, kind, phase, unicast):
        for layer in range(self.model.layers):
            yield Record(src, phase, Meta(
                stage=Stage.PREFILL, op=Op.INVALIDATE, collective=Collective.P2P, src=src,
                dst=dst, route_id=unicast(dst), kv_id=self.kv_id(layer, *key),
                seq=int(kind)))

    def step_records(self, step, unicast) -> list[Record]:
        """All records of one chunk step, in issue order. A slice's id is its owner node
        (``key = (block, owner)``), so the owner sends the DRAIN notices."""
        out: list[Record] = []
        for key, node in step.drains:
            out += self._invalidate(key, key[1], node, InvalidateKind.DRAIN, "plan", unicast)
        plan = [t for t in step.transfers if t.phase == "plan"]
        store = [t for t in step.transfers if t.phase == "store"]
        for t in plan:
            out += self._requests(t, unicast)
        for t in plan:
            out += self._sends(t)
        for key, node in step.frees:
            out += self._invalidate(key, node, node, InvalidateKind.FREE, "free", unicast)
        for t in store:
            if t.kind == "replica":
                out += self._sends(t)
        for t in store:
            if t.kind != "replica":
                out += self._requests(t, unicast)
        for t in store:
            if t.kind != "replica":
                out += self._sends(t)
        return out

    def handoff_records(self, handoff, unicast) -> list[Record]:
        out: list[Record] = []
        for t in handoff.transfers:
            out += self._sends(t)
        for key, node in handoff.frees:
            out += self._invalidate(key, node, node, InvalidateKind.FREE, "handoff", unicast)
        return out

    def count_step_records(self, step) -> list[int]:
        """Records per node of :meth:`step_records`, computed without building them."""
        L, n = self.model.layers, [0] * self.nodes
        for key, _node in step.drains:
            n[key[1]] += L
        for _key, node in step.frees:
            n[node] += L
        for t in step.transfers:
            n[t.src] += L * len(self.fragments(t.tokens))
            if t.kind == "access" and not t.chain:
                for r in t.dests:
                    n[r] += L
        return n

    # --- decode ------------------------------------------------------------------------------
    def decode_records(self, k: int, root: int, bcast_id: int,
                       reduce_id: int) -> list[Record]:
        """Decode token ``k`` owned by ``root``: per layer, the root's query multicast, then
        every node's partial state per query head on the root's reduction tree."""
        out: list[Record] = []
        others = [d for d in range(self.nodes) if d != root]
        for layer in range(self.model.layers):
            if others:
                out.append(Record(root, "decode", Meta(
                    stage=Stage.DECODE, op=Op.QUERY, collective=Collective.MULTICAST, src=root,
                    dst=others[0], route_id=bcast_id, kv_id=self.decode_tag(k, 0),
                    length=self.query_bytes, seq=layer)))
            for node in range(self.nodes):
                for head in range(self.model.q_heads):
                    out.append(Record(node, "decode", Meta(
                        stage=Stage.DECODE, op=Op.PARTIAL_STATE,
                        collective=Collective.ALL_REDUCE, reduce_op=ReduceOp.SOFTMAX_MERGE,
                        src=node, dst=root, route_id=reduce_id, kv_id=self.decode_tag(k, head),
                        length=self.state_bytes, seq=layer)))
        return out


def by_node(records, nodes: int) -> dict[int, list[Meta]]:
    out: dict[int, list[Meta]] = defaultdict(list)
    for r in records:
        out[r.node].append(r.meta)
    return {n: out.get(n, []) for n in range(nodes)}
