"""Schedule → per-node metadata streams of ABI :class:`~mcf.abi.meta.Meta` records (paper §5).

For every chunk step each node gets an ordered list of records, one per packet it sends (the
packet's ``Meta``) or per local FREE. :mod:`mcf.node.program` turns a node's list into its
command-ring records (docs/node.md §2, §3): each packet a SEND carrying that ``Meta`` (the
``plan`` phase's in the NET ring, the ``store`` phase's in the COMPUTE ring), each local FREE a
directory FREE in the COMPUTE ring; the driver writes the rings in DDR and rings the doorbell,
the node's ring reader fetches them and its sequencer issues them in ring order. The phases:

1. ``plan``  (issued while chunk c−1 computes): DRAIN notices from owners to replica holders,
   FETCH_REQUESTs from requesters to their nearest copy, then the KV sends that serve chunk c's
   history reads (sources; ring baselines: each node forwards to its ring successor);
2. ``free``  (when chunk c−1 has finished): local FREE invalidations of drained replicas;
3. ``store`` (after chunk c's KV is computed): the owner's replica multicast, then the
   diagonal-block requests and sends;
4. last step only, ``free`` again: the convergence FREEs of every replica left (eq 29).

Each phase is layer-major (every record of layer ``l`` before any of layer ``l + 1``), the order
the node top executes.

Every payload MARS plans fits :data:`mcf.abi.framing.MAX_PAYLOAD` (or a smaller
``max_payload``); :func:`payloads` fixes the cuts once per plan and rejects a configuration whose
single records do not fit.

Conventions (what the NIC and the node's KV directory rely on):

* ``kv_id = ((block − 1)·N + slice)·L + layer``: one id per (layer, chunk, owner slice). A slice's
  KV for one layer is ``H_kv`` KV blocks, one per KV head, each token-major ABI token records
  (:func:`mcf.abi.kv.pack_kv_block`, :func:`mcf.abi.kv.kv_token_bytes` per token). A block is cut
  at token-record boundaries into fragments of at most ``tokens_per_fragment`` tokens, one packet
  each; ``seq = f·H_kv + h`` for token group ``f`` (tokens ``f·tokens_per_fragment ..``) of KV
  head ``h``, so a receiver places a fragment from ``seq`` and the model shape alone.
* A transfer to one node is ``Collective.P2P`` with ``dst`` = that node and the static unicast
  route; to several nodes it is ``Collective.MULTICAST`` with the step's tree route id and
  ``dst`` = its lowest-numbered destination. Whether an arriving block is kept as a replica or
  only used for the current chunk is the receiving node's directory decision (kv_id lookup).
* ``Op.INVALIDATE`` carries an :class:`InvalidateKind` in ``seq``: ``DRAIN`` (owner → holder:
  stop offering this copy to new work) or ``FREE`` (holder, local: release the buffer).
* Decode (KV-stationary): per layer, the query heads are split into **waves** of at most
  ``reduce_slots`` heads (:data:`mcf.abi.limits.REDUCE_SLOTS`, the reduction engine's open
  tags). For each wave the owner of the new token multicasts the wave's query heads
  (``Op.QUERY``, payload :func:`mcf.abi.query.pack_query`, whole heads, ``seq`` = layer,
  ``kv_id`` = the tag of its first head) on its broadcast tree; every node then sends one
  online-softmax partial state per head of the wave (``Op.PARTIAL_STATE``, ``ALL_REDUCE``,
  ``SOFTMAX_MERGE``, ``seq`` = layer, ``kv_id`` = :meth:`MetaEncoder.decode_tag`) on the root's
  reduction tree; each node's reduction engine merges ``1 + children`` contributions (the
  :class:`ReduceEntry` configuration returned with the streams) before forwarding a partial result
  towards the root; the root's entry is ``final`` (``mcf.abi.nic``): its result is marked final
  (``reduce_op = NONE``, ``MULTICAST``, ``route_id`` = the root's static unicast route, local at
  the root), so it reaches the root's router and is never reduced again. The root sends a
  wave's query only after the previous wave's results have arrived (``Record.wait``), and no
  node can send a state before it has the wave's query, so at most one wave — ``reduce_slots``
  tags — is open in any reduction engine. :mod:`mcf.node.decode` turns the decode records into
  the node's rings (a ``Record.wait`` becomes ``WAIT(RESULTS_LANDED ≥ wait)``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

from ..abi import META, Collective, InvalidateKind, Meta, Op, ReduceOp, Stage
from ..abi.decode_land import decode_tag
from ..abi.framing import MAX_PAYLOAD
from ..abi.limits import REDUCE_SLOTS
from ..abi.query import query_bytes, query_fragments
from ..abi.softmax import LANE_BITS, state_words

__all__ = ["InvalidateKind", "Record", "ReduceEntry", "Payloads", "payloads", "MetaEncoder",
           "pack_fast", "by_node", "PHASES", "max_open_reductions"]

PHASES = ("plan", "free", "store", "handoff", "decode")


@dataclass(frozen=True)
class Record:
    """One metadata record of ``node``'s stream. ``wait`` (decode): issue it only once this
    many of the current decode token's reduction results have landed at this node (counted
    from the token's start; on the node a ``WAIT`` on ``SeqCounter.RESULTS_LANDED`` before
    it); 0 = no wait."""
    node: int       # whose stream (the node that issues it)
    phase: str
    meta: Meta
    wait: int = 0


class ReduceEntry(NamedTuple):
    """One reduction-engine configuration entry of a decode token (``mcf.abi.nic``
    ``reduce_config_layout``): ``node``'s engine merges ``k`` contributions per tag on
    ``route_id``. The root's entry is ``final``: its result leaves the engine as a final result
    (``reduce_op = NONE``, ``MULTICAST``, ``route_id = result_route`` — the root's static
    unicast route, which delivers locally at the root), so it is never reduced again."""
    node: int
    route_id: int
    k: int
    final: bool
    result_route: int

    def entry(self) -> int:
        """The packed configuration word for ``route_id``."""
        from ..abi.nic import reduce_config
        return reduce_config(self.k, final=self.final, result_route=self.result_route)

    def to_dict(self) -> dict:
        return self._asdict() | {"entry": self.entry()}


def _max_reduce_slots() -> int:
    from ..abi.node_config import caps_register
    width = {f.name: f.width for f in caps_register().fields}["reduce_slots"]
    return (1 << width) - 1


MAX_REDUCE_SLOTS = _max_reduce_slots()
"""The most reduction slots a node configuration can declare (its ``CAPS.reduce_slots``
field). The planner takes the actual count from the node configuration
(:attr:`mcf.abi.node_config.NodeConfig.reduce_slots`)."""

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


@dataclass(frozen=True)
class Payloads:
    """How MARS cuts every payload of a plan (all within ``max_payload``)."""
    max_payload: int
    reduce_slots: int
    token_record_bytes: int      # one token of one KV head in one layer (ABI token record)
    kv_heads: int
    tokens_per_fragment: int     # tokens per KV packet (whole token records)
    state_bytes: int             # one query head's (m, l, o) state: one reduction payload
    query_record_bytes: int      # the whole decode query of one layer (all heads, one header)
    waves: tuple                 # per wave: ((head0, heads), ...) query fragments, whole heads

    @property
    def token_layer_bytes(self) -> int:
        """KV bytes of one token in one layer (all KV heads)."""
        return self.kv_heads * self.token_record_bytes

    @property
    def query_fragments(self) -> tuple:
        return tuple(f for wave in self.waves for f in wave)

    def to_dict(self) -> dict:
        return {"max_payload_bytes": self.max_payload, "reduce_slots": self.reduce_slots,
                "kv_token_record_bytes": self.token_record_bytes,
                "kv_tokens_per_fragment": self.tokens_per_fragment,
                "kv_fragment_bytes": self.tokens_per_fragment * self.token_record_bytes,
                "state_bytes": self.state_bytes,
                "query_record_bytes": self.query_record_bytes,
                "query_waves": [[list(f) for f in w] for w in self.waves]}


def payloads(model, max_payload: int = MAX_PAYLOAD,
             reduce_slots: int = REDUCE_SLOTS) -> Payloads:
    """The payload cuts of ``model`` for packets of at most ``max_payload`` bytes and reduction
    engines with ``reduce_slots`` slots. Raises ``ValueError`` (one line) when a limit lies
    outside what the ABI allows or a single record does not fit."""
    if not 1 <= max_payload <= MAX_PAYLOAD:
        raise ValueError(f"the largest payload must lie in 1..{MAX_PAYLOAD} B "
                         f"(mcf.abi.framing.MAX_PAYLOAD), got {max_payload}")
    if not 1 <= reduce_slots <= MAX_REDUCE_SLOTS:
        raise ValueError(f"reduction slots must lie in 1..{MAX_REDUCE_SLOTS} "
                         f"(CAPS.reduce_slots), got {reduce_slots}")
    if model.kv_dtype == "int4":
        from ..abi.kv import kv_token_bytes  # the ABI's INT4 KV token record
        record = kv_token_bytes(model.head_dim)
    else:   # no wire format in the ABI for wider KV: raw K and V rows per token and KV head
        record = model.m_token_layer // model.kv_heads
    tpf = max_payload // record
    if tpf < 1:
        raise ValueError(f"one KV token record ({record} B per token and KV head) exceeds the "
                         f"largest payload ({max_payload} B)")
    state = state_words(model.head_dim) * LANE_BITS // 8
    if state > max_payload:
        raise ValueError(f"one head's softmax state ({state} B: m, l, o[{model.head_dim}]) "
                         f"exceeds the largest payload ({max_payload} B)")
    n_waves = -(-model.q_heads // reduce_slots)
    base, extra = divmod(model.q_heads, n_waves)
    waves, head0 = [], 0
    for w in range(n_waves):
        n = base + (w < extra)
        try:
            frags = query_fragments(n, model.head_dim, max_payload)
        except ValueError as exc:
            raise ValueError(f"decode query: {exc}") from None
        waves.append(tuple((head0 + h, c) for h, c in frags))
        head0 += n
    return Payloads(max_payload, reduce_slots, record, model.kv_heads, tpf, state,
                    query_bytes(model.q_heads, model.head_dim), tuple(waves))


class MetaEncoder:
    """Ids, fragment sizes and record generation for one plan."""

    def __init__(self, model, nodes: int, num_chunks: int, max_payload: int = MAX_PAYLOAD,
                 reduce_slots: int = REDUCE_SLOTS, strict: bool = True):
        """``strict=False`` (cost-only plans, e.g. the unchunked baselines): ids and fragment
        counts may exceed ``Meta.kv_id`` / ``Meta.seq``; such a plan counts records but must
        not emit them."""
        self.model, self.nodes, self.num_chunks = model, nodes, num_chunks
        self.strict = strict
        self.payloads = payloads(model, max_payload, reduce_slots)
        self.max_payload = self.payloads.max_payload
        self.token_record_bytes = self.payloads.token_record_bytes
        self.token_layer_bytes = self.payloads.token_layer_bytes
        self.tokens_per_fragment = self.payloads.tokens_per_fragment
        need = model.layers * num_chunks * nodes
        self.kv_id_capacity = 1 << META["kv_id"].width
        if need > self.kv_id_capacity and strict:
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
        """Payload lengths (bytes) of the packets of one layer of a ``tokens``-token slice, in
        ``seq`` order: token group ``f`` of KV head ``h`` is ``seq = f·H_kv + h``."""
        tpf = self.tokens_per_fragment
        groups = [tpf] * (tokens // tpf) + ([tokens % tpf] if tokens % tpf else [])
        out = [n * self.token_record_bytes for n in groups for _ in range(self.model.kv_heads)]
        if len(out) > self.seq_capacity and self.strict:
            raise ValueError(f"a slice of {tokens} tokens needs {len(out)} KV packets per layer "
                             f"({self.model.kv_heads} KV heads x {len(groups)} fragments of "
                             f"<= {tpf} tokens); Meta.seq counts {self.seq_capacity}: use a "
                             f"smaller chunk")
        return out

    def fragment_tokens(self, seq: int) -> tuple[int, int]:
        """Where KV packet ``seq`` belongs: ``(KV head, first token in the slice)``."""
        group, head = divmod(seq, self.model.kv_heads)
        return head, group * self.tokens_per_fragment

    @property
    def query_bytes(self) -> int:
        """Decode query of one layer, all heads in one record (:func:`mcf.abi.query.query_bytes`;
        MARS sends it as :attr:`Payloads.waves`)."""
        return self.payloads.query_record_bytes

    @property
    def state_bytes(self) -> int:
        """One head's online-softmax state ``(m, l, o[d])`` (:mod:`mcf.abi.softmax`)."""
        return self.payloads.state_bytes

    def decode_tag(self, k: int, head: int) -> int:
        """``kv_id`` of decode token ``k``'s reduction for ``head``:
        :func:`mcf.abi.decode_land.decode_tag` with this model's ``H_q`` (the decode lander
        inverts it, :func:`~mcf.abi.decode_land.tag_head`). With ``seq`` = layer, the reduction
        engine's key ``(route_id, kv_id, seq)`` is unique among in-flight tokens."""
        return decode_tag(k, head, self.model.q_heads)

    # --- prefill records -----------------------------------------------------------------------
    def _sends(self, t, layers=None):
        coll = Collective.MULTICAST if len(t.dests) > 1 else Collective.P2P
        for layer in range(self.model.layers) if layers is None else layers:
            kid = self.kv_id(layer, t.block, t.slice)
            for seq, length in enumerate(self.fragments(t.tokens)):
                yield Record(t.src, t.phase, Meta(
                    stage=Stage.PREFILL, op=Op.KV_REPLICA, collective=coll, src=t.src,
                    dst=t.dests[0], route_id=t.route_id, kv_id=kid, length=length, seq=seq))

    def _requests(self, t, unicast, layers=None):
        if t.kind != "access" or t.chain:
            return
        for r in t.dests:
            for layer in range(self.model.layers) if layers is None else layers:
                yield Record(r, t.phase, Meta(
                    stage=Stage.PREFILL, op=Op.FETCH_REQUEST, collective=Collective.P2P, src=r,
                    dst=t.src, route_id=unicast(t.src),
                    kv_id=self.kv_id(layer, t.block, t.slice)))

    def _invalidate(self, key, src, dst, kind, phase, unicast, layers=None):
        for layer in range(self.model.layers) if layers is None else layers:
            yield Record(src, phase, Meta(
                stage=Stage.PREFILL, op=Op.INVALIDATE, collective=Collective.P2P, src=src,
                dst=dst, route_id=unicast(dst), kv_id=self.kv_id(layer, *key),
                seq=int(kind)))

    def step_records(self, step, unicast) -> list[Record]:
        """All records of one chunk step, in issue order. A slice's id is its owner node
        (``key = (block, owner)``), so the owner sends the DRAIN notices. Every phase is
        layer-major — all of layer ``l`` before any of layer ``l + 1`` — so hardware that
        executes a stream in order never holds a later layer's record in front of an earlier
        one (docs/node.md, section 6). The last step ends with the convergence FREEs."""
        out: list[Record] = []
        L = range(self.model.layers)
        plan = [t for t in step.transfers if t.phase == "plan"]
        store = [t for t in step.transfers if t.phase == "store"]
        for layer in L:
            for key, node in step.drains:
                out += self._invalidate(key, key[1], node, InvalidateKind.DRAIN, "plan",
                                        unicast, [layer])
            for t in plan:
                out += self._requests(t, unicast, [layer])
            for t in plan:
                out += self._sends(t, [layer])
        for layer in L:
            for key, node in step.frees:
                out += self._invalidate(key, node, node, InvalidateKind.FREE, "free", unicast,
                                        [layer])
        # The store phase sends KV the step has just computed, layer by layer.
        for layer in L:
            for t in store:
                if t.kind == "replica":
                    out += self._sends(t, [layer])
            for t in store:
                if t.kind != "replica":
                    out += self._requests(t, unicast, [layer])
            for t in store:
                if t.kind != "replica":
                    out += self._sends(t, [layer])
        for layer in L:
            for key, node in step.converge:
                out += self._invalidate(key, node, node, InvalidateKind.FREE, "free", unicast,
                                        [layer])
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
        for _key, node in list(step.frees) + list(step.converge):
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
        """Decode token ``k`` owned by ``root``: per layer and wave, the root's query fragments
        (multicast; the first waits for every earlier result of the token), then every node's
        partial state per query head of the wave on the root's reduction tree."""
        out: list[Record] = []
        others = [d for d in range(self.nodes) if d != root]
        hd, done = self.model.head_dim, 0
        for layer in range(self.model.layers):
            for wave in self.payloads.waves:
                if others:
                    for head0, count in wave:
                        out.append(Record(root, "decode", Meta(
                            stage=Stage.DECODE, op=Op.QUERY, collective=Collective.MULTICAST,
                            src=root, dst=others[0], route_id=bcast_id,
                            kv_id=self.decode_tag(k, head0), length=query_bytes(count, hd),
                            seq=layer), wait=done))
                heads = [h for head0, count in wave for h in range(head0, head0 + count)]
                for node in range(self.nodes):
                    for head in heads:
                        out.append(Record(node, "decode", Meta(
                            stage=Stage.DECODE, op=Op.PARTIAL_STATE,
                            collective=Collective.ALL_REDUCE, reduce_op=ReduceOp.SOFTMAX_MERGE,
                            src=node, dst=root, route_id=reduce_id,
                            kv_id=self.decode_tag(k, head), length=self.state_bytes,
                            seq=layer)))
                done += len(heads)
        worst = max_open_reductions(out, self.nodes)
        if worst > self.payloads.reduce_slots:
            raise ValueError(f"decode token {k} would open {worst} reductions in one engine; "
                             f"the engine holds {self.payloads.reduce_slots}")
        return out


def max_open_reductions(records, nodes: int) -> int:
    """The most reduction tags ``(kv_id, seq)`` open at once in any engine when ``records``
    (one decode token, issue order) run with their waits: a tag opens with its first state and
    closes when the root has the result; a query that waits for earlier results closes every
    tag before it. With one node every contribution completes on arrival (1 at a time)."""
    if nodes == 1:
        return 1 if records else 0
    worst, open_tags = 0, set()
    for r in records:
        if r.meta.op == Op.QUERY and r.wait:
            open_tags = set()
        elif r.meta.op == Op.PARTIAL_STATE:
            open_tags.add((r.meta.kv_id, r.meta.seq))
            worst = max(worst, len(open_tags))
    return worst


def by_node(records, nodes: int) -> dict[int, list[Meta]]:
    out: dict[int, list[Meta]] = defaultdict(list)
    for r in records:
        out[r.node].append(r.meta)
    return {n: out.get(n, []) for n in range(nodes)}
