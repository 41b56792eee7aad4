"""The node's local-packet sink: which local packet goes where, its status and registers
(docs/node.md §5 "Landing engine", §6 rule 1: every local output ends in memory or a counter, so
it always drains). The golden model is :class:`mcf.golden.local_sink.LocalSinkModel`.

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

from .meta import InvalidateKind, Op
from .regs import Register, counters, status_registers

__all__ = ["SinkRoute", "sink_route", "LOCAL_SINK_STATUS", "local_sink_registers"]


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


def local_sink_registers() -> list[Register]:
    """The local sink's status counters ``lsink_<counter>`` (:data:`LOCAL_SINK_STATUS`); the
    sequencer reads ``control`` directly. Not yet part of :func:`mcf.abi.csrmap.node_regmap`."""
    return status_registers("lsink", LOCAL_SINK_STATUS, "local sink")
