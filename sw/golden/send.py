"""Golden model of the send unit (``mcf.hdl.node.send.SendUnit``): the packet each SEND record
becomes and the :data:`mcf.abi.send.SEND_STATUS` counters. Which records are sent and from which
address is the ABI's rule (:func:`mcf.abi.send.send_decision`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence

from mcf.abi.framing import payload_beats
from mcf.abi.landing import LandingConfig
from mcf.abi.meta import Meta, raw_fields
from mcf.abi.node import CMD, Cmd, PayloadSource
from mcf.abi.send import PACKET_WIDTH, SEND_STATUS, STAGED_SOURCES, send_decision

__all__ = ["SendModel", "send_packets"]


class SendModel:
    """Golden model of the send unit for one in-order stream of records.

    ``memory(addr, n) -> bytes`` reads DDR; ``staged``: per staged source, the queue of staged
    packets (bytes; a staged packet's beats beyond its bytes are zero); ``bad_beats``: 16-byte
    aligned DDR beat addresses that answer SLVERR (a packet touching one is counted in
    ``read_errors`` and its payload is ``None``: the bus decides those bytes)."""

    def __init__(self, cfg: LandingConfig, land_off: Sequence[int | None],
                 memory: Callable[[int, int], bytes], qbuf_base: int = 0,
                 staged: dict[PayloadSource, Iterable[bytes]] | None = None,
                 bad_beats: Iterable[int] = (), beat_bytes: int = 16):
        self.cfg, self.land_off, self.memory, self.qbuf_base = cfg, land_off, memory, qbuf_base
        self.staged = {s: deque((staged or {}).get(s, ())) for s in STAGED_SOURCES}
        self.bad_beats, self.beat_bytes = set(bad_beats), beat_bytes
        self.status = {name: 0 for name, _ in SEND_STATUS}

    def send(self, record: Cmd | int) -> tuple[Meta, bytes | None] | None:
        """The packet a record becomes (``None``: not sent)."""
        raw = record if isinstance(record, int) else int.from_bytes(record.pack(), "little")
        fields = raw_fields(raw, CMD)
        src = fields["src"]
        result, addr = send_decision(raw, self.cfg, self.land_off, self.qbuf_base)
        staged = next((s for s in STAGED_SOURCES if s.value == src), None)
        if result != "send":
            self.status[result] += 1
            if staged is not None and result == "drop_bad_record":
                self.staged[staged].popleft()          # discarded with its record
            return None
        meta = Meta.unpack(fields["meta"])
        n = meta.length
        payload: bytes | None
        if staged is not None:
            data = self.staged[staged].popleft()
            beats = max(1, payload_beats(len(data), PACKET_WIDTH))
            if beats != payload_beats(n, PACKET_WIDTH):
                self.status["framing_errors"] += 1
            padded = bytes(data) + bytes(beats * PACKET_WIDTH // 8 - len(data))
            payload = (padded + bytes(n))[:n]
        elif addr is not None:
            bb = self.beat_bytes
            first, end = addr - addr % bb, addr + n
            if any(b in self.bad_beats for b in range(first, end, bb)):
                self.status["read_errors"] += 1
                payload = None
            else:
                payload = bytes(self.memory(addr, n))
        else:
            payload = b""
        self.status["packets"] += 1
        self.status["bytes"] += n
        return meta, payload


def send_packets(records: Iterable[Cmd | int], memory: Callable[[int, int], bytes] | bytes,
                 cfg: LandingConfig, land_off: Sequence[int | None], qbuf_base: int = 0,
                 staged: dict[PayloadSource, Iterable[bytes]] | None = None
                 ) -> tuple[list[tuple[Meta, bytes | None]], dict[str, int]]:
    """The packets ``records`` (in the order the unit takes them) become, and the
    :data:`SEND_STATUS` counters. ``memory``: a reader ``(addr, n) -> bytes`` or a bytes
    object holding DDR from address 0."""
    if isinstance(memory, (bytes, bytearray)):
        buf = memory

        def memory(addr: int, n: int) -> bytes:
            return bytes(buf[addr:addr + n])
    model = SendModel(cfg, land_off, memory, qbuf_base, staged)
    packets = [p for p in (model.send(r) for r in records) if p is not None]
    return packets, model.status
