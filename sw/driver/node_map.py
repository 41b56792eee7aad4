"""What the PYNQ driver knows about one node, as pure functions of the ABI (no PYNQ here).

Everything comes from :func:`mcf.abi.csrmap.node_regmap`, :mod:`mcf.abi.node` and
:mod:`mcf.abi.node_config`: the status snapshot type is generated from the map (one ``int`` per
read-only register, in map order), the bind-time identity check compares the ``ID`` and ``CAPS``
words with the ABI, and :class:`CommandRing` is the producer side of one command ring
(docs/node.md §2). The driver class (:mod:`mcf.driver.ip`) is a thin layer over these.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from ..abi.csrmap import node_regmap
from ..abi.node import CMD_ADDR_BITS, CMD_BYTES, CMD_RING_MAX_LOG2, Cmd, Queue
from ..abi.node_config import NODE_CONFIGS, NodeConfig, caps_register
from ..abi.regs import Access, Register, RegisterMap
from ..abi.sequencer import SEQ_HALT

__all__ = ["DriverError", "BindError", "LayoutError", "RingFull", "StepTimeout",
           "status_registers", "snapshot_type", "snapshot_from", "check_identity",
           "config_for_top", "CommandRing", "RingLayout", "NodeLimits", "node_limits",
           "check_layout", "ring_writes", "INDEX_BITS", "unpack_halt"]

INDEX_BITS = 16
"""Ring indices are free-running 16-bit counters (``CMDq_PROD``/``CMDq_CONS``)."""


class DriverError(RuntimeError):
    """Base of every error the node driver raises."""


class BindError(DriverError):
    """The IP at the address does not answer as the node the ABI describes."""


class LayoutError(DriverError):
    """A layout the node cannot hold (``KV_COUNT`` beyond its directory, a ring larger than its
    ring readers take, a misplaced ring); raised before any register is written."""


class RingFull(DriverError):
    """More records than the ring has free entries."""


class StepTimeout(DriverError):
    """A wait ran out of time. ``queue`` is the stuck queue (``None``: a counter wait),
    ``counters`` the registers read when it gave up (name → value)."""

    def __init__(self, message: str, queue: Queue | None, counters: dict[str, int]):
        super().__init__(message)
        self.queue = queue
        self.counters = counters


def status_registers(regmap: RegisterMap) -> list[Register]:
    """Every register whose fields are all read-only (counters, flags, indices, ``ID``,
    ``CAPS``), in map order."""
    return [reg for _, reg in regmap if all(f.access is Access.R for f in reg.fields)]


@functools.lru_cache(maxsize=4)
def _snapshot_type(names: tuple[str, ...]) -> type:
    return dataclasses.make_dataclass(
        "NodeSnapshot", [(n, int) for n in names], frozen=True,
        namespace={"__doc__": "Every read-only register of the node map (generated from "
                              "mcf.abi.csrmap.node_regmap); 32-bit counters wrap.",
                   "as_dict": lambda self: dataclasses.asdict(self)})


def snapshot_type(regmap: RegisterMap | None = None) -> type:
    """The frozen dataclass with one ``int`` field per status register of ``regmap``."""
    rm = regmap or node_regmap()
    return _snapshot_type(tuple(r.name for r in status_registers(rm)))


def snapshot_from(values: dict[str, int], regmap: RegisterMap | None = None):
    """A snapshot from register values read by name (every status register must be there)."""
    cls = snapshot_type(regmap)
    return cls(**{f.name: int(values[f.name]) for f in dataclasses.fields(cls)})


def config_for_top(top: str) -> NodeConfig:
    """The node configuration whose Verilog top is ``top`` (``mcf_node``, ``mcf_node_sim``)."""
    for cfg in NODE_CONFIGS.values():
        if cfg.top == top:
            return cfg
    raise BindError(f"no node configuration builds a top named {top!r} "
                    f"(known: {sorted(c.top for c in NODE_CONFIGS.values())})")


def check_identity(id_word: int, caps_word: int, config: NodeConfig,
                   regmap: RegisterMap | None = None) -> None:
    """Raise :class:`BindError` unless ``ID`` equals the map's identification word and ``CAPS``
    equals ``config``'s generate-time sizes."""
    rm = regmap or node_regmap()
    if id_word != rm.id_word:
        got, want = rm.register("ID").unpack(id_word), rm.register("ID").unpack(rm.id_word)
        raise BindError(f"node ID register reads {id_word:#010x} (ident {got['ident']:#06x}, "
                        f"version {got['version']:#06x}); this driver speaks ident "
                        f"{want['ident']:#06x} version {want['version']:#06x} — the bitstream "
                        "and the mcf package do not match")
    if caps_word != config.caps():
        caps = rm.register("CAPS")
        got, want = caps.unpack(caps_word), caps.unpack(config.caps())
        diff = ", ".join(f"{k}={got[k]} (want {want[k]})" for k in got if got[k] != want[k])
        raise BindError(f"node CAPS {caps_word:#010x} does not match the {config.name!r} "
                        f"configuration: {diff}")


def unpack_halt(word: int) -> dict[str, int]:
    """``seq<q>_halt`` → its :data:`mcf.abi.sequencer.SEQ_HALT` fields."""
    return {name: (word >> fld.offset) & ((1 << fld.width) - 1) for name, fld in SEQ_HALT}


@dataclass
class CommandRing:
    """The producer side of ring ``queue``: ``2^log2`` entries of :data:`CMD_BYTES` at byte
    ``offset`` of a host buffer; ``prod`` is the free-running producer index (the value the
    next doorbell writes)."""
    queue: Queue
    offset: int
    log2: int
    prod: int = 0

    def __post_init__(self):
        if not 1 <= self.log2 <= CMD_RING_MAX_LOG2:
            raise ValueError(f"ring size 2^{self.log2} outside 2^1..2^{CMD_RING_MAX_LOG2}")

    @property
    def entries(self) -> int:
        return 1 << self.log2

    @property
    def capacity(self) -> int:
        """Records that may be in flight: every entry, except at ``2^16`` entries one fewer —
        ``PROD − CONS`` is taken modulo ``2^16``, so a full ring of ``2^16`` would read as
        empty and the doorbell would publish nothing (docs/node.md §2)."""
        return min(self.entries, (1 << INDEX_BITS) - 1)

    def free(self, cons: int) -> int:
        """Entries the producer may still write, given the hardware's consumer index."""
        return self.capacity - ((self.prod - cons) % (1 << INDEX_BITS))

    def put(self, mem, cmds: list[Cmd], cons: int) -> int:
        """Write ``cmds`` after the producer index into ``mem`` (a writable byte view of the
        buffer holding the ring); return the new producer index. Raises :class:`RingFull`
        (nothing written) if they do not fit beside the ``PROD − cons`` entries in flight."""
        if len(cmds) > self.free(cons):
            raise RingFull(f"CMD{self.queue.value} ({self.queue.name}): {len(cmds)} records, "
                           f"{self.free(cons)} of {self.capacity} entries free")
        for cmd in cmds:
            at = self.offset + (self.prod % self.entries) * CMD_BYTES
            mem[at: at + CMD_BYTES] = cmd.pack()
            self.prod = (self.prod + 1) % (1 << INDEX_BITS)
        return self.prod


@dataclass(frozen=True)
class RingLayout:
    """The two command rings alone, for driving a node by hand (no MARS plan, no KV region):
    the fields of :class:`mcf.node.layout.NodeLayout` that :meth:`NodeDriver.attach` and
    :meth:`NodeDriver.configure_rings` use. ``base``: the buffer's physical address;
    ``cmd_base``: CMD0 (NET), CMD1 (COMPUTE); ``size``: bytes from ``base``."""
    base: int
    cmd_base: tuple[int, int]
    cmd_log2: int
    size: int

    @classmethod
    def at(cls, base: int, log2: int = 8) -> RingLayout:
        """Both rings of ``2^log2`` entries back to back from ``base`` (NET first)."""
        ring = CMD_BYTES << log2
        return cls(base=base, cmd_base=(base, base + ring), cmd_log2=log2, size=2 * ring)

    @staticmethod
    def nbytes(log2: int = 8) -> int:
        """Bytes :meth:`at` needs: two rings of ``2^log2`` 16-byte entries."""
        return 2 * (CMD_BYTES << log2)


@dataclass(frozen=True)
class NodeLimits:
    """What a node can hold, from its ``CAPS`` word: directory entries (``KV_COUNT`` ≤), the
    largest ring (``CMDq_SIZE`` ≤) and the query tokens of an ATTEND PREFILL_TILE record
    (``tile_max_chunk``; 0: no tiled path — the node program issues per-token PREFILL records,
    :func:`mcf.node.layer.prefill_tile_chunk`)."""
    kv_count: int
    ring_max_log2: int
    tile_max_chunk: int = 0


def node_limits(caps_word: int, config: NodeConfig | None = None) -> NodeLimits:
    """The limits ``CAPS`` (as read from the device) states, never above ``config``'s nor the
    ABI's ring bound (the driver's indices are 16-bit)."""
    caps = caps_register().unpack(caps_word)
    kv = 1 << caps["kv_count_log2"]
    ring = min(caps["ring_max_log2"], CMD_RING_MAX_LOG2)
    tile = 1 << caps["tile_chunk_log2"] if caps["tile_chunk_log2"] else 0
    if config is not None:
        kv = min(kv, config.kv_count)
        tile = min(tile, config.tile_max_chunk)
    return NodeLimits(kv_count=kv, ring_max_log2=ring, tile_max_chunk=tile)


def check_layout(layout, limits: NodeLimits) -> None:
    """Raise :class:`LayoutError` (one line) unless the node can hold ``layout`` (a
    :class:`mcf.node.layout.NodeLayout` or a :class:`RingLayout`): ``1 ≤ cmd_log2 ≤
    ring_max_log2``, both rings 16-byte aligned inside ``[base, base + size)`` and below
    ``2^40``, and — with a KV region — ``KV_COUNT`` ≤ the directory's entries."""
    log2 = layout.cmd_log2
    if not 1 <= log2 <= limits.ring_max_log2:
        raise LayoutError(f"ring size 2^{log2} (cmd_log2 {log2}) is outside what the node's ring "
                          f"readers take: 2^1..2^{limits.ring_max_log2} "
                          f"(CAPS.ring_max_log2 {limits.ring_max_log2})")
    ring_bytes = CMD_BYTES << log2
    for q, at in enumerate(layout.cmd_base):
        if at % CMD_BYTES:
            raise LayoutError(f"ring CMD{q} base {at:#x} is not {CMD_BYTES}-byte aligned")
        if not (layout.base <= at and at + ring_bytes <= layout.base + layout.size):
            raise LayoutError(f"ring CMD{q} ({at:#x} + {ring_bytes} B) lies outside the layout "
                              f"({layout.base:#x} + {layout.size} B)")
        if at + ring_bytes > 1 << CMD_ADDR_BITS:
            raise LayoutError(f"ring CMD{q} ends above the {CMD_ADDR_BITS}-bit address space")
    kv = getattr(layout, "kv", None)
    if kv is not None and kv.kv_count > limits.kv_count:
        raise LayoutError(f"KV_COUNT {kv.kv_count} is beyond the node's directory of "
                          f"{limits.kv_count} entries (CAPS.kv_count_log2 "
                          f"{limits.kv_count.bit_length() - 1}): kv_ids from {limits.kv_count} "
                          "on could never land")


def ring_writes(layout, regmap: RegisterMap | None = None) -> list[tuple[str, int]]:
    """``(register, word)`` writes placing both rings of ``layout``: ``CMDq_BASE_LO``/``_HI``
    and ``CMDq_SIZE`` (what :func:`mcf.node.program.configure` writes for them)."""
    rm = regmap or node_regmap()
    out = []
    for q in Queue:
        r, at = f"CMD{q.value}", layout.cmd_base[q.value]
        out += [(f"{r}_BASE_LO", rm.register(f"{r}_BASE_LO").pack(
                    **{f"{r}_BASE_LO": at & 0xFFFF_FFFF})),
                (f"{r}_BASE_HI", rm.register(f"{r}_BASE_HI").pack(**{f"{r}_BASE_HI": at >> 32})),
                (f"{r}_SIZE", rm.register(f"{r}_SIZE").pack(**{f"{r}_SIZE": layout.cmd_log2}))]
    return out
