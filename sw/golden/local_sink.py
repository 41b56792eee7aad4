"""Golden model of the node's local-packet sink (``mcf.hdl.node.local_sink.LocalSink``), beat by
beat: which beats go to the landing engine and the decode lander, the directory DRAINs it emits
and the :data:`mcf.abi.local_sink.LOCAL_SINK_STATUS` counters. The routing rule is the ABI's
(:func:`mcf.abi.local_sink.sink_route`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mcf.abi.directory import DirOp
from mcf.abi.local_sink import LOCAL_SINK_STATUS, SinkRoute, sink_route
from mcf.abi.meta import META

__all__ = ["SinkBeat", "LocalSinkModel"]


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
