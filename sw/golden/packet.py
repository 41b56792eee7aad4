"""Golden model of the packet path (paper §5): packetizer and parser, beat for beat.

Written against the ABI only (:mod:`mcf.abi.framing`, :mod:`mcf.abi.meta`,
:mod:`mcf.abi.csrmap`) and never against the HDL: the benches use it to build the expected
wire beats and the expected parser outputs and counters. It also provides the stimulus helpers
(random good packets, malformed packets of each :class:`~mcf.abi.csrmap.DropCause`) shared by
the amaranth.sim tests and the cocotb benches.

A beat is a :class:`WireBeat` ``(data, keep, last)`` of plain ints; a parsed beat is a
:class:`ParsedBeat` ``(meta, data, keep, last)`` with the raw metadata bits.
"""

from __future__ import annotations

import random
from typing import NamedTuple

from amaranth.lib import data

from mcf.abi.csrmap import PARSER_STATUS, DropCause
from mcf.abi.framing import encode_packet, keep_mask, payload_beats
from mcf.abi.meta import (
    META,
    Collective,
    Meta,
    Op,
    Port,
    ReduceOp,
    Stage,
    dispatch_port,
    raw_fields,
)

__all__ = [
    "WireBeat", "ParsedBeat", "bytes_to_beats", "beats_to_bytes", "packet_beats",
    "payload_frame", "packetize", "ParserModel", "classify",
    "random_meta", "random_good_packet", "malformed_packet", "with_field",
]


class WireBeat(NamedTuple):
    data: int
    keep: int
    last: bool


class ParsedBeat(NamedTuple):
    meta: int
    data: int
    keep: int
    last: bool


def bytes_to_beats(raw: bytes, data_width: int) -> list[WireBeat]:
    """Split a byte string into beats: full lanes, ``keep`` partial only on the final beat.
    An empty string gives no beat."""
    bpb = data_width // 8
    beats = []
    for off in range(0, len(raw), bpb):
        chunk = raw[off:off + bpb]
        beats.append(WireBeat(int.from_bytes(chunk, "little"), (1 << len(chunk)) - 1,
                              off + bpb >= len(raw)))
    return beats


def beats_to_bytes(beats, data_width: int) -> bytes:
    """The bytes of ``beats`` selected by ``keep`` (in lane order)."""
    bpb = data_width // 8
    out = bytearray()
    for b in beats:
        lanes = b.data.to_bytes(bpb, "little")
        out += bytes(lanes[i] for i in range(bpb) if b.keep >> i & 1)
    return bytes(out)


def packet_beats(meta: Meta, payload: bytes, data_width: int,
                 meta_layout: data.StructLayout = META) -> list[WireBeat]:
    """A well-formed packet on the wire, built from :func:`mcf.abi.framing.encode_packet`."""
    return bytes_to_beats(encode_packet(meta, payload, data_width, meta_layout), data_width)


def payload_frame(payload: bytes, data_width: int) -> list[WireBeat]:
    """What the compute side pushes into the packetizer's payload input for one packet."""
    return bytes_to_beats(payload, data_width)


def packetize(metas: list[int], frames: list[list[WireBeat]], data_width: int,
              meta_layout: data.StructLayout = META) -> list[WireBeat]:
    """Golden packetizer: one raw metadata word per packet, payload frames consumed in order by
    the packets whose ``length`` is not zero and forwarded unchanged."""
    out: list[WireBeat] = []
    frames = list(frames)
    full = (1 << (data_width // 8)) - 1
    for raw in metas:
        length = raw_fields(raw, meta_layout)["length"]
        out.append(WireBeat(raw, full, length == 0))
        if length:
            out.extend(frames.pop(0))
    return out


def _op_codes(meta_layout: data.StructLayout) -> set[int]:
    return {o.value for o in meta_layout["op"].shape}


def classify(beats: list[WireBeat], data_width: int, *, max_payload: int, num_nodes: int,
             meta_layout: data.StructLayout = META) -> DropCause | None:
    """Why the parser drops this packet (``beats`` ends with the only ``last``), or None.
    Several causes: the first in DropCause order."""
    full = (1 << (data_width // 8)) - 1
    header, payload = beats[0], beats[1:]
    f = raw_fields(header.data & ((1 << meta_layout.size) - 1), meta_layout)
    n = payload_beats(f["length"], data_width)
    causes = set()
    if f["op"] not in _op_codes(meta_layout):
        causes.add(DropCause.UNKNOWN_OP)
    if f["dst"] >= num_nodes:
        causes.add(DropCause.BAD_DST)
    if f["length"] > max_payload:
        causes.add(DropCause.OVERSIZE)
    if len(payload) < n:
        causes.add(DropCause.TRUNCATED)
    if header.keep != full or len(payload) > n:
        causes.add(DropCause.BAD_LENGTH)
    for i, b in enumerate(payload[:n]):
        want = keep_mask(f["length"], data_width) if i == n - 1 else full
        if b.keep != want:
            causes.add(DropCause.BAD_LENGTH)
    return min(causes, key=lambda c: c.value) if causes else None


class ParserModel:
    """Golden parser: feed wire beats, read per-port packets and the status counters."""

    def __init__(self, data_width: int, *, max_payload: int, local_id: int, num_nodes: int,
                 meta_layout: data.StructLayout = META):
        self.data_width = data_width
        self.max_payload = max_payload
        self.local_id = local_id
        self.num_nodes = num_nodes
        self.meta_layout = meta_layout
        self.counters = {name: 0 for name, _ in PARSER_STATUS}
        self.outputs: dict[Port, list[list[ParsedBeat]]] = {p: [] for p in Port}
        self._pending: list[WireBeat] = []

    def feed(self, beats) -> None:
        for b in beats:
            self._pending.append(WireBeat(*b))
            if b.last:
                self._packet(self._pending)
                self._pending = []

    def _packet(self, beats: list[WireBeat]) -> None:
        self.counters["rx_packets"] += 1
        cause = classify(beats, self.data_width, max_payload=self.max_payload,
                         num_nodes=self.num_nodes, meta_layout=self.meta_layout)
        if cause is not None:
            self.counters[f"drop_{cause.name.lower()}"] += 1
            return
        raw = beats[0].data & ((1 << self.meta_layout.size) - 1)
        port = dispatch_port(Meta.unpack(raw, self.meta_layout), self.local_id)
        payload = beats[1:]
        if payload:
            parsed = [ParsedBeat(raw, b.data, b.keep, i == len(payload) - 1)
                      for i, b in enumerate(payload)]
        else:
            parsed = [ParsedBeat(raw, 0, 0, True)]
        self.outputs[port].append(parsed)
        self.counters[f"tx_{port.name.lower()}"] += 1


# --- stimulus -----------------------------------------------------------------------------------

def with_field(raw: int, name: str, value: int, meta_layout: data.StructLayout = META) -> int:
    """``raw`` with one metadata field replaced by an arbitrary (possibly invalid) code."""
    fld = meta_layout[name]
    mask = ((1 << fld.width) - 1) << fld.offset
    return (raw & ~mask) | ((value << fld.offset) & mask)


def random_meta(rng: random.Random, *, length: int, num_nodes: int,
                meta_layout: data.StructLayout = META, port: Port | None = None,
                local_id: int = 0) -> Meta:
    """A valid random Meta (optionally one that dispatches to ``port``)."""
    widths = {name: fld.width for name, fld in meta_layout}
    while True:
        meta = Meta(
            stage=rng.choice(list(Stage)), op=rng.choice(list(meta_layout["op"].shape)),
            collective=rng.choice(list(Collective)), reduce_op=rng.choice(list(ReduceOp)),
            src=rng.randrange(num_nodes), dst=rng.randrange(num_nodes),
            route_id=rng.getrandbits(widths["route_id"]), kv_id=rng.getrandbits(widths["kv_id"]),
            length=length, seq=rng.getrandbits(widths["seq"]))
        if port is None:
            return meta
        # steer towards the requested port, then check with the golden dispatch
        if port == Port.LOCAL:
            meta = meta.replace(collective=Collective.P2P, reduce_op=ReduceOp.NONE,
                                dst=local_id, op=rng.choice([o for o in Op if o != Op.CONTROL]))
        elif port == Port.CONTROL:
            meta = meta.replace(op=Op.CONTROL)
        if dispatch_port(meta, local_id) == port:
            return meta


def random_good_packet(rng: random.Random, data_width: int, *, max_len: int, num_nodes: int,
                       meta_layout: data.StructLayout = META, length: int | None = None,
                       port: Port | None = None, local_id: int = 0) -> tuple[Meta, bytes]:
    if length is None:
        length = rng.randrange(max_len + 1)
    meta = random_meta(rng, length=length, num_nodes=num_nodes, meta_layout=meta_layout,
                       port=port, local_id=local_id)
    return meta, rng.randbytes(length)


def malformed_packet(rng: random.Random, cause: DropCause, data_width: int, *,
                     max_payload: int, num_nodes: int, max_len: int,
                     meta_layout: data.StructLayout = META) -> list[WireBeat]:
    """Wire beats of a packet that the parser must drop for ``cause`` (checked by
    :func:`classify` before returning). ``max_len`` bounds the beats actually sent."""
    bpb = data_width // 8
    full = (1 << bpb) - 1
    widths = {name: fld.width for name, fld in meta_layout}
    for _ in range(1000):
        length = rng.randrange(1 if cause == DropCause.TRUNCATED else 0, max_len + 1)
        meta, payload = random_good_packet(rng, data_width, max_len=max_len,
                                           num_nodes=num_nodes, meta_layout=meta_layout,
                                           length=length)
        beats = packet_beats(meta, payload, data_width, meta_layout)
        header = beats[0]
        if cause == DropCause.UNKNOWN_OP:
            bad = [c for c in range(1 << widths["op"]) if c not in _op_codes(meta_layout)]
            beats[0] = header._replace(data=with_field(header.data, "op", rng.choice(bad),
                                                       meta_layout))
        elif cause == DropCause.BAD_DST:
            beats[0] = header._replace(data=with_field(
                header.data, "dst", rng.randrange(num_nodes, 1 << widths["dst"]), meta_layout))
        elif cause == DropCause.OVERSIZE:
            big = rng.randrange(max_payload + 1, 1 << widths["length"])
            beats[0] = header._replace(data=with_field(header.data, "length", big, meta_layout))
        elif cause == DropCause.TRUNCATED:
            keep_n = rng.randrange(len(beats) - 1)  # drop at least one payload beat
            beats = beats[:keep_n + 1]
            beats[-1] = beats[-1]._replace(last=True)
        elif cause == DropCause.BAD_LENGTH:
            kind = rng.randrange(4)
            if kind == 0:    # payload longer than length: extra beats
                extra = [WireBeat(rng.getrandbits(data_width), full, False)
                         for _ in range(rng.randrange(1, 3))]
                beats = [b._replace(last=False) for b in beats] + extra
                beats[-1] = beats[-1]._replace(last=True)
            elif kind == 1 and len(beats) > 1:   # final keep inconsistent with length
                last = beats[-1]
                wrong = rng.choice([k for k in (full, full >> 1, 1, last.keep << 1 & full,
                                                last.keep >> 1) if k != last.keep])
                beats[-1] = last._replace(keep=wrong)
            elif kind == 2 and len(beats) > 2:   # non-full keep on a non-final beat
                i = rng.randrange(1, len(beats) - 1)
                beats[i] = beats[i]._replace(keep=rng.randrange(full))
            else:                                 # header keep not all ones
                beats[0] = header._replace(keep=rng.randrange(full))
        if classify(beats, data_width, max_payload=max_payload, num_nodes=num_nodes,
                    meta_layout=meta_layout) == cause:
            return beats
    raise AssertionError(f"could not build a {cause} packet")  # pragma: no cover
