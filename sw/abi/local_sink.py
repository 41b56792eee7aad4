"""The node's local-packet sink: which local packet goes where, its status and registers, and
the golden model (docs/node.md §5 "Landing engine", §6 rule 1: every local output ends in
memory or a counter, so it always drains).

Every packet delivered to this node (after the packet-granular arbiter) is routed whole, by the
``Meta.op`` of its first beat, to one place (:func:`sink_route`, :class:`SinkRoute`):

* ``KV_REPLICA`` → ``kv`` (the landing engine); counter ``kv``;
* ``QUERY``, ``PARTIAL_STATE``, ``REDUCTION`` (the two-phase decode's all-reduced maxima) →
  ``decode`` (the decode lander); ``decode``;
* ``INVALIDATE`` of kind ``DRAIN`` (``Meta.seq``) → one :data:`mcf.abi.directory.DIR_OP`
  DRAIN of ``kv_id`` on ``dir_op``, payload consumed; ``drains``;
* ``INVALIDATE`` of another kind → consumed; ``drop_invalidate`` (a FREE is the sequencer's
  DIR record, which carries the packet count a packet does not);
* ``CONTROL`` → consumed; ``control`` (the barrier counter the sequencer's WAIT tests);
* ``FETCH_REQUEST`` → consumed; ``fetch_requests`` (MARS plans the holder's matching send);
* the unassigned code 7 → consumed; ``drop_op`` (never local behind a parser).

A packet is the beats up to and including the next ``last``; its fate is decided on its first
beat and every later beat follows it (a packet is never split across outputs). The payload of
a DRAIN is consumed. Status ``packets`` counts every packet.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .csrmap import counters
from .directory import DirOp
from .meta import META, InvalidateKind, Op
from .regs import Register, status_registers

__all__ = ["SinkRoute", "sink_route", "LOCAL_SINK_STATUS", "SinkBeat", "LocalSinkModel",
           "local_sink_registers"]


class SinkRoute(enum.Enum):
    """Where a local packet goes, with the status counter it is counted in."""
    KV = "kv"
    DECODE = "decode"
    DRAIN = "drains"
    DROP_INVALIDATE = "drop_invalidate"
    CONTROL = "control"
    FETCH_REQUEST = "fetch_requests"
    DROP_OP = "drop_op"


def sink_route(op: int, seq: int) -> SinkRoute:
    """The route of a packet whose first beat's ``Meta`` has raw ``op`` and ``seq``."""
    if op == Op.KV_REPLICA.value:
        return SinkRoute.KV
    if op in (Op.QUERY.value, Op.PARTIAL_STATE.value, Op.REDUCTION.value):
        return SinkRoute.DECODE
    if op == Op.INVALIDATE.value:
        return SinkRoute.DRAIN if seq == InvalidateKind.DRAIN else SinkRoute.DROP_INVALIDATE
    if op == Op.CONTROL.value:
        return SinkRoute.CONTROL
    if op == Op.FETCH_REQUEST.value:
        return SinkRoute.FETCH_REQUEST
    return SinkRoute.DROP_OP


LOCAL_SINK_STATUS = counters("packets", *(r.value for r in SinkRoute))
"""Packets seen, and per route (:class:`SinkRoute`). ``control`` is also the barrier counter
the sequencer's WAIT tests. Registers ``lsink_<field>``."""


@dataclass(frozen=True)
class SinkBeat:
    """One ``parsed_layout(64)`` beat: the raw ``Meta`` word, ``data``, ``keep``, ``last``."""
    meta: int
    data: int
    keep: int
    last: bool


@dataclass
class LocalSinkModel:
    """Golden model: feed beats with :meth:`beat`; ``kv`` and ``decode`` are the beats passed
    on (exact copies), ``dir_ops`` the ``(DirOp, kv_id)`` DRAINs emitted, ``status`` the
    :data:`LOCAL_SINK_STATUS` counters."""
    kv: list[SinkBeat] = field(default_factory=list)
    decode: list[SinkBeat] = field(default_factory=list)
    dir_ops: list[tuple[DirOp, int]] = field(default_factory=list)
    status: dict[str, int] = field(
        default_factory=lambda: {name: 0 for name, _ in LOCAL_SINK_STATUS})
    _route: SinkRoute | None = None

    def beat(self, b: SinkBeat) -> None:
        if self._route is None:
            raw = b.meta
            op = (raw >> META["op"].offset) & ((1 << META["op"].width) - 1)
            seq = (raw >> META["seq"].offset) & ((1 << META["seq"].width) - 1)
            self._route = sink_route(op, seq)
            self.status["packets"] += 1
            self.status[self._route.value] += 1
            if self._route is SinkRoute.DRAIN:
                kv_id = (raw >> META["kv_id"].offset) & ((1 << META["kv_id"].width) - 1)
                self.dir_ops.append((DirOp.DRAIN, kv_id))
        if self._route is SinkRoute.KV:
            self.kv.append(b)
        elif self._route is SinkRoute.DECODE:
            self.decode.append(b)
        if b.last:
            self._route = None


def local_sink_registers() -> list[Register]:
    """The local sink's status counters ``lsink_<counter>`` (:data:`LOCAL_SINK_STATUS`); the
    sequencer reads ``control`` directly. Not yet part of :func:`mcf.abi.csrmap.node_regmap`."""
    return status_registers("lsink", LOCAL_SINK_STATUS, "local sink")
