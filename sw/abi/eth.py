"""Ethernet encapsulation of link frames (issue #13 item 1; ``docs/eth.md``).

A link frame of :class:`mcf.hdl.nic.link.LinkTx` (link header, Meta, payload, CRC-32 — the kept
bytes of its ``beat_layout`` beats in order) travels as the payload of one Ethernet II frame::

    dst MAC (6) | src MAC (6) | ETH_TYPE (2, big-endian) | link frame | zero padding | FCS (4)

* :data:`ETH_TYPE` is ``0x88B5``, IEEE 802 "Local Experimental EtherType 1": reserved for
  private protocols, never assigned to a public one, so a switch forwards it and no host stack
  claims it. ``0x88B6`` stays free for a later MCF control protocol (link management).
* MAC addresses are locally administered unicast (:func:`mac_of`): ``02:4D:43:46`` ("MCF") and
  the node id in the low 16 bits. The sender puts its peer's address in ``dst`` (the node at
  the other end of that cable, or behind the switch); a receiver keeps only frames whose ``dst``
  is its own address.
* The Ethernet payload is padded with zero bytes to :data:`MIN_PAYLOAD` (46). The link frame
  delimits itself: its length is ``LINK_OVERHEAD + Meta.length`` (header 8, Meta 8, CRC 4), so
  the receiver strips the padding without a length field of its own, and rebuilds the 64-bit
  beat structure (header beat, Meta beat, payload beats, CRC beat) from the same length.
* FCS: CRC-32 (IEEE 802.3, reflected 0x04C11DB7, the NIC's :func:`mcf.abi.nic.crc32`) over
  dst..padding, sent least significant byte first.

Receive checks, in priority order (the first that applies names the drop, :class:`EthDrop`):
PHY error (``rx_er`` in the frame), overflow (receive buffer lacks room for a largest frame),
runt (< 64 bytes with FCS), oversize (> :data:`MAX_FRAME`), bad FCS, wrong EtherType, foreign
destination MAC, bad length (the Ethernet payload is not exactly ``max(46, link length)`` bytes,
or the link length exceeds :data:`MAX_LINK_FRAME`). The NIC's own CRC and sequence checks stay
the end-to-end guarantee.
"""

from __future__ import annotations

import enum as py_enum

from amaranth.hdl import unsigned
from amaranth.lib import data

from .framing import MAX_PAYLOAD
from .meta import META
from .nic import CRC_BYTES, crc32
from .platform import RGMII_RATE_BPS
from .regs import Access, Field, Register, counters, status_registers

__all__ = [
    "ETH_TYPE", "MAC_OUI", "mac_of", "mac_bytes", "HEADER_BYTES", "FCS_BYTES", "MIN_PAYLOAD",
    "MIN_FRAME", "LINK_OVERHEAD", "MAX_LINK_FRAME", "MAX_FRAME", "MAC_RX_BUFFER_BYTES",
    "PREAMBLE", "SFD", "IFG_BYTES",
    "EthDrop", "ETH_STATUS", "ETH_EVENT", "eth_registers", "link_length", "encap", "decap",
    "wire_bytes", "link_beats", "LENGTH_OFFSET", "LENGTH_SHIFT", "LENGTH_BYTES",
    "NODE_BITS",
    "RX_COUNTER",
    "XGMII_LANES", "XGMII_DATA_BITS", "SYNC_HEADER_BITS", "BLOCK_PAYLOAD_BITS", "BLOCK_BITS",
    "XGMII_IDLE", "XGMII_START", "XGMII_TERM", "XGMII_ERROR", "XGMII_SEQ", "XGMII_SIG",
    "CONTROL_CODES", "O_CODES", "SYNC_DATA", "SYNC_CTRL", "BLOCK_FORMATS", "BLOCK_FIELDS",
    "SCRAMBLER_TAPS", "LOCK_GOOD_HEADERS", "LOCK_BAD_HEADERS", "PCS_CLOCK_HZ", "BER_WINDOW_S",
    "BER_WINDOW", "HI_BER_COUNT", "SLIP_HOLDOFF", "XGMII_MIN_IFG", "DIC_MAX", "PCS_STATUS",
    "xgmii_period_bytes",
    "ETH_LINKS", "ETH_LINK_SFP", "ETH_LINK_RGMII", "ETH_MAP_VERSION", "ETH_MAP_IDENT",
    "RXCLK_WINDOW", "RXCLK_GRAY_BITS", "RGMII_RX_CLK_HZ", "rxclk_min", "RXCLK_MIN_RESET",
    "ETH_LINK_STATUS", "SFP_STATUS", "RGMII_STATUS", "eth_regmap", "link_peers",
]

ETH_TYPE = 0x88B5
MAC_OUI = 0x024D4346            # 02 (locally administered, unicast) 4D 43 46 ("MCF")
HEADER_BYTES = 14
FCS_BYTES = 4
MIN_PAYLOAD = 46
MIN_FRAME = HEADER_BYTES + MIN_PAYLOAD + FCS_BYTES            # 64
LINK_OVERHEAD = 8 + 8 + CRC_BYTES                             # link header, Meta, CRC-32
MAX_LINK_FRAME = LINK_OVERHEAD + MAX_PAYLOAD                  # 2,068
MAX_FRAME = HEADER_BYTES + MAX_LINK_FRAME + FCS_BYTES         # 2,086 (a jumbo frame)
MAC_RX_BUFFER_BYTES = 4096
"""A MAC's receive buffer (``EthDecap``'s store and forward): the wire cannot wait, so a frame
that finds it full is dropped and counted; at line rate, drained, it never fills."""
PREAMBLE = bytes([0x55] * 7)
SFD = 0xD5
IFG_BYTES = 12
NODE_BITS = META["dst"].width
LENGTH_BIT = 64 + META["length"].offset          # bit of Meta.length in the link frame
LENGTH_OFFSET = LENGTH_BIT // 8                   # first byte holding it
LENGTH_SHIFT = LENGTH_BIT % 8
LENGTH_BYTES = (LENGTH_SHIFT + META["length"].width + 7) // 8
assert NODE_BITS <= 16 and LENGTH_OFFSET + LENGTH_BYTES <= 16


def mac_of(node: int) -> int:
    """The 48-bit MAC address of node ``node`` (locally administered unicast)."""
    if not 0 <= node < (1 << NODE_BITS):
        raise ValueError(f"node {node} out of range")
    return MAC_OUI << 16 | node


def mac_bytes(node: int) -> bytes:
    return mac_of(node).to_bytes(6, "big")


def wire_bytes(frame_len: int) -> int:
    """Bytes a frame occupies on the wire: preamble + SFD, frame, inter-frame gap."""
    return len(PREAMBLE) + 1 + frame_len + IFG_BYTES


class EthDrop(py_enum.IntEnum):
    """Outcome of a received frame (``ETH_EVENT.cause``); 0 is delivered."""
    OK = 0
    PHY_ERROR = 1
    OVERFLOW = 2
    RUNT = 3
    OVERSIZE = 4
    FCS = 5
    ETHERTYPE = 6
    FOREIGN = 7
    BAD_LENGTH = 8


ETH_EVENT = data.StructLayout({"cause": unsigned(4), "bytes": unsigned(16)})
"""One record per received (``cause`` :class:`EthDrop`) or sent (``cause`` 0, or
``PHY_ERROR`` for a transmit underrun) frame, crossing from the MAC's clock to ``aclk`` where
:data:`ETH_STATUS` counts it. ``bytes``: frame bytes dst..FCS (saturates at 65535)."""

ETH_STATUS = counters(
    "tx_frames", "tx_bytes", "tx_underruns",
    "rx_frames", "rx_bytes", "rx_phy_errors", "rx_overflow", "rx_runts", "rx_oversize",
    "rx_fcs_errors", "rx_wrong_ethertype", "rx_foreign_dst", "rx_bad_length",
)
"""Per-link MAC counters: frames/bytes sent and delivered (bytes dst..FCS), transmit
underruns, and one counter per :class:`EthDrop` cause."""

RX_COUNTER = {EthDrop.PHY_ERROR: "rx_phy_errors", EthDrop.OVERFLOW: "rx_overflow",
              EthDrop.RUNT: "rx_runts", EthDrop.OVERSIZE: "rx_oversize",
              EthDrop.FCS: "rx_fcs_errors", EthDrop.ETHERTYPE: "rx_wrong_ethertype",
              EthDrop.FOREIGN: "rx_foreign_dst", EthDrop.BAD_LENGTH: "rx_bad_length"}


def eth_registers(link: int, *, pcs: bool = False) -> list[Register]:
    """Registers of the MAC on link ``link``: the peer's node id (its MAC is ``mac_of(peer)``)
    and the :data:`ETH_STATUS` counters. The local address is ``mac_of(NODE.local_id)``.
    ``pcs``: a 10GBASE-R link, whose :data:`PCS_STATUS` (block lock, BER monitor) follows."""
    regs = [Register(f"ETH{link}_CFG", (
        Field("peer_id", NODE_BITS, Access.RW, 0, "node at the far end: destination MAC"),
    ), f"link {link} Ethernet MAC configuration"),
        *status_registers(f"eth{link}", ETH_STATUS, f"link {link} MAC")]
    if pcs:
        regs += status_registers(f"eth{link}", PCS_STATUS, f"link {link} 10GBASE-R PCS")
    return regs


def link_length(link: bytes) -> int | None:
    """Length of the link frame that starts ``link`` (from its Meta), or None if too short."""
    end = LENGTH_OFFSET + LENGTH_BYTES
    if len(link) < end:
        return None
    raw = int.from_bytes(link[LENGTH_OFFSET:end], "little") >> LENGTH_SHIFT
    raw &= (1 << META["length"].width) - 1
    return LINK_OVERHEAD + raw


def encap(link: bytes, src: int, dst: int) -> bytes:
    """The Ethernet frame (dst..FCS) carrying link frame ``link`` from node ``src`` to ``dst``."""
    body = mac_bytes(dst) + mac_bytes(src) + ETH_TYPE.to_bytes(2, "big") + link
    body += bytes(max(0, HEADER_BYTES + MIN_PAYLOAD - len(body)))
    return body + crc32(body).to_bytes(4, "little")


def decap(frame: bytes, local: int, *, phy_error: bool = False,
          overflow: bool = False) -> tuple[EthDrop, bytes]:
    """Receive decision for ``frame`` (dst..FCS) at node ``local``: (cause, link frame bytes;
    empty unless delivered)."""
    n = len(frame)
    checks = (
        (phy_error, EthDrop.PHY_ERROR), (overflow, EthDrop.OVERFLOW),
        (n < MIN_FRAME, EthDrop.RUNT), (n > MAX_FRAME, EthDrop.OVERSIZE),
    )
    for bad, cause in checks:
        if bad:
            return cause, b""
    if crc32(frame[:-4]) != int.from_bytes(frame[-4:], "little"):
        return EthDrop.FCS, b""
    if int.from_bytes(frame[12:14], "big") != ETH_TYPE:
        return EthDrop.ETHERTYPE, b""
    if frame[:6] != mac_bytes(local):
        return EthDrop.FOREIGN, b""
    payload = frame[HEADER_BYTES:-FCS_BYTES]
    ll = link_length(payload)
    if ll is None or ll > MAX_LINK_FRAME or len(payload) != max(MIN_PAYLOAD, ll):
        return EthDrop.BAD_LENGTH, b""
    return EthDrop.OK, payload[:ll]


def link_beats(link: bytes) -> list[tuple[int, int, int]]:
    """The ``beat_layout(64)`` beats ``(data, keep, last)`` of link frame ``link`` (its length
    from its Meta): header beat, Meta beat, payload beats (the last one partial), CRC beat."""
    ll = link_length(link)
    if ll is None or ll != len(link):
        raise ValueError("not a whole link frame")
    cuts = [0, 8, *range(16, ll - CRC_BYTES, 8), ll - CRC_BYTES, ll]
    cuts = sorted(set(cuts))
    return [(int.from_bytes(link[a:b], "little"), (1 << (b - a)) - 1, int(b == ll))
            for a, b in zip(cuts, cuts[1:])]


# ---- 10GBASE-R (IEEE 802.3 clauses 46 and 49) -------------------------------------------------

XGMII_LANES = 8                                     # one control bit per byte lane
XGMII_DATA_BITS = 8 * XGMII_LANES                   # the 64-bit XGMII word
SYNC_HEADER_BITS = 2
BLOCK_PAYLOAD_BITS = XGMII_DATA_BITS                # 64b/66b: one XGMII word per block
BLOCK_BITS = SYNC_HEADER_BITS + BLOCK_PAYLOAD_BITS  # 66, bit 0 (the header's) first

XGMII_IDLE = 0x07
XGMII_START = 0xFB
XGMII_TERM = 0xFD
XGMII_ERROR = 0xFE
XGMII_SEQ = 0x9C                # /Q/ ordered set (link fault signalling)
XGMII_SIG = 0x5C                # /Fsig/ ordered set
XGMII_MIN_IFG = 12              # bytes from /T/ (included) to the next /S/, on average
DIC_MAX = 3                     # deficit idle count range 0..3 (clause 46.3.1.4)

CONTROL_CODES = {0x07: 0x00, 0x06: 0x06, 0xFE: 0x1E, 0x1C: 0x2D, 0x3C: 0x33, 0x7C: 0x4B,
                 0xBC: 0x55, 0xDC: 0x66, 0xF7: 0x78}
"""XGMII control character → 7-bit 10GBASE-R control code (Table 49-1): idle, LPI, error and
the reserved characters. /S/, /T/ and the ordered sets have no 7-bit code."""
O_CODES = {XGMII_SEQ: 0x0, XGMII_SIG: 0xF}
"""Ordered-set control character in lane 0/4 → 4-bit O code."""

SYNC_DATA = 0b10                # sync header, bit 0 sent first: "01" on the wire
SYNC_CTRL = 0b01                # "10" on the wire

BLOCK_FORMATS = {
    0x1E: "CCCCCCCC", 0x2D: "CCCCODDD", 0x33: "CCCCSDDD", 0x66: "ODDDSDDD",
    0x55: "ODDDODDD", 0x78: "SDDDDDDD", 0x4B: "ODDDCCCC", 0x87: "TCCCCCCC",
    0x99: "DTCCCCCC", 0xAA: "DDTCCCCC", 0xB4: "DDDTCCCC", 0xCC: "DDDDTCCC",
    0xD2: "DDDDDTCC", 0xE1: "DDDDDDTC", 0xFF: "DDDDDDDT",
}
"""Control block type → what each XGMII lane 0..7 holds (Figure 49-7): D data, C control
code, O ordered-set code, S start, T terminate. Priority is the dict order (all distinct)."""


def _fields(kind: str) -> tuple[tuple[str, int, int], ...]:
    """The payload fields after the type byte, in bit order: (``D``/``C``/``O``/``Z``, lane,
    width); ``Z`` is unused (zero) bits. Clause 49's layouts: in blocks starting with an
    ordered set the data lanes 1..3 come before O0."""
    width = {"D": 8, "C": 7, "O": 4}
    if kind[0] == "O":
        first = [("D", 1, 8), ("D", 2, 8), ("D", 3, 8), ("O", 0, 4)]
        rest = range(4, 8)
    else:
        first, rest = [], range(8)
    out = list(first)
    for lane in rest:
        k = kind[lane]
        if k == "S":
            out.append(("Z", lane, 4) if lane == 4 else ("Z", lane, 0))
        elif k == "T":
            out.append(("Z", lane, 7 - lane))
        else:
            out.append((k, lane, width[k]))
    out = tuple(f for f in out if f[2])
    assert sum(f[2] for f in out) == 56, kind
    return out


BLOCK_FIELDS = {t: _fields(k) for t, k in BLOCK_FORMATS.items()}
"""Control block type → payload fields after the type byte (see :func:`_fields`)."""

SCRAMBLER_TAPS = (39, 58)       # G(x) = 1 + x^39 + x^58, self-synchronising (clause 49.2.6)
LOCK_GOOD_HEADERS = 64          # valid sync headers in a row to gain block lock
LOCK_BAD_HEADERS = 16           # invalid ones among 64 that lose it
SLIP_HOLDOFF = 2                # blocks ignored after a slip (the gearbox realigns)
PCS_CLOCK_HZ = 156_250_000      # 10.3125 Gb/s / 66: one 66-bit block per cycle
BER_WINDOW_S = 125e-6           # clause 49.2.14: hi_ber over a 125 µs window
BER_WINDOW = round(BER_WINDOW_S * PCS_CLOCK_HZ)     # 19,531 blocks
HI_BER_COUNT = 16               # invalid sync headers in one window that set hi_ber

PCS_STATUS = data.StructLayout({
    "block_lock": unsigned(1), "hi_ber": unsigned(1),
    "ber_count": unsigned(32), "errored_blocks": unsigned(32), "lock_losses": unsigned(32),
})
"""10GBASE-R PCS status: live ``block_lock`` / ``hi_ber``, and counters of invalid sync
headers seen while locked (the BER monitor's count), blocks decoded as errors, and losses of
block lock."""


def xgmii_period_bytes(frame_len: int) -> float:
    """Average bytes a frame of ``frame_len`` (dst..FCS) occupies on XGMII at line rate:
    start + preamble + SFD (8), the frame, and on average ``XGMII_MIN_IFG`` (the deficit idle
    count keeps the average at 12 with starts aligned to lanes 0/4)."""
    return 8 + frame_len + XGMII_MIN_IFG


# ---- the MAC wrapper's register bank (``mcf_eth``, docs/eth.md "Link status registers") -------

ETH_LINKS = 3                   # physical links: 0 SFP+ (10GBASE-R), 1 and 2 RGMII (1000BASE-T)
ETH_LINK_SFP = 0
ETH_LINK_RGMII = (1, 2)
ETH_MAP_VERSION = 0x0101         # minor 1: the MDIO registers (appended)
ETH_MAP_IDENT = 0x4D45          # "ME": the MCF Ethernet block (the node's map says "MC")

RGMII_RX_CLK_HZ = RGMII_RATE_BPS / 8   # the PHY's RGMII receive clock at 1000 Mb/s: 125 MHz
RXCLK_WINDOW = 1024             # aclk cycles per measurement of an RGMII receive clock
RXCLK_GRAY_BITS = 4             # Gray counter rx_clk → aclk: < 8 edges per aclk cycle


def rxclk_min(aclk_hz: float) -> int:
    """``ETH_RXCLK_MIN`` for an aclk of ``aclk_hz``: half the receive-clock edges a 125 MHz
    clock gives in one window, so 1000 Mb/s (125 MHz) counts as up and 10/100 Mb/s
    (2.5/25 MHz) or a stopped clock as down."""
    if RGMII_RX_CLK_HZ / aclk_hz >= 1 << (RXCLK_GRAY_BITS - 1):
        raise ValueError(f"aclk {aclk_hz / 1e6:.1f} MHz too slow to count a 125 MHz clock")
    return round(RXCLK_WINDOW * RGMII_RX_CLK_HZ / aclk_hz / 2)


def _aclk_default() -> float:
    from .platform import ACLK_HZ
    return ACLK_HZ


RXCLK_MIN_RESET = rxclk_min(_aclk_default())
"""Reset value of ``ETH_RXCLK_MIN``: :func:`rxclk_min` at the project's assumed aclk
(:data:`mcf.abi.platform.ACLK_HZ`); the driver rewrites it for the real ``pl_clk0``."""

ETH_LINK_STATUS = data.StructLayout({f"link{lk}_up": unsigned(1) for lk in range(ETH_LINKS)})
"""``ETH_LINK``: live link-up per physical link. SFP+: ``block_lock & ~hi_ber`` of the
10GBASE-R PCS. RGMII: the PHY's receive clock ran at ≥ ``ETH_RXCLK_MIN`` edges in the last
:data:`RXCLK_WINDOW` aclk cycles (the DP83867 clocks RX_CLK at 125 MHz only with a
1000BASE-T link; its copper link bit itself is in BMSR, over MDIO, which the PL does not
drive)."""

SFP_STATUS = data.StructLayout({
    "sfp_mod_abs": unsigned(1), "sfp_rx_los": unsigned(1), "sfp_tx_fault": unsigned(1),
    "gt_tx_done": unsigned(1), "gt_rx_done": unsigned(1),
})
"""The SFP+ cage's sideband inputs (module absent, loss of signal, transmitter fault; raw pin
levels, synchronised to aclk) and the GT wizard's reset-done outputs."""

RGMII_STATUS = data.StructLayout({"rx_clk_count": unsigned(16)})
"""Per RGMII link: receive-clock edges counted in the last :data:`RXCLK_WINDOW` aclk cycles
(``rx_clk_count × aclk / RXCLK_WINDOW`` is the PHY's RX_CLK frequency)."""


def eth_regmap():
    """The register map of ``mcf_eth`` (the MAC wrapper's own AXI-Lite bank, ``s_axi_eth``):
    ``ID``/``BUS_ERRORS``, ``ETH_LOCAL`` (the node id the MACs send from and accept),
    ``ETH_LINK`` (:data:`ETH_LINK_STATUS`), ``ETH_RXCLK_MIN``, then per link
    :func:`eth_registers` (link 0 with its PCS) and link 0's :data:`SFP_STATUS`, links 1/2's
    :data:`RGMII_STATUS`."""
    from .regs import RegisterMap
    rm = RegisterMap("mcf_eth", ETH_MAP_VERSION, ident=ETH_MAP_IDENT)
    rm.add(Register("ETH_LOCAL", (
        Field("local_id", NODE_BITS, Access.RW, 0,
              "this node (NODE.local_id): source MAC, accepted destination MAC"),
    ), "the node id of every MAC"))
    rm.add(Register("ETH_LINK", tuple(
        Field(name, 1, Access.R, 0, f"physical link {name[4]} is up")
        for name, _ in ETH_LINK_STATUS), "live link-up per link (0 SFP+, 1/2 RGMII)"))
    rm.add(Register("ETH_RXCLK_MIN", (
        Field("edges", 16, Access.RW, RXCLK_MIN_RESET,
              f"RGMII link up: RX_CLK edges per {RXCLK_WINDOW} aclk cycles at least this"),
    ), "threshold of the RGMII link-up rule (the driver sets it from the real aclk)"))
    for lk in range(ETH_LINKS):
        rm.extend(eth_registers(lk, pcs=lk == ETH_LINK_SFP))
        if lk == ETH_LINK_SFP:
            rm.add_status(f"eth{lk}", SFP_STATUS, f"link {lk} SFP+ cage and GT")
        else:
            rm.add_status(f"eth{lk}", RGMII_STATUS, f"link {lk} RGMII PHY")
    from .mdio import mdio_registers
    rm.extend(mdio_registers(ETH_LINK_RGMII))
    return rm


def link_peers(node: int, n_nodes: int, topology="ring") -> tuple[int | None, ...]:
    """``ETH{l}_CFG.peer_id`` of board ``node``: the node at the far end of each physical
    link under :func:`mcf.abi.link_map.link_map_for`'s map (ring: router port 0 → ``node +
    1``, port 1 → ``node − 1``, mod N); ``None`` for a link the topology leaves unused. A
    switch carries every peer on link 0 but a MAC sends to one destination address, so only
    N ≤ 2 has a peer there; larger switch clusters raise ``ValueError``."""
    from .link_map import _topology, link_map_for
    from .nic import Topology
    links = link_map_for(node, n_nodes, topology)
    peers: list[int | None] = [None] * ETH_LINKS
    if _topology(topology) == Topology.SWITCH:
        if n_nodes > 2:
            raise ValueError(f"a switch cluster of {n_nodes} needs a destination MAC per frame;"
                             " the MACs address one peer per link")
        peers[links[0]] = (node + 1) % n_nodes
        return tuple(peers)
    peers[links[0]] = (node + 1) % n_nodes
    peers[links[1]] = (node - 1) % n_nodes
    return tuple(peers)
