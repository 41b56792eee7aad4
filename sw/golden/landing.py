"""Golden model of the KV landing engine (``mcf.hdl.node.landing.LandingEngine``), bit for bit:
DDR bytes written, the :data:`mcf.abi.landing.LANDING_STATUS` counters and the land events it
sends to the directory (:class:`mcf.golden.directory.DirectoryModel`). The address rule and the
drop rules are the ABI's (:func:`mcf.abi.landing.kv_address`,
:func:`mcf.abi.landing.land_decision`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from mcf.abi.landing import LANDING_STATUS, LandingConfig, LandResult, land_decision
from mcf.abi.meta import Meta

__all__ = ["LandingModel", "framing_error", "write_outcome"]


def write_outcome(status, drop: str | None, payload, length: int, write_error: bool) -> bool:
    """What the shared packet writer (``hdl/node/packet_writer.py``) does with a packet, in
    ``status``: a drop counted under its cause ``drop``, a write answered SLVERR in
    ``write_errors``, a framing mismatch in ``framing_errors`` (the packet still lands).
    True when the bytes land."""
    if drop is not None:
        status[drop] += 1
        return False
    if write_error:
        status["write_errors"] += 1
        return False
    if framing_error(payload, length):
        status["framing_errors"] += 1
    return True


def framing_error(payload, length: int) -> bool:
    """A packet whose 64-bit beats (at least one) are not ``ceil(length / 8)``: the landing
    engines' ``framing_errors`` (hdl/node/packet_writer.py ``FramingGuard`` pads or cuts it)."""
    return max(1, -(-len(payload) // 8)) != -(-length // 8)


class LandingModel:
    """Golden model of the landing engine: DDR bytes written (``mem``: address → byte),
    :data:`LANDING_STATUS` counters (``status``), the land events in order (``events``:
    ``(kv_id, owner)``, ``owner`` = ``meta.src == local_id``; what the engine's ``landed`` stream
    carries to :class:`mcf.golden.directory.DirectoryModel`) and their number per ``kv_id``
    (``landed``)."""

    def __init__(self, cfg: LandingConfig, land_off: Sequence[int | None],
                 kv_capacity: int | None = None, local_id: int = 0):
        self.cfg, self.land_off, self.kv_capacity = cfg, land_off, kv_capacity
        self.local_id = local_id
        self.mem: dict[int, int] = {}
        self.status = {name: 0 for name, _ in LANDING_STATUS}
        self.events: list[tuple[int, bool]] = []
        self.landed: Counter = Counter()

    def land(self, meta: Meta, payload: bytes, write_error: bool = False) -> LandResult:
        """One packet as 64-bit parsed beats carrying ``payload`` (its length may disagree with
        ``meta.length``: the engine writes ``meta.length`` bytes, cut or zero-padded);
        ``write_error``: its write is answered SLVERR (the bytes are then not modelled — the
        bus may or may not have stored them)."""
        result, addr = land_decision(self.cfg, meta, self.land_off, self.kv_capacity)
        drop = None if result is LandResult.LANDED else result.value
        if not write_outcome(self.status, drop, payload, meta.length, write_error):
            return result
        for i, b in enumerate((bytes(payload) + bytes(meta.length))[:meta.length]):
            self.mem[addr + i] = b
        self.status["packets"] += 1
        self.status["bytes"] += meta.length
        self.events.append((meta.kv_id, meta.src == self.local_id))
        self.landed[meta.kv_id] += 1
        return result
