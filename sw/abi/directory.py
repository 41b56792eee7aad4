"""The ``kv_id`` directory: entry, event and operation layouts, status and registers
(docs/node.md §5 "Directory"; paper §4, progressive replica convergence
valid → draining → invalid).

One :data:`DIR_ENTRY` per ``kv_id``: a :class:`DirState` and the count of its packets landed
(:data:`mcf.abi.landing.LANDED_BITS`). Three things change an entry, one at a time, in arrival
order (:class:`mcf.golden.directory.DirectoryModel` is the bit-exact golden model of
``mcf.hdl.node.directory.Directory``):

* a **land event** (:data:`LAND_EVENT`, one per packet the landing engine has written and seen
  acknowledged): ``landed += 1``; ``owner`` (a local copy: the packet's ``Meta.src`` is this
  node) sets ``OWNER`` from any state; a network copy sets ``VALID`` from ``ABSENT`` and leaves
  ``VALID``, ``DRAINING`` and ``OWNER`` as they are (a drain notice is sticky until the entry is
  freed; the owner's own copy is never demoted by a replica of it);
* **FREE** ``count`` (:data:`DIR_OP`, the sequencer's DIR record): a semaphore —
  ``landed -= count``, and the entry returns to ``ABSENT`` when ``landed`` reaches 0. Refused
  (entry unchanged, counted) on an ``OWNER`` entry (``free_refused_owner``) or when ``count >
  landed`` (``free_refused_count``). ``count = 0`` on an entry with nothing landed returns it to
  ``ABSENT`` (clears a ``DRAINING`` notice that arrived before any packet);
* **DRAIN** (an ``Op.INVALIDATE`` packet of kind ``DRAIN``, turned into a :data:`DIR_OP` by the
  local sink): ``ABSENT`` or ``VALID`` → ``DRAINING``; ``DRAINING`` stays; refused on ``OWNER``
  (``drain_refused_owner``: an owner never drains its own copy).

**Counts saturate** at ``2^LANDED_BITS − 1`` (each land event that finds the count at its
maximum is counted in ``saturated``): a wrapped count would make a satisfied wait look unmet and
an unmet one look satisfied; a ``kv_id`` has at most 256 packets, so saturation means a lost
FREE (a bug upstream), which the counter reports. Events naming a ``kv_id`` at or above the
directory's depth are ignored and counted (``out_of_range``).
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import unsigned
from amaranth.lib import data, enum

from .landing import LANDED_BITS
from .meta import META
from .regs import Access, Field, Register, counters, status_registers

__all__ = [
    "DirState", "DirOp", "DIR_ENTRY", "LAND_EVENT", "DIR_OP", "DIRECTORY_STATUS", "LANDED_MAX",
    "DirEntry", "directory_registers", "DIR_PEEK_READS",
]

DIR_PEEK_READS = 16
"""Reads of ``DIR_ENTRY`` after a ``DIR_PEEK`` write before the PS gives up on ``fresh`` (the
directory reads a changed peek ``kv_id`` within a few cycles; one AXI-Lite read takes more)."""

KV_ID_BITS = META["kv_id"].width
LANDED_MAX = (1 << LANDED_BITS) - 1
"""The saturation value of an entry's ``landed`` count."""


class DirState(enum.Enum, shape=2):
    """State of one ``kv_id`` at this node (docs/node.md §5)."""
    ABSENT = 0      # nothing held (after the clear walk, and after a FREE to zero)
    VALID = 1       # a replica or fetched copy landed from the network
    DRAINING = 2    # the owner sent DRAIN: readers still allowed, no new work (MARS's rule)
    OWNER = 3       # this node's own copy (an EMIT's local landing): never freed or drained


class DirOp(enum.Enum, shape=1):
    """A directory operation other than a landing."""
    FREE = 0        # release ``count`` landed packets (the sequencer's DIR record)
    DRAIN = 1       # the owner's drain notice (an ``Op.INVALIDATE`` packet, kind DRAIN)


DIR_ENTRY = data.StructLayout({"state": DirState, "landed": unsigned(LANDED_BITS)})
"""One directory word (12 bits; zero is ``ABSENT`` with nothing landed)."""

LAND_EVENT = data.StructLayout({"kv_id": unsigned(KV_ID_BITS), "owner": unsigned(1)})
"""One landed packet: its ``kv_id`` and whether it is a local copy (``Meta.src == local_id``)."""

DIR_OP = data.StructLayout({"op": DirOp, "kv_id": unsigned(KV_ID_BITS),
                            "count": unsigned(LANDED_BITS)})
"""A FREE of ``count`` packets or a DRAIN (``count`` ignored) of ``kv_id``."""

DIRECTORY_STATUS = counters("landed", "saturated", "frees", "free_refused_owner",
                            "free_refused_count", "drains", "drain_refused_owner",
                            "out_of_range", "clear_walks")
"""Land events applied, of which found the count saturated; FREEs applied and refused by
cause; DRAINs applied and refused; events (land or op) with ``kv_id`` beyond the directory;
clear walks completed (one after reset, one per ``DIR_CTRL.clear``). Registers
``dir_<field>``."""


@dataclass(frozen=True)
class DirEntry:
    """Host view of :data:`DIR_ENTRY`."""
    state: DirState = DirState.ABSENT
    landed: int = 0

    def pack(self) -> int:
        return DIR_ENTRY.const({"state": self.state, "landed": self.landed}).as_bits()

    @classmethod
    def unpack(cls, raw: int) -> DirEntry:
        view = DIR_ENTRY.from_bits(raw)
        return cls(view.state, int(view.landed))


def directory_registers() -> list[Register]:
    """``DIR_CTRL`` (W strobe ``clear``: walk every entry back to zero), ``DIR_READY`` (R: the
    walk is over; the sequencer and the landing path wait for it), ``DIR_PEEK`` / ``DIR_ENTRY``
    (the PS reads any entry back: write the ``kv_id``, read state and landed count — how a run
    checks the owner-only layout in the node itself) and the status counters ``dir_<counter>``
    (:data:`DIRECTORY_STATUS`)."""
    return [
        Register("DIR_CTRL", (
            Field("clear", 1, Access.W, desc="start a clear walk (DIR_READY drops until done)"),
        ), "directory control"),
        Register("DIR_READY", (
            Field("ready", 1, Access.R, desc="no clear walk running: the directory is usable"),
        ), "directory ready (low for ~kv_count cycles after reset and after a clear)"),
        Register("DIR_PEEK", (
            Field("kv_id", KV_ID_BITS, Access.RW, desc="kv_id whose entry DIR_ENTRY shows"),
        ), "directory read-back address (the PS's own read port)"),
        Register("DIR_ENTRY", (
            Field("state", DirState.as_shape().width, Access.R,
                  desc="DirState of DIR_PEEK's kv_id (0 ABSENT, 1 VALID, 2 DRAINING, 3 OWNER)"),
            Field("landed", LANDED_BITS, Access.R, desc="its landed-packet count"),
            Field("fresh", 1, Access.R,
                  desc="state and landed are DIR_PEEK.kv_id's (low for a few cycles after a "
                       "DIR_PEEK write, until the directory has read the entry)"),
        ), "directory entry of DIR_PEEK.kv_id (read again while fresh is 0)"),
    ] + status_registers("dir", DIRECTORY_STATUS, "kv_id directory")
