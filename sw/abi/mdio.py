"""MDIO management of the PL RGMII PHYs (issue #36 item 3; docs/eth.md "PHY management (MDIO)").

One IEEE 802.3 clause 22 frame, most significant bit first, 64 MDC periods::

    preamble 32 x 1 | ST 01 | OP 01 write / 10 read | PHYAD (5) | REGAD (5) | TA | DATA (16)

In a write the station drives all 64 bits (TA ``10``). In a read it drives the first 46 and
releases MDIO for TA and data: the PHY leaves the first TA bit high-impedance, drives the
second low and then the 16 data bits. A PHY address nobody answers leaves MDIO pulled high: the
second TA bit reads 1 (``no_answer``) and the data ``0xFFFF`` (:data:`NO_PHY`).

The station (``mcf.hdl.eth.mdio.MdioMaster``, one per RGMII PHY — each PHY has its own MDC/MDIO
pins) changes MDIO on the falling edge of MDC and samples it just before the rising edge. MDC is
``aclk / (2 x MDC_HALF_PERIOD)``: 2.5 MHz at the 300 MHz ``aclk``
(:data:`mcf.abi.platform.ACLK_HZ`), the IEEE 802.3 limit; the DP83867 takes up to 25 MHz.

The DP83867 part (TI data sheet SNLS484): its ID, the extended-register window through
``REGCR``/``ADDAR`` (ordinary clause 22 writes and reads, sequenced by the driver), and the
registers that set the RGMII delay mode, written by ``mcf.driver.eth.phy_setup_ops``.
"""

from __future__ import annotations

import math

from .platform import ACLK_HZ
from .regs import Access, Field, Register, counters, status_registers

__all__ = [
    "MDC_MAX_HZ", "mdc_half_period", "MDC_HALF_PERIOD", "PREAMBLE_BITS", "ST", "OP_WRITE",
    "OP_READ", "TA_WRITE", "FRAME_BITS", "READ_DRIVEN_BITS", "NO_PHY", "frame_word",
    "MDIO_COUNTERS", "mdio_registers", "MDIO_CMD_FIELDS",
    "PHY_ADDRS", "DP83867_ID", "PHY_ID_MODEL_MASK", "BMSR", "PHYIDR1", "PHYIDR2", "REGCR",
    "ADDAR", "PHYCR", "REGCR_DEVAD", "REGCR_ADDRESS", "REGCR_DATA", "CFG4", "RGMIICTL",
    "RGMIIDCTL", "CFG4_RXCTRL_STRAP", "RGMIICTL_TX_DELAY_EN", "RGMIICTL_RX_DELAY_EN",
    "PHYCR_FIFO_SHIFT", "PHYCR_FIFO_MASK", "PHYCR_FIFO_4_NIBBLES", "DELAY_STEP_NS",
    "delay_code", "delay_ns", "rgmiidctl", "RGMII_DELAY_MODE", "RGMII_TX_DELAY_NS",
    "RGMII_RX_DELAY_NS",
]

# ---- the clause 22 frame and the station's clock ------------------------------------------

MDC_MAX_HZ = 2.5e6              # IEEE 802.3 22.2.2.13 (the DP83867 allows 25 MHz)


def mdc_half_period(aclk_hz: float) -> int:
    """aclk cycles per MDC half period: the fewest that keep MDC at or below
    :data:`MDC_MAX_HZ`."""
    return math.ceil(aclk_hz / (2 * MDC_MAX_HZ) - 1e-9)


MDC_HALF_PERIOD = mdc_half_period(ACLK_HZ)      # 60 at 300 MHz: MDC 2.5 MHz, 400 ns
PREAMBLE_BITS = 32
ST = 0b01
OP_WRITE = 0b01
OP_READ = 0b10
TA_WRITE = 0b10
FRAME_BITS = 64
READ_DRIVEN_BITS = PREAMBLE_BITS + 2 + 2 + 5 + 5  # 46: the station releases MDIO after REGAD
NO_PHY = 0xFFFF


def frame_word(read: bool, phy: int, reg: int, data: int = 0) -> int:
    """The 64 frame bits as one integer, bit 63 first on the wire. In a read the low 18 bits
    (TA and data) are the PHY's; the station releases MDIO there (they are 0 in this word)."""
    if not (0 <= phy < 32 and 0 <= reg < 32 and 0 <= data < 1 << 16):
        raise ValueError(f"MDIO frame phy={phy} reg={reg} data={data:#x} out of range")
    head = ((1 << PREAMBLE_BITS) - 1) << 14 | ST << 12 | (OP_READ if read else OP_WRITE) << 10
    head |= phy << 5 | reg
    return head << 18 if read else (head << 2 | TA_WRITE) << 16 | data


# ---- registers in ``mcf_eth``'s bank --------------------------------------------------------

MDIO_COUNTERS = counters("mdio_reads", "mdio_writes", "mdio_no_answer", "mdio_cmd_busy")
"""Per RGMII link: read and write frames sent, reads no PHY answered (second TA bit high), and
commands written while a frame was under way (ignored)."""

MDIO_CMD_FIELDS = (
    Field("data", 16, Access.W, 0, "write: the 16 data bits"),
    Field("reg", 5, Access.W, 0, "REGAD"),
    Field("phy", 5, Access.W, 0, "PHYAD"),
    Field("read", 1, Access.W, 0, "1 read, 0 write"),
)


def mdio_registers(links) -> list[Register]:
    """The MDIO registers of the RGMII links ``links``: per link ``ETH{l}_MDIO`` (the last
    frame's read data, ``busy``, ``done``, ``no_answer``) and the :data:`MDIO_COUNTERS`
    (``eth{l}_mdio_*``), then per link ``ETH{l}_MDIO_CMD``: any write starts one frame with the
    fields written (ignored and counted in ``mdio_cmd_busy`` while ``busy``). The command
    registers come last in the map."""
    regs: list[Register] = []
    for lk in links:
        regs.append(Register(f"ETH{lk}_MDIO", (
            Field("rdata", 16, Access.R, 0, "data of the last read (0xFFFF: nobody answered)"),
            Field("busy", 1, Access.R, 0, "a frame is under way"),
            Field("done", 1, Access.R, 0, "the last command's frame has ended"),
            Field("no_answer", 1, Access.R, 0, "the last read's second TA bit was high"),
        ), f"link {lk} MDIO station: status of the last frame"))
        regs += status_registers(f"eth{lk}", MDIO_COUNTERS, f"link {lk} MDIO")
    for lk in links:
        regs.append(Register(f"ETH{lk}_MDIO_CMD", MDIO_CMD_FIELDS,
                             f"link {lk} MDIO station: a write starts one clause 22 frame"))
    return regs


# ---- the TI DP83867 (data sheet SNLS484) ----------------------------------------------------

PHY_ADDRS = (2, 3)
"""MDIO addresses of the PL PHYs in ``eth_rgmii`` resource order: U79 (J10B) answers at 2, U80
(J10A) at 3 (AMD's KR260 carrier device tree, linux-xlnx
``arch/arm64/boot/dts/xilinx/zynqmp-sck-kr-g-revB.dtso``: "gem2/gem3 via PL with phys u79@2 and
u80@3")."""
DP83867_ID = (0x2000, 0xA231)
PHY_ID_MODEL_MASK = 0xFFF0      # PHYIDR2 bits 3:0 are the revision (as Linux matches the model)

BMSR, PHYIDR1, PHYIDR2, REGCR, ADDAR, PHYCR = 0x01, 0x02, 0x03, 0x0D, 0x0E, 0x10
REGCR_DEVAD = 0x1F
REGCR_ADDRESS = 0 << 14         # REGCR function: ADDAR holds the extended address
REGCR_DATA = 1 << 14            # REGCR function: ADDAR is the data, no post-increment
CFG4, RGMIICTL, RGMIIDCTL = 0x0031, 0x0032, 0x0086
CFG4_RXCTRL_STRAP = 1 << 7      # cleared: the RX_CTRL strap quirk (Linux, AMD's device tree)
RGMIICTL_TX_DELAY_EN = 1 << 1
RGMIICTL_RX_DELAY_EN = 1 << 0
PHYCR_FIFO_SHIFT = 14
PHYCR_FIFO_MASK = 0b11 << PHYCR_FIFO_SHIFT
PHYCR_FIFO_4_NIBBLES = 0b01     # TX FIFO depth 4 nibbles (AMD's ti,fifo-depth)
DELAY_STEP_NS = 0.25            # RGMIIDCTL: code v gives (v + 1) x 0.25 ns


def delay_code(ns: float) -> int:
    """The 4-bit ``RGMIIDCTL`` code of a delay of ``ns`` (0.25 .. 4.00 ns in 0.25 ns steps)."""
    v = ns / DELAY_STEP_NS - 1
    if v != round(v) or not 0 <= v <= 15:
        raise ValueError(f"RGMII delay {ns} ns: not a multiple of 0.25 ns in 0.25..4.00")
    return int(round(v))


def delay_ns(code: int) -> float:
    return (code + 1) * DELAY_STEP_NS


def rgmiidctl(tx_ns: float, rx_ns: float) -> int:
    """``RGMIIDCTL``: TX delay in bits 7:4, RX delay in bits 3:0."""
    return delay_code(tx_ns) << 4 | delay_code(rx_ns)


RGMII_DELAY_MODE = "rgmii-id"
"""Where the RGMII clock-to-data delays are made, as Linux names the modes: the PHY delays both
its received ``RX_CLK`` and the ``GTX_CLK`` it receives; the MAC forwards and samples
edge-aligned (hdl/eth/rgmii.py). Set over MDIO by the driver, not taken from the straps."""
RGMII_TX_DELAY_NS = 2.0
RGMII_RX_DELAY_NS = 2.0
"""The PHY's clock delays: a quarter of the 8 ns period, the clock edge in the middle of each
4 ns DDR bit — what ``rgmii_io_xdc`` assumes (RGMII v2.0 TsetupR/TholdR 1.0 ns about the
delayed ``RX_CLK``; the MAC's ``tx_clk`` edge-aligned within TskewT ±0.5 ns). AMD's device tree
writes 2.25 ns RX / 2.75 ns TX for the carrier's PS-side DP83867s, whose GEM paths differ; for
this MAC's edge-aligned ODDRE1 forwarding 2.0 ns leaves the same 1.5 ns margin each side of
the skew window."""
