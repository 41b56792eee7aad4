"""NIC engine ABI (paper §3.2, §5): status-counter layouts of the router, reduction engine
and link framer; the inter-board link frame format and its CRC-32; the
reduction engine's configuration entry; the router's bubble rule per topology.

Everything here is consumed by the HDL (``mcf.hdl.nic``), the golden models
(``mcf.golden.nic``), the benches and the docs — never retyped.

Link frame (one per packet, on an AXI-Stream-like ``beat_layout`` stream towards a MAC):

    beat 0   LINK_HEADER (magic, seq) in the low bits, rest zero
    beat 1   the packet's Meta (the wire header beat of ``mcf.abi.framing``)
    beats …  the payload beats, full except the last (``keep`` low bytes)
    last     CRC-32 trailer: 4 bytes (``keep = 0xF``) over beats 0..n−1 whole, the bytes
             outside a beat's ``keep`` taken as zero (:func:`link_crc`)

CRC-32 is IEEE 802.3 (reflected polynomial 0xEDB88320, init and final XOR 0xFFFFFFFF, bytes
LSB first) — identical to ``zlib.crc32``, which the golden model uses as an independent check.
Whole beats, not the valid bytes alone: the receiver's CRC unit is then one update by a masked
beat (481 LUT at 64 bits) instead of one by any byte count a partial beat can hold (1,158),
and a frame's length is still covered (the Meta beat; the MACs' FCS covers every byte).

Final reduction results (:func:`reduce_config_layout`): a route's configuration entry says
whether this node's engine completes the reduction (``final``). A final result leaves with
``reduce_op = NONE``, ``collective = MULTICAST`` and ``route_id = result_route``, so by
:data:`mcf.abi.meta.DISPATCH_RULES` every parser forwards it to the router (its broadcast
tree) and no engine reduces it again (an engine handed one drops it as ``BAD_OP``). A partial
result (``final = 0``, one hop of a reduction tree or ring) keeps the contributions'
``reduce_op``, ``collective`` and ``route_id`` and is merged by the next hop. Every result has
``src`` = the reducing node.
"""

from __future__ import annotations

import zlib

from amaranth.hdl import unsigned
from amaranth.lib import data, enum

from .meta import META
from .regs import COUNTER_BITS, counters
from .route import NET_PORTS
from .softmax import LANE_BITS

__all__ = [
    "ROUTER_STATUS", "REDUCE_STATUS", "A2A_STATUS", "A2ADrop", "LINK_TX_STATUS", "LINK_RX_STATUS",
    "REDUCE_CONFIG", "REDUCE_TAG", "reduce_config", "ReduceDrop", "reduce_config_layout",
    "reduce_tag_layout", "reduce_status_layout",
    "LINK_HEADER", "LINK_MAGIC", "CRC32_POLY_REFLECTED", "CRC32_INIT", "CRC32_XOROUT",
    "CRC_BYTES", "crc32", "link_crc", "Topology", "straight_input", "LANE_BYTES", "WATCHDOG_BITS",
]

LANE_BYTES = LANE_BITS // 8    # element lanes: little-endian words of mcf.abi.softmax.LANE_BITS
WATCHDOG_BITS = COUNTER_BITS   # width of the engines' watchdog timeout inputs and timers

# --- Router --------------------------------------------------------------------------------------

ROUTER_STATUS = counters(
    "rx_packets",                                   # packets accepted on any input
    *(f"tx_port{p}" for p in range(NET_PORTS)),     # copies sent on network port p
    "tx_local",                                     # copies delivered to the local sink
    "drop_no_route",                                # route entry names no port and no local
    "drop_bad_port",                                # route entry names a port this router lacks
    "drop_oversize",                                # meta.length > the router's maximum payload
)


class Topology(enum.Enum, shape=2):
    """Cluster wiring; fixes which input continues "straight" to an output (bubble rule)."""
    RING = 0
    MESH = 1        # 2-D mesh or torus, dimension-order routes
    SWITCH = 2


def straight_input(topology: Topology, port: int) -> int | None:
    """The network input whose packets travel straight on through output ``port`` (the link
    from the neighbour on the opposite side), or ``None``. Port numbers follow
    :mod:`mcf.abi.route`: ring 0 = next / 1 = prev; mesh 0 = +x, 1 = −x, 2 = +y, 3 = −y."""
    if topology == Topology.RING:
        return {0: 1, 1: 0}.get(port)
    if topology == Topology.MESH:
        return port ^ 1
    return None


# --- Reduction engine ----------------------------------------------------------------------------

class ReduceDrop(enum.Enum, shape=3):
    """Why the reduction engine dropped a contribution whole."""
    BAD_LENGTH = 0      # zero, not a multiple of LANE_BYTES, too long, or softmax < 2 words
    BAD_OP = 1          # reduce_op NONE
    NO_CONFIG = 2       # contributor count k == 0 for this route_id
    MISMATCH = 3        # reduce_op or length differs from the slot's first contribution
    NO_SLOT = 4         # every slot busy with other tags


def reduce_tag_layout(meta_layout: data.StructLayout = META) -> data.StructLayout:
    """The reduction tag of ``meta_layout``: its (kv_id, seq, route_id) fields."""
    return data.StructLayout({
        "kv_id": meta_layout["kv_id"].shape,
        "seq": meta_layout["seq"].shape,
        "route_id": meta_layout["route_id"].shape,
    })


REDUCE_TAG = reduce_tag_layout()
"""Contributions to one reduction share (route_id, kv_id, seq); also the watchdog's report."""


def reduce_status_layout(meta_layout: data.StructLayout = META) -> data.StructLayout:
    return data.StructLayout({
        **{name: fld.shape for name, fld in counters(
            "rx_packets", "tx_results",
            *(f"drop_{c.name.lower()}" for c in ReduceDrop),
            "watchdog_trips")},
        "last_trip": reduce_tag_layout(meta_layout),   # tag of the slot the watchdog freed last
    })


REDUCE_STATUS = reduce_status_layout()


def reduce_config_layout(meta_layout: data.StructLayout = META) -> data.StructLayout:
    """One entry of the reduction engine's per-route_id configuration table.

    * ``k`` — contributors per tag (0 = not configured: contributions are dropped);
    * ``final`` — this node completes the reduction (the root). The result is then *final*:
      its Meta carries ``reduce_op = NONE``, ``collective = MULTICAST`` and
      ``route_id = result_route`` (the broadcast / delivery route MARS reserves for it).
      By :data:`mcf.abi.meta.DISPATCH_RULES` such a packet goes to the parser's FORWARD port
      (the router) at every node it reaches and is never reduced again; an engine that is
      handed one anyway drops it (``BAD_OP``). With ``final = 0`` the result is a *partial*
      (one hop of a reduction tree or ring): it keeps the contributions' ``reduce_op``,
      ``collective`` and ``route_id``, so the next hop's engine merges it.
    * ``result_route`` — route id of a final result (ignored when ``final = 0``).

    In every result ``src`` is the reducing node and the other fields are the final
    contribution's.
    """
    return data.StructLayout({
        "k": unsigned(meta_layout["src"].width + 1),
        "final": unsigned(1),
        "result_route": meta_layout["route_id"].shape,
    })


REDUCE_CONFIG = reduce_config_layout()


def reduce_config(k: int, *, final: bool = False, result_route: int = 0,
                  meta_layout: data.StructLayout = META) -> int:
    """Pack one configuration entry (see :func:`reduce_config_layout`)."""
    return reduce_config_layout(meta_layout).const(
        {"k": k, "final": int(final), "result_route": result_route}).as_bits()


# --- All-to-all engine ---------------------------------------------------------------------------

class A2ADrop(enum.Enum, shape=2):
    """Why the all-to-all engine dropped a part (or a scatter request) whole."""
    BAD_LENGTH = 0      # part length not a multiple of the beat, zero, too long, or differs
    DUPLICATE = 1       # a part from the same source already arrived for this tag
    NO_SLOT = 2         # every gather slot busy
    BAD_SRC = 3         # src >= num_nodes


A2A_STATUS = counters(
    "scatter_ops", "parts_sent", "rx_parts", "gathers_done",
    *(f"drop_{c.name.lower()}" for c in A2ADrop),
    "scatter_drops",    # scatter requests whose length is not num_nodes x a whole-beat part
    "watchdog_trips",
)

# --- Link framing --------------------------------------------------------------------------------

LINK_MAGIC = 0x4D46        # "MF"
LINK_HEADER = data.StructLayout({
    "magic": unsigned(16),
    "seq": unsigned(16),
})

CRC32_POLY_REFLECTED = 0xEDB88320
CRC32_INIT = 0xFFFFFFFF
CRC32_XOROUT = 0xFFFFFFFF
CRC_BYTES = 4


def crc32(payload: bytes) -> int:
    """CRC-32 of ``payload`` (the IEEE 802.3 / zlib definition)."""
    return zlib.crc32(payload) & 0xFFFFFFFF


def link_crc(beats: list[tuple[bytes, int]]) -> int:
    """The link trailer's CRC-32 of a frame's beats 0..n−1 (``(bytes, keep)`` each): every beat
    whole, the bytes outside its ``keep`` as zero."""
    return crc32(b"".join(bytes(b if k >> n & 1 else 0 for n, b in enumerate(d))
                          for d, k in beats))


LINK_TX_STATUS = counters("frames", "beats")
LINK_RX_STATUS = counters(
    "frames_ok",        # frames delivered
    "crc_errors",       # CRC mismatch: frame dropped
    "drop_bad_header",  # CRC good but magic wrong, or frame shorter than header + meta + CRC
    "drop_oversize",    # frame longer than the receive buffer: dropped
    "drop_stale",       # sequence number behind the expected one (duplicate / reordered)
    "seq_gaps",         # frames that arrived with a sequence number ahead of the expected one
    "lost_frames",      # frames missing according to the sequence numbers (sum of gap sizes)
)
