"""Packet metadata — the one contract between MARS, the packetizer and the NIC (paper §3.2, §5).

``Meta = {stage, op, src, dst, kv_id, route_id, collective, reduce_op}`` plus the framing a real
packet needs: the payload ``length`` in bytes and a ``seq`` tag (fragment index of a block, or the
tag that groups reduction contributions). The layout is an :class:`amaranth.lib.data.StructLayout`
built from :class:`MetaWidths`; the HDL decodes it, the host packs it with the same object
(``layout.const(...).as_bits()``), and ``mcf abi`` draws it. Change a width here and everything
follows.

The default layout is exactly 64 bits, so a packet header is one beat on a 64- or 128-bit stream.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from amaranth.hdl import unsigned
from amaranth.lib import data, enum

__all__ = [
    "Stage", "Op", "InvalidateKind", "Collective", "ReduceOp", "Port",
    "MetaWidths", "meta_layout", "META", "Meta",
    "DISPATCH_RULES", "DispatchRule", "dispatch_port",
]


class Stage(enum.Enum, shape=1):
    """Inference stage the packet belongs to."""
    PREFILL = 0
    DECODE = 1


class Op(enum.Enum, shape=3):
    """What the payload carries. Code 7 is unassigned: the parser drops it as unknown."""
    KV_REPLICA = 0      # a KV block (owner copy or temporary replica) being propagated
    INVALIDATE = 1      # replica drain / invalidate request (no payload, kv_id names the block)
    QUERY = 2           # decode query vector routed to the KV shards
    PARTIAL_STATE = 3   # decode online-softmax partial state (m, l, o)
    REDUCTION = 4       # element-wise reduction message (max / sum all-reduce)
    FETCH_REQUEST = 5   # ask the holder of kv_id to send it (MARS prefetch)
    CONTROL = 6         # runtime control (barrier, route-table update, status poll)


class InvalidateKind(enum.IntEnum, shape=2):
    """What an ``Op.INVALIDATE`` packet asks for; carried in ``Meta.seq`` (paper §4, progressive
    replica convergence: valid → draining → invalid)."""
    DRAIN = 0   # owner → holder: stop offering this copy to new work; in-flight readers finish
    FREE = 1    # holder, local: release the buffer (the replica is invalid)


class Collective(enum.Enum, shape=2):
    P2P = 0
    MULTICAST = 1
    ALL_TO_ALL = 2
    ALL_REDUCE = 3


class ReduceOp(enum.Enum, shape=2):
    NONE = 0
    MAX = 1
    SUM = 2
    SOFTMAX_MERGE = 3


@dataclass(frozen=True)
class MetaWidths:
    """Widths of the integer Meta fields (the enum fields take their width from the enum)."""
    node: int = 5        # src / dst: up to 32 nodes
    route_id: int = 8    # index into the router's route table
    kv_id: int = 16      # KV block identifier (layer, chunk, slice) assigned by MARS
    length: int = 14     # payload length in bytes
    seq: int = 8         # fragment index / reduction tag


def meta_layout(widths: MetaWidths = MetaWidths()) -> data.StructLayout:
    """The metadata layout, LSB first in declaration order."""
    return data.StructLayout({
        "stage": Stage,
        "op": Op,
        "collective": Collective,
        "reduce_op": ReduceOp,
        "src": unsigned(widths.node),
        "dst": unsigned(widths.node),
        "route_id": unsigned(widths.route_id),
        "kv_id": unsigned(widths.kv_id),
        "length": unsigned(widths.length),
        "seq": unsigned(widths.seq),
    })


META = meta_layout()

_ENUM_FIELDS = {"stage": Stage, "op": Op, "collective": Collective, "reduce_op": ReduceOp}


@dataclass(frozen=True)
class Meta:
    """Host-side view of one metadata word; packs with the very layout the hardware decodes."""
    stage: Stage = Stage.PREFILL
    op: Op = Op.KV_REPLICA
    collective: Collective = Collective.P2P
    reduce_op: ReduceOp = ReduceOp.NONE
    src: int = 0
    dst: int = 0
    route_id: int = 0
    kv_id: int = 0
    length: int = 0
    seq: int = 0

    def pack(self, layout: data.StructLayout = META) -> int:
        """The metadata as an integer (bit 0 = first field's LSB). Raises on out-of-range fields."""
        fields = dataclasses.asdict(self)
        for name, field in layout:
            if name not in _ENUM_FIELDS:
                value = fields[name]
                width = field.width
                if not 0 <= value < (1 << width):
                    raise ValueError(f"Meta.{name}={value} does not fit in {width} bits")
        return layout.const(fields).as_bits()

    def to_bytes(self, layout: data.StructLayout = META) -> bytes:
        return self.pack(layout).to_bytes((layout.size + 7) // 8, "little")

    @classmethod
    def unpack(cls, raw: int, layout: data.StructLayout = META) -> Meta:
        """Decode an integer; raises ``ValueError`` for an unassigned enum code."""
        view = layout.from_bits(raw)
        return cls(**{name: view[name] if name in _ENUM_FIELDS else int(view[name])
                      for name, _ in layout})

    def replace(self, **changes: Any) -> Meta:
        return dataclasses.replace(self, **changes)


def raw_fields(raw: int, layout: data.StructLayout = META) -> dict[str, int]:
    """Every field as a plain integer, valid or not (what a parser sees on the wire)."""
    return {name: (raw >> field.offset) & ((1 << field.width) - 1) for name, field in layout}


if set(_ENUM_FIELDS) | {f.name for f in dataclasses.fields(Meta)} != {n for n, _ in META}:
    raise AssertionError("Meta dataclass and META layout disagree")  # pragma: no cover


# --- Dispatch: which NIC engine a validated packet goes to -------------------------------------

class Port(enum.Enum, shape=3):
    """Parser output ports, one per NIC engine."""
    FORWARD = 0      # forwarding / multicast router (route table decides local delivery)
    ALL_TO_ALL = 1
    REDUCTION = 2
    LOCAL = 3        # point-to-point packet addressed to this node: local sink
    CONTROL = 4


@dataclass(frozen=True)
class DispatchRule:
    """First matching rule wins. ``None`` matches anything; ``dst_is_local`` compares ``dst``
    with the node's own id."""
    port: Port
    op: tuple[Op, ...] | None = None
    collective: tuple[Collective, ...] | None = None
    reduce_op_not_none: bool | None = None
    dst_is_local: bool | None = None


DISPATCH_RULES: tuple[DispatchRule, ...] = (
    DispatchRule(Port.CONTROL, op=(Op.CONTROL,)),
    DispatchRule(Port.REDUCTION, collective=(Collective.ALL_REDUCE,)),
    DispatchRule(Port.REDUCTION, reduce_op_not_none=True),
    DispatchRule(Port.ALL_TO_ALL, collective=(Collective.ALL_TO_ALL,)),
    DispatchRule(Port.LOCAL, collective=(Collective.P2P,), dst_is_local=True),
    DispatchRule(Port.FORWARD),
)


def dispatch_port(meta: Meta, local_id: int) -> Port:
    """Golden model of the parser's dispatch decision (the HDL walks the same table)."""
    for rule in DISPATCH_RULES:
        if rule.op is not None and meta.op not in rule.op:
            continue
        if rule.collective is not None and meta.collective not in rule.collective:
            continue
        if rule.reduce_op_not_none is not None and \
                (meta.reduce_op != ReduceOp.NONE) != rule.reduce_op_not_none:
            continue
        if rule.dst_is_local is not None and (meta.dst == local_id) != rule.dst_is_local:
            continue
        return rule.port
    raise AssertionError("DISPATCH_RULES must end with a catch-all rule")  # pragma: no cover
