"""Golden models of the NIC engines (paper §3.2, §5), bit-exact with ``mcf.hdl.nic``.

Pure Python/numpy on the ABI objects of ``mcf.abi`` (no simulator): the benches and tests build
expected outputs and expected status counters from these functions, independently of the HDL.

* :func:`parsed_beats` / :func:`beats_to_packet` — a packet as parsed-layout beats and back.
* :class:`RouterModel` — route-table lookup, multicast fan-out, drops and counters.
* :class:`ReduceModel` — tag matching, slot allocation, MAX / SUM / online-softmax merge in
  arrival order (``mcf.abi.softmax`` arithmetic), drops and counters.
* :func:`link_frame` / :class:`LinkRxModel` — link framing, CRC-32 (``zlib``) and sequence checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mcf.abi.framing import keep_mask, payload_beats
from mcf.abi.meta import META, Collective, Meta, ReduceOp
from mcf.abi.nic import (
    A2A_STATUS,
    CRC_BYTES,
    LANE_BYTES,
    LINK_HEADER,
    LINK_MAGIC,
    LINK_RX_STATUS,
    REDUCE_STATUS,
    ROUTER_STATUS,
    A2ADrop,
    ReduceDrop,
    link_crc,
    reduce_config_layout,
)
from mcf.abi.route import NET_PORTS, ROUTE_ENTRY
from mcf.abi.softmax import merge_state, reduce_lanes

__all__ = [
    "Packet", "parsed_beats", "beats_to_packet", "RouterModel", "ReduceModel",
    "reduce_key", "link_frame", "A2AModel", "LinkRxModel", "softmax_payload_merge",
]


@dataclass(frozen=True)
class Packet:
    meta: Meta
    payload: bytes

    @property
    def raw_meta(self) -> int:
        return self.meta.pack()


def parsed_beats(meta: Meta, payload: bytes, data_width: int) -> list[dict]:
    """The packet as parsed-layout beats: ``{"meta", "data", "keep", "last"}`` integers."""
    if meta.length != len(payload):
        raise ValueError("meta.length disagrees with the payload")
    raw = meta.pack()
    bpb = data_width // 8
    n = payload_beats(len(payload), data_width)
    if n == 0:
        return [{"meta": raw, "data": 0, "keep": 0, "last": 1}]
    beats = []
    for b in range(n):
        chunk = payload[b * bpb:(b + 1) * bpb]
        keep = keep_mask(len(payload), data_width) if b == n - 1 else (1 << bpb) - 1
        beats.append({"meta": raw, "data": int.from_bytes(chunk, "little"), "keep": keep,
                      "last": int(b == n - 1)})
    return beats


def beats_to_packet(beats: list[dict], data_width: int) -> Packet:
    """Reassemble parsed beats (checks framing: one meta, last only at the end)."""
    bpb = data_width // 8
    metas = {b["meta"] for b in beats}
    if len(metas) != 1:
        raise AssertionError(f"meta changes inside a packet: {sorted(metas)}")
    if any(b["last"] for b in beats[:-1]) or not beats[-1]["last"]:
        raise AssertionError("last misplaced")
    payload = bytearray()
    for b in beats:
        nbytes = bin(b["keep"]).count("1")
        if b["keep"] != (1 << nbytes) - 1:
            raise AssertionError(f"keep {b['keep']:#x} not contiguous from byte 0")
        payload += (b["data"] & ((1 << (8 * bpb)) - 1)).to_bytes(bpb, "little")[:nbytes]
    return Packet(Meta.unpack(metas.pop()), bytes(payload))


def _zero_counters(layout) -> dict[str, int]:
    return {name: 0 for name, _ in layout}


# --- Router ---------------------------------------------------------------------------------------

class RouterModel:
    """Expected router behaviour: ``route(input, packet)`` returns the outputs it is copied to
    (network port numbers, and ``"local"``), or a drop cause; counters follow ROUTER_STATUS."""

    def __init__(self, n_ports: int, max_payload: int):
        self.n_ports = n_ports
        self.max_payload = max_payload
        self.table: dict[int, int] = {}
        self.counters = _zero_counters(ROUTER_STATUS)

    def write_route(self, route_id: int, entry: int) -> None:
        self.table[route_id] = entry

    def destinations(self, meta: Meta) -> list | str:
        entry = ROUTE_ENTRY.from_bits(self.table.get(meta.route_id, 0))
        ports, local = int(entry.ports), int(entry.local)
        if meta.length > self.max_payload:
            return "drop_oversize"
        if ports == 0 and not local:
            return "drop_no_route"
        if ports >> self.n_ports:
            return "drop_bad_port"
        return [p for p in range(NET_PORTS) if ports >> p & 1] + (["local"] if local else [])

    def route(self, meta: Meta) -> list | str:
        dest = self.destinations(meta)
        self.counters["rx_packets"] += 1
        if isinstance(dest, str):
            self.counters[dest] += 1
            return dest
        for d in dest:
            self.counters["tx_local" if d == "local" else f"tx_port{d}"] += 1
        return dest


# --- Reduction ------------------------------------------------------------------------------------

def reduce_key(meta: Meta) -> tuple[int, int, int]:
    """Contributions to one reduction share (route_id, kv_id, seq)."""
    return meta.route_id, meta.kv_id, meta.seq


def _words(payload: bytes) -> np.ndarray:
    w = np.frombuffer(payload, dtype="<u4").astype(np.int64)
    return np.where(w >= 1 << 31, w - (1 << 32), w)


def _to_bytes(words) -> bytes:
    return (np.asarray(words, dtype=np.int64) & 0xFFFFFFFF).astype("<u4").tobytes()


def softmax_payload_merge(acc: bytes, new: bytes) -> bytes:
    """Merge two (m, l, o[..]) payloads with :func:`mcf.abi.softmax.merge_state`."""
    a, b = _words(acc), _words(new)
    m, l_sum, o = merge_state((a[0], a[1] & 0xFFFFFFFF, a[2:]), (b[0], b[1] & 0xFFFFFFFF, b[2:]))
    return _to_bytes(np.concatenate([[m], [l_sum], o]))


def combine(op: ReduceOp, acc: bytes, new: bytes) -> bytes:
    if op == ReduceOp.SOFTMAX_MERGE:
        return softmax_payload_merge(acc, new)
    name = {ReduceOp.MAX: "max", ReduceOp.SUM: "sum"}[op]
    return _to_bytes(reduce_lanes(name, _words(acc), _words(new)))


@dataclass
class _Slot:
    key: tuple[int, int, int]
    op: ReduceOp
    length: int
    k: int
    count: int
    acc: bytes
    metas: list = field(default_factory=list)


class ReduceModel:
    """Reduction engine in arrival order. ``contribute(meta, payload)`` returns the finished
    ``Packet`` (result meta = the final contribution's with ``src = local_id``; when the
    route's configuration has ``final`` set, also ``reduce_op = NONE``, ``collective =
    MULTICAST``, ``route_id = result_route`` — see :func:`mcf.abi.nic.reduce_config_layout`),
    ``None``, or a drop-cause string. ``expire_all()`` models the watchdog freeing every open
    slot."""

    def __init__(self, n_slots: int, max_payload: int, local_id: int = 0,
                 meta_layout=META):
        self.n_slots = n_slots
        self.max_payload = max_payload
        self.local_id = local_id
        self.config_layout = reduce_config_layout(meta_layout)
        self.config: dict[int, int] = {}
        self.slots: list[_Slot | None] = [None] * n_slots
        self.counters = _zero_counters(REDUCE_STATUS)

    def write_config(self, route_id: int, entry: int) -> None:
        self.config[route_id] = entry

    def _drop(self, cause: ReduceDrop) -> str:
        name = f"drop_{cause.name.lower()}"
        self.counters[name] += 1
        return name

    def contribute(self, meta: Meta, payload: bytes):
        self.counters["rx_packets"] += 1
        cfg = self.config_layout.from_bits(self.config.get(meta.route_id, 0))
        k = int(cfg.k)
        n = meta.length
        if n == 0 or n % LANE_BYTES or n > self.max_payload or (
                meta.reduce_op == ReduceOp.SOFTMAX_MERGE and n < 2 * LANE_BYTES):
            return self._drop(ReduceDrop.BAD_LENGTH)
        if meta.reduce_op == ReduceOp.NONE:
            return self._drop(ReduceDrop.BAD_OP)
        if k == 0:
            return self._drop(ReduceDrop.NO_CONFIG)
        key = reduce_key(meta)
        idx = next((i for i, s in enumerate(self.slots) if s is not None and s.key == key), None)
        if idx is not None:
            slot = self.slots[idx]
            if slot.op != meta.reduce_op or slot.length != n:
                return self._drop(ReduceDrop.MISMATCH)
            slot.acc = combine(slot.op, slot.acc, payload)
            slot.count += 1
        else:
            idx = next((i for i, s in enumerate(self.slots) if s is None), None)
            if idx is None:
                return self._drop(ReduceDrop.NO_SLOT)
            slot = _Slot(key, meta.reduce_op, n, k, 1, bytes(payload))
            self.slots[idx] = slot
        if slot.count >= slot.k:
            self.slots[idx] = None
            self.counters["tx_results"] += 1
            out = meta.replace(src=self.local_id)
            if cfg.final:
                out = out.replace(reduce_op=ReduceOp.NONE, collective=Collective.MULTICAST,
                                  route_id=int(cfg.result_route))
            return Packet(out, slot.acc)
        return None

    def expire_all(self) -> int:
        n = sum(s is not None for s in self.slots)
        self.slots = [None] * self.n_slots
        self.counters["watchdog_trips"] += n
        return n


# --- Link framing ---------------------------------------------------------------------------------

def _link_header(seq: int, magic: int = LINK_MAGIC) -> int:
    return LINK_HEADER.const({"magic": magic, "seq": seq}).as_bits()


def link_frame(packet: Packet, seq: int, data_width: int) -> list[tuple[bytes, int]]:
    """The frame a link TX sends for ``packet``: a list of (beat bytes, keep) with ``last`` on the
    final (CRC) beat; the bytes under ``keep`` are the covered/valid bytes."""
    bpb = data_width // 8
    beats = [(_link_header(seq).to_bytes(bpb, "little"), (1 << bpb) - 1),
             (packet.meta.pack().to_bytes(bpb, "little"), (1 << bpb) - 1)]
    p = packet.payload
    for b in range(payload_beats(len(p), data_width)):
        chunk = p[b * bpb:(b + 1) * bpb]
        beats.append((chunk.ljust(bpb, b"\0"), (1 << len(chunk)) - 1))
    beats.append((link_crc(beats).to_bytes(CRC_BYTES, "little").ljust(bpb, b"\0"),
                  (1 << CRC_BYTES) - 1))
    return beats


class LinkRxModel:
    """Receiver checks: CRC, header, size, sequence. ``receive(beats)`` takes one frame as a list
    of (bytes, keep) and returns the delivered ``Packet`` or the name of the counter it bumped."""

    def __init__(self, data_width: int, max_payload: int):
        self.dw = data_width
        self.max_payload = max_payload
        self.expected = 0
        self.counters = _zero_counters(LINK_RX_STATUS)
        self.seq_mod = 1 << LINK_HEADER["seq"].width

    def max_frame_beats(self) -> int:
        return 3 + payload_beats(self.max_payload, self.dw)

    def receive(self, beats: list[tuple[bytes, int]]):
        if len(beats) > self.max_frame_beats():
            self.counters["drop_oversize"] += 1
            return "drop_oversize"
        crc_beat, crc_keep = beats[-1]
        got = int.from_bytes(crc_beat[:CRC_BYTES], "little")
        if crc_keep != (1 << CRC_BYTES) - 1 or link_crc(beats[:-1]) != got:
            self.counters["crc_errors"] += 1
            return "crc_errors"
        hdr = LINK_HEADER.from_bits(int.from_bytes(beats[0][0], "little") &
                                    ((1 << LINK_HEADER.size) - 1))
        if len(beats) < 3 or int(hdr.magic) != LINK_MAGIC:
            self.counters["drop_bad_header"] += 1
            return "drop_bad_header"
        seq = int(hdr.seq)
        ahead = (seq - self.expected) % self.seq_mod
        if ahead >= self.seq_mod // 2:
            self.counters["drop_stale"] += 1
            return "drop_stale"
        if ahead:
            self.counters["seq_gaps"] += 1
            self.counters["lost_frames"] += ahead
        self.expected = (seq + 1) % self.seq_mod
        self.counters["frames_ok"] += 1
        meta = Meta.unpack(int.from_bytes(beats[1][0], "little") & ((1 << META.size) - 1))
        payload = b"".join(d[:bin(k).count("1")] for d, k in beats[2:-1])
        return Packet(meta, payload)


# --- All-to-all -----------------------------------------------------------------------------------

class A2AModel:
    """All-to-all engine: ``scatter`` splits a tensor into per-node parts (or returns
    ``"scatter_drops"``); ``part`` gathers arriving parts and returns the assembled tensor
    ``Packet`` when all ``num_nodes`` are in, ``None``, or a drop-cause name."""

    def __init__(self, data_width: int, max_nodes: int, part_max: int, n_slots: int,
                 num_nodes: int, local_id: int = 0):
        self.bpb = data_width // 8
        self.max_nodes, self.part_max, self.n_slots = max_nodes, part_max, n_slots
        self.num_nodes, self.local_id = num_nodes, local_id
        self.slots: list[dict | None] = [None] * n_slots
        self.counters = _zero_counters(A2A_STATUS)

    def scatter(self, meta: Meta, payload: bytes):
        n = self.num_nodes
        plen = meta.length // n if n else 0
        if (not 0 < n <= self.max_nodes or plen == 0 or plen * n != meta.length
                or plen % self.bpb or plen > self.part_max):
            self.counters["scatter_drops"] += 1
            return "scatter_drops"
        self.counters["scatter_ops"] += 1
        self.counters["parts_sent"] += n
        return [Packet(meta.replace(dst=j, src=self.local_id, route_id=meta.route_id + j,
                                    length=plen, seq=j), payload[j * plen:(j + 1) * plen])
                for j in range(n)]

    def part(self, meta: Meta, payload: bytes):
        self.counters["rx_parts"] += 1
        idx = next((i for i, s in enumerate(self.slots)
                    if s is not None and s["tag"] == meta.kv_id), None)
        slot = self.slots[idx] if idx is not None else None
        plen = meta.length
        if plen == 0 or plen % self.bpb or plen > self.part_max or (
                slot is not None and slot["len"] != plen):
            cause = A2ADrop.BAD_LENGTH
        elif slot is not None and meta.src in slot["parts"]:
            cause = A2ADrop.DUPLICATE
        elif meta.src >= self.num_nodes or meta.src >= self.max_nodes:
            cause = A2ADrop.BAD_SRC
        elif slot is None and all(s is not None for s in self.slots):
            cause = A2ADrop.NO_SLOT
        else:
            cause = None
        if cause is not None:
            name = f"drop_{cause.name.lower()}"
            self.counters[name] += 1
            return name
        if slot is None:
            idx = self.slots.index(None)
            slot = {"tag": meta.kv_id, "len": plen, "meta": meta, "parts": {}}
            self.slots[idx] = slot
        slot["parts"][meta.src] = payload
        if len(slot["parts"]) == self.num_nodes:
            self.slots[idx] = None
            self.counters["gathers_done"] += 1
            out = b"".join(slot["parts"][j] for j in range(self.num_nodes))
            return Packet(slot["meta"].replace(src=self.local_id, dst=self.local_id, seq=0,
                                               collective=Collective.ALL_TO_ALL,
                                               length=len(out)), out)
        return None
