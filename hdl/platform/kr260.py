"""The KR260 (Kria K26 SOM, XCK26-SFVC784-2LV-C) as an Amaranth :class:`XilinxPlatform`: the one
pin table of the board resources the design uses, the XDC generated from it, and the Vivado
block-design script that makes the node top a PYNQ overlay.

Every pin and I/O standard comes from ``shared/design/platform.md``:

* ``sfp`` 0 — the SFP+ cage's GTH lane (quad 224, lane 2): ``tx`` R4/R3, ``rx`` T2/T1 (P/N in
  that order). Transceiver pins: a package pin only, no ``IOSTANDARD`` (Vivado places the GT
  channel from them).
* ``sfp_refclk`` 0 — MGTREFCLK0 of quad 224, Y6/Y5, 156.25 MHz (``create_clock -period 6.400``).
* ``sfp_ctl`` 0 — SFP sideband, LVCMOS33: ``tx_disable`` Y10 (out), ``tx_fault`` A10, ``rx_los``
  J12, ``mod_abs`` W10 (in).
* ``sfp_i2c`` 0 — the SFP module's I2C, LVCMOS33: ``scl`` AB11, ``sda`` AC11.
* ``led`` 0/1 — user LEDs F8/E8; ``sfp_led`` 0/1 — SFP LEDs G8/F7; LVCMOS18.
* ``fan`` 0 — ``fan_en_b`` A12, active low (a PWM or a level from the PL). platform.md gives the
  pin but not its I/O standard; LVCMOS33 is the one the public KR260 designs use — unconfirmed.

* ``eth_rgmii`` 0/1 — the two PL RJ45 ports' TI DP83867 PHYs over RGMII, U79 (J10B) and U80
  (J10A) in platform.md's order, LVCMOS18 (the SOM240 HPA/HPB banks run at 1.8 V), subsignals
  named as amaranth-boards' RGMII boards name them: ``tx_clk``, ``tx_ctl``, ``tx_data[0..3]``
  (outputs, fast slew), ``rx_clk`` (125 MHz, ``create_clock -period 8.000``), ``rx_ctl``,
  ``rx_data[0..3]``, ``rst`` (active low), ``mdc`` (out) and ``mdio`` (in/out), both slow slew
  (2.5 MHz management, :data:`mcf.abi.mdio.MDC_HALF_PERIOD`). platform.md does not list these
  pins: they are the carrier's nets (U79 on ``som240_1``, bank HPA; U80 on ``som240_2``, bank
  HPB) as the open KR260 Ethernet designs constrain them — check them against the carrier's
  schematic before the first bitstream (docs/board.md §4).

:func:`kr260_xdc` writes the constraints from :data:`KR260Platform.resources`; port names are
``<resource><number>_<subsignal>``, ``_p``/``_n`` for differential pairs, ``_b`` for active-low
pins, ``[i]`` for buses (``sfp_ctl0_tx_disable``, ``sfp0_tx_p``, ``fan0_b``). A block-design port
(or a top-level port of the wrapper) with that name gets the pin. :func:`vivado_tcl` writes the
project/block-design script (docs/board.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from amaranth.build import Attrs, Clock, DiffPairs, Pins, PinsN, Resource, Subsignal
from amaranth.vendor import XilinxPlatform
from amaranth_boards.resources import I2CResource, LEDResources

from mcf.abi.eth import RGMII_RX_CLK_HZ as RGMII_RX_HZ
from mcf.abi.mdio import RGMII_DELAY_MODE, RGMII_RX_DELAY_NS, RGMII_TX_DELAY_NS
from mcf.abi.node_config import AXI_WIDTH
from mcf.abi.platform import ACLK_HZ, HP_PORTS, MODULE_REF_VLNV

__all__ = ["KR260Platform", "BoardPin", "board_pins", "kr260_xdc", "vivado_tcl", "top_interfaces",
           "PART", "BOARD_PART", "BOARD_CONNECTIONS", "RGMII_PINS", "VIVADO_VERSION",
           "PL_CLK0_MHZ", "PL_CLK0_TOLERANCE", "RGMII_DELAY_MODE", "RGMII_TIMING",
           "GT_WIZARD", "ETH_BOARD_PORTS", "eth_timing_xdc", "rgmii_io_xdc", "rgmii_board_port",
           "mdio_buffer"]

PART = "xck26-sfvc784-2LV-c"
BOARD_PART = "xilinx.com:kr260_som:part0:1.1"
VIVADO_VERSION = "2023.2"
"""The Vivado release the generated script is written for (and the ``.hwh`` the simulated board
writes names): the script stops with a message on any other ``version -short`` (its patch
releases ``2023.2.x`` pass). The KR260 board files (``BOARD_PART`` and the carrier's
``xilinx.com:kr260_carrier``) come from the Xilinx board store (Vivado: Tools > Vivado Store >
Boards, or ``xhub::install [xhub::get_xitems *kr260*]``); the script stops, saying so, when
``BOARD_PART`` is not installed."""
PL_CLK0_MHZ = ACLK_HZ / 1e6
"""``pl_clk0`` (``aclk``) in MHz: :data:`mcf.abi.platform.ACLK_HZ`, the clock every cycle figure
assumes, written into the PS configuration (``PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ``)."""
PL_CLK0_TOLERANCE = 0.01
"""The PS derives ``pl_clk0`` from a PLL by integer dividers; the script stops when the frequency
Vivado reports for ``ps/pl_clk0`` is further than this fraction from :data:`PL_CLK0_MHZ`."""
PL_CLK0_CLOCK = "clk_pl_0"
"""The timing clock Vivado creates for the PS's ``pl_clk0`` (``aclk``): the script reads its
period and its worst intra-clock setup slack into ``<name>.timing.json``."""

# RGMII_DELAY_MODE ("rgmii-id") and the PHYs' delays live in mcf.abi.mdio, which the driver's
# PHY set-up (mcf.driver.eth.phy_setup_ops) writes over MDIO: the DP83867 delays both its
# received RX_CLK (clock centred in the data at the FPGA's pins) and the GTX_CLK it receives (so
# the MAC forwards tx_clk edge-aligned, ODDRE1 1/0, and samples rxd with IDDRE1 on the clock's
# own edges, no IDELAY; hdl/eth/rgmii.py). Not left to the straps: AMD's KR260 carrier device
# tree (linux-xlnx zynqmp-sck-kr-g-revB.dtso) programs the carrier's DP83867s over MDIO with the
# RX_CTRL strap quirk, and so does driver (docs/deploy.md "The RGMII PHYs").

RGMII_TIMING = {"period_ns": 1e9 / RGMII_RX_HZ, "rx_setup_ns": 1.0, "rx_hold_ns": 1.0,
                "tx_skew_ns": 0.5}
"""The RGMII v2.0 specification's figures the I/O constraints use, for :data:`RGMII_DELAY_MODE`:
at the FPGA's inputs the PHY (internal delay) guarantees data valid ``rx_setup_ns`` before and
``rx_hold_ns`` after each ``rx_clk`` edge (TsetupR/TholdR, 1.0 ns min); at its outputs the MAC
(no internal delay) keeps data within ±``tx_skew_ns`` of each forwarded ``tx_clk`` edge (TskewT,
±0.5 ns), the PHY adding the ``RGMIIDCTL`` delay the driver writes
(:data:`mcf.abi.mdio.RGMII_TX_DELAY_NS`/``RGMII_RX_DELAY_NS``, 2.0 ns: a quarter period, the
clock edge in the middle of each DDR bit — asserted below)."""
assert RGMII_TX_DELAY_NS == RGMII_RX_DELAY_NS == RGMII_TIMING["period_ns"] / 4
BOARD_CONNECTIONS = ("som240_1_connector xilinx.com:kr260_carrier:som240_1_connector:1.0 "
                     "som240_2_connector xilinx.com:kr260_carrier:som240_2_connector:1.0")

GT_RESOURCES = frozenset({"sfp", "sfp_refclk"})
"""Resources on transceiver pins: package pins only, no I/O standard."""


RGMII_PINS = (
    # U79 (J10B): som240_1, bank HPA
    {"tx_clk": "A2", "tx_ctl": "F1", "tx_data": "E1 D1 F2 E2", "rx_clk": "D4", "rx_ctl": "A4",
     "rx_data": "A1 B3 A3 B4", "rst": "B1", "mdc": "G3", "mdio": "F3"},
    # U80 (J10A): som240_2, bank HPB
    {"tx_clk": "J1", "tx_ctl": "Y8", "tx_data": "U9 V9 U8 V8", "rx_clk": "K4", "rx_ctl": "H3",
     "rx_data": "H1 K2 J2 H4", "rst": "K1", "mdc": "R8", "mdio": "T8"},
)
"""Package pins of the two PL RGMII PHYs (module docstring); ``*_data`` bits 0..3 in order."""


_RGMII_SUBSIGNAL = {"txd": "tx_data", "tx_ctl": "tx_ctl", "tx_clk": "tx_clk",
                    "rxd": "rx_data", "rx_ctl": "rx_ctl", "rx_clk": "rx_clk", "rst_b": "rst_b",
                    "mdc": "mdc", "mdio": "mdio"}


def rgmii_board_port(link: int, pin: str) -> str:
    """The board port (XDC name) of ``mcf_eth``'s ``rgmii<link>_<pin>``: RGMII link ℓ = 1, 2
    is the ``eth_rgmii`` resource ℓ − 1 (U79/J10B, U80/J10A)."""
    from mcf.abi.eth import ETH_LINK_RGMII
    return f"eth_rgmii{ETH_LINK_RGMII.index(link)}_{_RGMII_SUBSIGNAL[pin]}"


def mdio_buffer(link: int) -> str:
    """The block-design cell of RGMII link ``link``'s MDIO pin: a Utility Buffer
    (``util_ds_buf``, ``C_BUF_TYPE IOBUF``) whose ``IOBUF_IO_I``/``IOBUF_IO_T``/``IOBUF_IO_O``
    are ``mcf_eth``'s ``rgmii<link>_mdio_o``/``_mdio_t`` (1 = released)/``_mdio_i`` and whose
    ``IOBUF_IO_IO`` is the board port (:func:`_eth_tcl`)."""
    return f"mdio{link}_buf"


def _eth_board_ports() -> list[tuple[str, str, int, str, str]]:
    """(board port, direction, width, ``clk`` or ``data``, what drives/takes it in the block
    design) of every board pin the ``mcf_eth`` block design makes external."""
    from mcf.abi.eth import ETH_LINK_RGMII
    out = []
    for lk in ETH_LINK_RGMII:
        for pin, d, w in (("txd", "O", 4), ("tx_ctl", "O", 1), ("tx_clk", "O", 1),
                          ("rxd", "I", 4), ("rx_ctl", "I", 1), ("rx_clk", "I", 1),
                          ("rst_b", "O", 1), ("mdc", "O", 1)):
            out.append((rgmii_board_port(lk, pin), d, w, "clk" if pin == "rx_clk" else "data",
                        f"eth/rgmii{lk}_{pin}"))
        out.append((rgmii_board_port(lk, "mdio"), "IO", 1, "data",
                    f"{mdio_buffer(lk)}/IOBUF_IO_IO"))
    out += [("sfp_ctl0_tx_disable", "O", 1, "data", "eth/sfp_tx_disable"),
            ("sfp_ctl0_tx_fault", "I", 1, "data", "eth/sfp_tx_fault"),
            ("sfp_ctl0_rx_los", "I", 1, "data", "eth/sfp_rx_los"),
            ("sfp_ctl0_mod_abs", "I", 1, "data", "eth/sfp_mod_abs"),
            ("sfp0_tx_p", "O", 1, "data", "gt/gthtxp_out"),
            ("sfp0_tx_n", "O", 1, "data", "gt/gthtxn_out"),
            ("sfp0_rx_p", "I", 1, "data", "gt/gthrxp_in"),
            ("sfp0_rx_n", "I", 1, "data", "gt/gthrxn_in"),
            ("sfp_refclk0_p", "I", 1, "clk", "refclk_buf/IBUF_DS_P"),
            ("sfp_refclk0_n", "I", 1, "clk", "refclk_buf/IBUF_DS_N")]
    return out


ETH_BOARD_PORTS = tuple(name for name, *_ in _eth_board_ports())
"""The board ports (XDC names) the block design with ``mcf_eth`` makes external; the XDC
``mcf build`` writes constrains exactly these."""

GT_WIZARD = {
    "GT_TYPE": "GTH",
    "CHANNEL_ENABLE": "X0Y2", "TX_MASTER_CHANNEL": "X0Y2", "RX_MASTER_CHANNEL": "X0Y2",
    "TX_LINE_RATE": "10.3125", "RX_LINE_RATE": "10.3125",
    "TX_PLL_TYPE": "QPLL0", "RX_PLL_TYPE": "QPLL0",
    "TX_REFCLK_FREQUENCY": "156.25", "RX_REFCLK_FREQUENCY": "156.25",
    "TX_REFCLK_SOURCE": "X0Y2 clk0", "RX_REFCLK_SOURCE": "X0Y2 clk0",
    "TX_DATA_ENCODING": "RAW", "RX_DATA_DECODING": "RAW",
    "TX_USER_DATA_WIDTH": "64", "TX_INT_DATA_WIDTH": "32",
    "RX_USER_DATA_WIDTH": "64", "RX_INT_DATA_WIDTH": "32",
    "TX_BUFFER_MODE": "1", "RX_BUFFER_MODE": "1",
    "TX_OUTCLK_SOURCE": "TXPROGDIVCLK", "RX_OUTCLK_SOURCE": "RXOUTCLKPMA",
    "RX_EQ_MODE": "AUTO",
    "LOCATE_COMMON": "CORE", "LOCATE_RESET_CONTROLLER": "CORE",
    "LOCATE_TX_USER_CLOCKING": "CORE", "LOCATE_RX_USER_CLOCKING": "CORE",
    "FREERUN_FREQUENCY": "125",
    "ENABLE_OPTIONAL_PORTS": "txpmaresetdone_out rxpmaresetdone_out",
}
"""``gtwizard_ultrascale`` (free IP, PG182) for the SFP+: GTH quad 224 lane 2 (channel X0Y2
on the K26's one GTH quad: *unconfirmed*), 10.3125 Gb/s from the 156.25 MHz MGTREFCLK0 through
QPLL0, raw data (the 64b/66b PCS and gearbox are ``TenGigLink``'s, in the fabric), 64-bit user
data on a 32-bit internal path (TXUSRCLK2 = RXUSRCLK2 = 161.13 MHz), TX and RX elastic buffers
on, RX user clock the recovered PMA clock, QPLL/reset controller/user-clock helpers inside
the core, free-running clock 125 MHz (the clocking wizard's). docs/board.md §2."""


def _rgmii(number: int, *, tx_clk, tx_ctl, tx_data, rx_clk, rx_ctl, rx_data, rst, mdc,
           mdio) -> Resource:
    fast, slow = Attrs(SLEW="FAST"), Attrs(SLEW="SLOW")
    return Resource(
        "eth_rgmii", number,
        Subsignal("tx_clk", Pins(tx_clk, dir="o"), fast),
        Subsignal("tx_ctl", Pins(tx_ctl, dir="o"), fast),
        Subsignal("tx_data", Pins(tx_data, dir="o"), fast),
        Subsignal("rx_clk", Pins(rx_clk, dir="i"), Clock(RGMII_RX_HZ)),
        Subsignal("rx_ctl", Pins(rx_ctl, dir="i")),
        Subsignal("rx_data", Pins(rx_data, dir="i")),
        Subsignal("rst", PinsN(rst, dir="o")),
        Subsignal("mdc", Pins(mdc, dir="o"), slow),
        Subsignal("mdio", Pins(mdio, dir="io"), slow),
        Attrs(IOSTANDARD="LVCMOS18"))


class KR260Platform(XilinxPlatform):
    """The KR260: K26 SOM on the KR260 carrier. Resources as in the module docstring."""

    device = "xck26"
    package = "sfvc784"
    speed = "2LV-c"
    default_clk = None
    resources = [
        Resource("sfp", 0,
                 Subsignal("tx", DiffPairs("R4", "R3", dir="o")),
                 Subsignal("rx", DiffPairs("T2", "T1", dir="i"))),
        Resource("sfp_refclk", 0, DiffPairs("Y6", "Y5", dir="i"), Clock(156.25e6)),
        Resource("sfp_ctl", 0,
                 Subsignal("tx_disable", Pins("Y10", dir="o")),
                 Subsignal("tx_fault", Pins("A10", dir="i")),
                 Subsignal("rx_los", Pins("J12", dir="i")),
                 Subsignal("mod_abs", Pins("W10", dir="i")),
                 Attrs(IOSTANDARD="LVCMOS33")),
        I2CResource("sfp_i2c", 0, scl="AB11", sda="AC11", attrs=Attrs(IOSTANDARD="LVCMOS33")),
        *LEDResources(pins="F8 E8", attrs=Attrs(IOSTANDARD="LVCMOS18")),
        *LEDResources("sfp_led", pins="G8 F7", attrs=Attrs(IOSTANDARD="LVCMOS18")),
        Resource("fan", 0, PinsN("A12", dir="o"), Attrs(IOSTANDARD="LVCMOS33")),
        *(_rgmii(i, **pins) for i, pins in enumerate(RGMII_PINS)),
    ]
    connectors = []


@dataclass(frozen=True)
class BoardPin:
    """One package pin of the table: the port it constrains, its attributes, its clock."""

    port: str
    pin: str
    resource: str
    attrs: tuple[tuple[str, str], ...]
    clock_hz: float | None = None


def _walk(sub: Subsignal, base: str, attrs: dict, resource: str) -> Iterator[BoardPin]:
    attrs = {**attrs, **{k: v for k, v in sub.attrs.items() if v is not None}}
    clock = sub.clock.frequency if sub.clock is not None else None
    for io in sub.ios:
        if isinstance(io, Subsignal):
            yield from _walk(io, f"{base}_{io.name}", attrs, resource)
        elif isinstance(io, Pins):
            yield from _pins(io, base + ("_b" if io.invert else ""), attrs, clock, resource)
        elif isinstance(io, DiffPairs):
            yield from _pins(io.p, f"{base}_p", attrs, clock, resource)
            yield from _pins(io.n, f"{base}_n", attrs, None, resource)


def _pins(pins: Pins, port: str, attrs: dict, clock, resource) -> Iterator[BoardPin]:
    names = pins.names
    a = tuple(sorted(attrs.items()))
    for i, pin in enumerate(names):
        yield BoardPin(port if len(names) == 1 else f"{port}[{i}]", pin, resource, a,
                       clock if i == 0 else None)


def board_pins(platform: XilinxPlatform | None = None) -> list[BoardPin]:
    """Every pin of ``platform``'s resource table, in declaration order. Raises ``ValueError``
    on a pin used twice or a non-transceiver pin without an ``IOSTANDARD``."""
    platform = platform or KR260Platform()
    pins: list[BoardPin] = []
    for (name, number), res in platform.resources.items():
        pins.extend(_walk(res, f"{name}{number}", {}, name))
    seen: dict[str, str] = {}
    for p in pins:
        if p.pin in seen:
            raise ValueError(f"pin {p.pin} used by {seen[p.pin]} and {p.port}")
        seen[p.pin] = p.port
        if p.resource not in GT_RESOURCES and "IOSTANDARD" not in dict(p.attrs):
            raise ValueError(f"{p.port} ({p.pin}) has no IOSTANDARD")
    return pins


def kr260_xdc(platform: XilinxPlatform | None = None, *,
              ports: Iterable[str] | None = None) -> str:
    """The XDC of the whole pin table: ``PACKAGE_PIN`` and attributes per port,
    ``create_clock`` per clock input. With ``ports`` (port names, a bus without its ``[i]``),
    only those ports' pins — the ones a design makes external. Generated — never edit the
    output by hand."""
    lines = ["# Generated by mcf.hdl.platform.kr260.kr260_xdc from the KR260 pin table.",
             "# Do not edit: change hdl/platform/kr260.py and regenerate (mcf build).", ""]
    clocks = []
    keep = None if ports is None else set(ports)
    for p in board_pins(platform):
        if keep is not None and p.port.split("[")[0] not in keep:
            continue
        lines.append(f"set_property PACKAGE_PIN {p.pin} [get_ports {{{p.port}}}]")
        for k, v in p.attrs:
            lines.append(f"set_property {k} {v} [get_ports {{{p.port}}}]")
        if p.clock_hz:
            clocks.append(f"create_clock -name {p.port.removesuffix('_p')} "
                          f"-period {1e9 / p.clock_hz:.3f} [get_ports {{{p.port}}}]")
    return "\n".join(lines + [""] + clocks) + "\n"


_HP_RE = re.compile(r"m_axi_hp(\d+)_")


def top_interfaces(port_names: Iterable[str]) -> dict[str, list[str]]:
    """The block-design connections of a node top, from its port names: ``clock``/``resetn``/
    ``irq`` pins, the ``ctrl`` AXI-Lite slave, the ``hp`` masters (index order) and the
    ``link`` stream interfaces. Raises ``ValueError`` when the top lacks one."""
    names = set(port_names)
    for need in ("aclk", "aresetn", "irq", "s_axi_ctrl_awaddr"):
        if need not in names:
            raise ValueError(f"the top has no port {need}")
    hp = sorted({int(m.group(1)) for n in names if (m := _HP_RE.match(n))})
    if hp != list(range(len(hp))) or not 0 < len(hp) <= HP_PORTS:
        raise ValueError(f"HP masters {hp}: expected m_axi_hp0..{HP_PORTS - 1}")
    links = sorted({m.group(1) for n in names
                    if (m := re.match(r"([ms]_axis_link\d+)_t", n))})
    return {"ctrl": ["s_axi_ctrl"], "hp": [f"m_axi_hp{i}" for i in hp], "links": links}


def eth_timing_xdc() -> str:
    """Timing constraints of the block design with ``mcf_eth``: the clock domains that meet
    only through ``AsyncFIFO``/``FFSynchronizer``/``ResetSynchronizer`` (ASYNC_REG flops) are
    asynchronous clock groups — aclk (``pl_clk0``), the RGMII transmit clock (clocking
    wizard), the GT's TX and RX user clocks, each PHY's receive clock."""
    def of(pin: str) -> str:
        return f"[get_clocks -of_objects [get_pins -hierarchical -filter {{NAME =~ */{pin}}}]]"
    groups = [of("node/aclk"), of("eth_clk/clk_out1"), of("eth/gt_tx_clk"),
              of("eth/gt_rx_clk"),
              *(f"[get_clocks {rgmii_board_port(lk, 'rx_clk')}]" for lk in (1, 2))]
    body = " \\\n    ".join(f"-group {g}" for g in groups)
    return ("# Generated by mcf.hdl.platform.kr260.eth_timing_xdc. Do not edit.\n"
            "# Every crossing between these clocks is an Amaranth AsyncFIFO, FFSynchronizer or\n"
            "# ResetSynchronizer (ASYNC_REG flops): asynchronous clock groups.\n"
            f"set_clock_groups -name mcf_eth_async -asynchronous \\\n    {body}\n\n"
            + rgmii_io_xdc())


def rgmii_io_xdc() -> str:
    """The RGMII pins' I/O timing for :data:`RGMII_DELAY_MODE` ``rgmii-id`` with the figures of
    :data:`RGMII_TIMING` (Vivado's source-synchronous DDR templates): per PHY, inputs
    centre-aligned to ``rx_clk`` (the XDC's ``create_clock`` on the pin) on both edges; outputs
    edge-aligned to ``tx_clk``, a clock generated on the pin from the clocking wizard's output
    (``eth_clk/clk_out1``, which the ``ODDRE1`` of 1/0 forwards)."""
    if RGMII_DELAY_MODE != "rgmii-id":
        raise ValueError(f"no I/O constraints written for RGMII mode {RGMII_DELAY_MODE!r}")
    t = RGMII_TIMING
    half = t["period_ns"] / 2
    lines = [f"# RGMII I/O timing, mode {RGMII_DELAY_MODE} (the DP83867 adds both clock delays):",
             "# RGMII v2.0 TsetupR/TholdR at the inputs, TskewT at the outputs "
             "(hdl/platform/kr260.py RGMII_TIMING)."]
    src = "[get_pins -hierarchical -filter {NAME =~ */eth_clk/clk_out1}]"
    for lk in (1, 2):
        rx_clk, tx_clk = rgmii_board_port(lk, "rx_clk"), rgmii_board_port(lk, "tx_clk")
        ins = " ".join(f"{rgmii_board_port(lk, p)}*" for p in ("rxd", "rx_ctl"))
        outs = " ".join(f"{rgmii_board_port(lk, p)}*" for p in ("txd", "tx_ctl"))
        lines += [
            f"# RGMII link {lk} ({rx_clk.split('_rx_clk')[0]})",
            f"set_input_delay -clock [get_clocks {rx_clk}] -max {half - t['rx_setup_ns']:.3f} "
            f"[get_ports {{{ins}}}]",
            f"set_input_delay -clock [get_clocks {rx_clk}] -min {t['rx_hold_ns']:.3f} "
            f"[get_ports {{{ins}}}]",
            f"set_input_delay -clock [get_clocks {rx_clk}] -max {half - t['rx_setup_ns']:.3f} "
            f"[get_ports {{{ins}}}] -clock_fall -add_delay",
            f"set_input_delay -clock [get_clocks {rx_clk}] -min {t['rx_hold_ns']:.3f} "
            f"[get_ports {{{ins}}}] -clock_fall -add_delay",
            f"create_generated_clock -name {tx_clk} -source {src} -multiply_by 1 "
            f"[get_ports {tx_clk}]",
            # edge-aligned DDR, skew-based: data launched on an edge of eth_clk is checked
            # against the opposite edge of tx_clk half a period later (setup: d <= +skew) and
            # the one before it (hold: d >= -skew); the same-edge pairs are false paths.
            f"set_output_delay -clock [get_clocks {tx_clk}] -max {half - t['tx_skew_ns']:.3f} "
            f"[get_ports {{{outs}}}]",
            f"set_output_delay -clock [get_clocks {tx_clk}] -min {t['tx_skew_ns'] - half:.3f} "
            f"[get_ports {{{outs}}}]",
            f"set_output_delay -clock [get_clocks {tx_clk}] -max {half - t['tx_skew_ns']:.3f} "
            f"[get_ports {{{outs}}}] -clock_fall -add_delay",
            f"set_output_delay -clock [get_clocks {tx_clk}] -min {t['tx_skew_ns'] - half:.3f} "
            f"[get_ports {{{outs}}}] -clock_fall -add_delay",
            *(f"set_false_path -{chk} -{e}_from [get_clocks -of_objects {src}] "
              f"-{e}_to [get_clocks {tx_clk}]" for chk in ("setup", "hold")
              for e in ("rise", "fall")),
        ]
    return "\n".join(lines) + "\n"


def _eth_tcl(eth: str, links: list[str]) -> str:
    """The block-design part that adds ``mcf_eth`` (see docs/board.md §2)."""
    from mcf.abi.eth import ETH_LINK_RGMII
    from mcf.abi.platform import CTRL_BASE, CTRL_RANGE, ETH_CLK_HZ, ETH_CTRL_BASE, ETH_CTRL_RANGE
    mhz = f"{ETH_CLK_HZ / 1e6:.3f}"
    gt_cfg = " \\\n    ".join(f"CONFIG.{k} {{{v}}}" for k, v in GT_WIZARD.items())
    ports = []
    for name, d, w, kind, pin in _eth_board_ports():
        width = f" -from {w - 1} -to 0" if w > 1 else ""
        typ = " -type clk" if kind == "clk" and not name.startswith("sfp_refclk") else ""
        freq = f" -freq_hz {int(RGMII_RX_HZ)}" if typ else ""
        ports.append(f"create_bd_port -dir {d}{width}{typ}{freq} {name}")
        ports.append(f"connect_bd_net [get_bd_ports {name}] [get_bd_pins {pin}]")
    ports = "\n".join(ports)
    mdio = []
    for lk in ETH_LINK_RGMII:
        buf = mdio_buffer(lk)
        mdio += [f"create_bd_cell -type ip -vlnv xilinx.com:ip:util_ds_buf {buf}",
                 f"set_property CONFIG.C_BUF_TYPE {{IOBUF}} [get_bd_cells {buf}]",
                 *(f"connect_bd_net [get_bd_pins {a}] [get_bd_pins {b}]" for a, b in (
                     (f"eth/rgmii{lk}_mdio_o", f"{buf}/IOBUF_IO_I"),
                     (f"eth/rgmii{lk}_mdio_t", f"{buf}/IOBUF_IO_T"),
                     (f"{buf}/IOBUF_IO_O", f"eth/rgmii{lk}_mdio_i")))]
    mdio = "\n".join(mdio)
    link_nets = []
    for lk in sorted({int(re.sub(r"\D", "", s)) for s in links}):
        link_nets.append(f"connect_bd_intf_net [get_bd_intf_pins node/m_axis_link{lk}] "
                         f"[get_bd_intf_pins eth/s_axis_link{lk}]")
        link_nets.append(f"connect_bd_intf_net [get_bd_intf_pins eth/m_axis_link{lk}] "
                         f"[get_bd_intf_pins node/s_axis_link{lk}]")
    link_nets = "\n".join(link_nets)
    gt_nets = "\n".join(f"connect_bd_net [get_bd_pins {a}] [get_bd_pins {b}]" for a, b in (
        ("gt/gtwiz_userclk_tx_usrclk2_out", "eth/gt_tx_clk"),
        ("gt/gtwiz_userclk_rx_usrclk2_out", "eth/gt_rx_clk"),
        ("eth/gt_txdata", "gt/gtwiz_userdata_tx_in"),
        ("gt/gtwiz_userdata_rx_out", "eth/gt_rxdata"),
        ("gt/gtwiz_reset_tx_done_out", "eth/gt_tx_done"),
        ("gt/gtwiz_reset_rx_done_out", "eth/gt_rx_done"),
        ("eth/gt_reset", "gt/gtwiz_reset_all_in"),
        ("gt/txpmaresetdone_out", "eth/gt_tx_pma_done"),
        ("gt/rxpmaresetdone_out", "eth/gt_rx_pma_done"),
        ("eth/gt_userclk_tx_reset", "gt/gtwiz_userclk_tx_reset_in"),
        ("eth/gt_userclk_rx_reset", "gt/gtwiz_userclk_rx_reset_in"),
        ("refclk_buf/IBUF_OUT", "gt/gtrefclk00_in"),
    ))
    zeros = " ".join(f"[get_bd_pins gt/gtwiz_reset_{r}_in]" for r in (
        "tx_pll_and_datapath", "tx_datapath", "rx_pll_and_datapath", "rx_datapath"))
    return f"""
# ---- The MAC wrapper (docs/eth.md, docs/board.md section 2): link 0 SFP+ 10GBASE-R on the
# GTH, links 1/2 RGMII; its own AXI-Lite bank s_axi_eth. {MODULE_REF_VLNV.format(name=eth)}.
create_bd_cell -type module -reference {eth} eth
connect_bd_net [get_bd_pins ps/pl_clk0] [get_bd_pins eth/aclk]
connect_bd_net [get_bd_pins rst/peripheral_aresetn] [get_bd_pins eth/aresetn]
# Control: a second SmartConnect master port -> eth/s_axi_eth.
set_property CONFIG.NUM_MI {{2}} [get_bd_cells ctrl_smc]
connect_bd_intf_net [get_bd_intf_pins ctrl_smc/M01_AXI] [get_bd_intf_pins eth/s_axi_eth]
# Links: node TX -> MAC TX, MAC RX -> node RX (all on aclk; the clock crossings are inside).
{link_nets}

# {mhz} MHz for the RGMII transmitters and the GT wizard's free-running clock: a clocking
# wizard (MMCM) on pl_clk0. The RGMII TX clock is forwarded edge-aligned (ODDRE1 1/0): the
# DP83867's internal TX delay supplies the 90 degrees, so no shifted output.
create_bd_cell -type ip -vlnv xilinx.com:ip:clk_wiz eth_clk
set_property -dict [list CONFIG.PRIM_SOURCE {{No_buffer}} \\
    CONFIG.CLKOUT1_REQUESTED_OUT_FREQ {{{mhz}}} CONFIG.USE_LOCKED {{1}} \\
    CONFIG.USE_RESET {{1}} CONFIG.RESET_TYPE {{ACTIVE_LOW}} CONFIG.RESET_PORT {{resetn}}] \\
    [get_bd_cells eth_clk]
connect_bd_net [get_bd_pins ps/pl_clk0] [get_bd_pins eth_clk/clk_in1]
connect_bd_net [get_bd_pins ps/pl_resetn0] [get_bd_pins eth_clk/resetn]
# aresetn (node and MACs) is released only once the MMCM has locked.
connect_bd_net [get_bd_pins eth_clk/locked] [get_bd_pins rst/dcm_locked]

# The SFP+ transceiver: GT wizard (gtwizard_ultrascale, free IP; parameters: GT_WIZARD in
# hdl/platform/kr260.py, docs/board.md section 2) as a block-design cell, its user data and
# clocks to eth/gt_*; MGTREFCLK0 through an IBUFDS_GTE4 (util_ds_buf).
create_bd_cell -type ip -vlnv xilinx.com:ip:gtwizard_ultrascale gt
set_property -dict [list {gt_cfg}] [get_bd_cells gt]
create_bd_cell -type ip -vlnv xilinx.com:ip:util_ds_buf refclk_buf
set_property CONFIG.C_BUF_TYPE {{IBUFDSGTE}} [get_bd_cells refclk_buf]
create_bd_cell -type ip -vlnv xilinx.com:ip:xlconstant gt_zero
set_property CONFIG.CONST_VAL {{0}} [get_bd_cells gt_zero]
{gt_nets}
connect_bd_net [get_bd_pins gt_zero/dout] {zeros}
connect_bd_net [get_bd_pins eth_clk/clk_out1] [get_bd_pins eth/eth_clk] \\
    [get_bd_pins gt/gtwiz_reset_clk_freerun_in]

# Each RGMII PHY's MDIO: a tri-state IOBUF (util_ds_buf, C_BUF_TYPE IOBUF) between the
# wrapper's mdio_o/mdio_t (T = 1: released)/mdio_i and the board pin (docs/board.md section 2).
{mdio}

# Board pins: block-design ports named as the XDC's (hdl/platform/kr260.py).
{ports}

# Addresses: node at {CTRL_BASE:#x}, eth the {ETH_CTRL_RANGE // 1024} KiB after it.
assign_bd_address -target_address_space [get_bd_addr_spaces ps/Data] -offset {CTRL_BASE:#x} \\
    -range {CTRL_RANGE:#x} [get_bd_addr_segs -of_objects [get_bd_intf_pins node/s_axi_ctrl]]
assign_bd_address -target_address_space [get_bd_addr_spaces ps/Data] \\
    -offset {ETH_CTRL_BASE:#x} -range {ETH_CTRL_RANGE:#x} \\
    [get_bd_addr_segs -of_objects [get_bd_intf_pins eth/s_axi_eth]]
"""


def vivado_tcl(*, name: str, top: str, verilog: str, xdc: str, ports: Iterable[str],
               jobs: int, eth: str | None = None, eth_verilog: str | None = None,
               timing_xdc: str | None = None) -> str:
    """The Vivado batch script (paths relative to the script's folder; see docs/board.md).
    With ``eth`` (the MAC wrapper's module, in ``eth_verilog``): the links, the GT, the
    clocking wizard and the board pins are connected, and ``xdc`` (then holding only
    :data:`ETH_BOARD_PORTS`) and ``timing_xdc`` are enabled; without, the links stay open
    and the XDC is added disabled."""
    itf = top_interfaces(ports)
    bd = f"{name}_bd"
    ps_cfg = [f"CONFIG.PSU__USE__S_AXI_GP{2 + i} {{{int(i < len(itf['hp']))}}}"
              + (f" CONFIG.PSU__SAXIGP{2 + i}__DATA_WIDTH {{{AXI_WIDTH}}}"
                 if i < len(itf["hp"]) else "")
              for i in range(HP_PORTS)]
    ps_cfg = " \\\n    ".join(ps_cfg)
    hp_links = "\n".join(
        f"connect_bd_intf_net [get_bd_intf_pins node/{m}] [get_bd_intf_pins ps/S_AXI_HP{i}_FPD]"
        for i, m in enumerate(itf["hp"]))
    hp_clks = " \\\n    ".join(f"[get_bd_pins ps/saxihp{i}_fpd_aclk]"
                               for i in range(len(itf["hp"])))
    links = "\n".join(f"#   node/{s}" for s in itf["links"]) or "#   (none)"
    if eth is None:
        sources = f"add_files -norecurse [file join $here {verilog}]"
        constraints = f"""\
# The board pin table (generated from hdl/platform/kr260.py). No block-design port uses a board
# pin without the MAC wrapper, so it is added disabled.
add_files -fileset constrs_1 -norecurse [file join $here {xdc}]
set_property is_enabled false [get_files {xdc}]"""
        link_text = f"""\
# Link streams: left unconnected (no MAC wrapper in this build).
# Vivado ties the unconnected s_axis_link*_tvalid / m_axis_link*_tready inputs to 0: no
# frame arrives and the node's link transmitters are held (a single node sends none).
{links}"""
        address = "assign_bd_address"
    else:
        sources = (f"add_files -norecurse [list [file join $here {verilog}] "
                   f"[file join $here {eth_verilog}]]")
        constraints = f"""\
# The pins the block design makes external (generated from hdl/platform/kr260.py), enabled;
# the MAC wrapper's asynchronous clock groups, read after the IP's own constraints.
add_files -fileset constrs_1 -norecurse [file join $here {xdc}]
set_property is_enabled true [get_files {xdc}]
add_files -fileset constrs_1 -norecurse [file join $here {timing_xdc}]
set_property PROCESSING_ORDER LATE [get_files {timing_xdc}]
set_property USED_IN_SYNTHESIS false [get_files {timing_xdc}]"""
        link_text = _eth_tcl(eth, itf["links"])
        address = "# everything else (the HP masters' DDR segments)\nassign_bd_address"
    pl_mhz = f"{PL_CLK0_MHZ:g}"
    aclk_hz = f"{ACLK_HZ:.0f}"
    tol_hz = f"{ACLK_HZ * PL_CLK0_TOLERANCE:.0f}"
    aclk_clock = PL_CLK0_CLOCK
    tol_pct = f"{PL_CLK0_TOLERANCE * 100:g}"
    return f"""\
# Generated by `mcf build --board kr260` (mcf.hdl.platform.kr260.vivado_tcl). Do not edit.
# Builds the PYNQ overlay {name}.bit + {name}.hwh from {verilog} and {xdc}.
# Run: vivado -mode batch -source {name}.tcl   (from any folder; paths are the script's)
set here [file normalize [file dirname [info script]]]
set name {name}
set bd {bd}
set jobs {jobs}
set proj_dir [file join $here project]

# Written for Vivado {VIVADO_VERSION} (hdl/platform/kr260.py VIVADO_VERSION): IP versions, the GT
# wizard's parameter names and the PS preset are that release's.
if {{![string match {{{VIVADO_VERSION}*}} [version -short]]}} {{
    error [join [list "mcf: this script is written for Vivado {VIVADO_VERSION}," \\
        "this is Vivado [version -short]: install {VIVADO_VERSION} (docs/deploy.md)" \\
        "or give its path to mcf build --vivado"]]
}}
# The KR260 board files (the SOM's board part and the carrier's connectors, installed together)
# come from the Xilinx board store, not with Vivado.
foreach bp {{{BOARD_PART}}} {{
    if {{[llength [get_board_parts -quiet $bp]] == 0}} {{
        error [join [list "mcf: board part $bp is not installed: install the KR260 board" \\
            "files (SOM and carrier) from the Xilinx board store (Vivado: Tools >" \\
            "Vivado Store > Boards," \\
            "'Kria KR260'; or in Tcl: xhub::refresh_catalog" \\
            "\\[xhub::get_xstores xilinx_board_store\\]; xhub::install" \\
            "\\[xhub::get_xitems *kr260*\\]), then run this script again"]]
    }}
}}

create_project $name $proj_dir -part {PART} -force
set_property board_part {BOARD_PART} [current_project]
set_property board_connections {{{BOARD_CONNECTIONS}}} [current_project]
{sources}
{constraints}
update_compile_order -fileset sources_1

create_bd_design $bd
# Zynq UltraScale+ PS with the KR260 board preset; HPM0_FPD for control, HP0..3 for the DMA;
# every other PL-facing AXI port off (an enabled port with no clock fails validation).
create_bd_cell -type ip -vlnv xilinx.com:ip:zynq_ultra_ps_e ps
apply_bd_automation -rule xilinx.com:bd_rule:zynq_ultra_ps_e -config {{apply_board_preset "1"}} \\
    [get_bd_cells ps]
set_property -dict [list CONFIG.PSU__USE__M_AXI_GP0 {{1}} CONFIG.PSU__USE__M_AXI_GP1 {{0}} \\
    CONFIG.PSU__USE__M_AXI_GP2 {{0}} CONFIG.PSU__USE__S_AXI_GP0 {{0}} \\
    CONFIG.PSU__USE__S_AXI_GP1 {{0}} CONFIG.PSU__USE__S_AXI_GP6 {{0}} \\
    {ps_cfg} \\
    CONFIG.PSU__FPGA_PL0_ENABLE {{1}} CONFIG.PSU__USE__IRQ0 {{1}}] [get_bd_cells ps]
# pl_clk0 = aclk at the frequency every cycle figure assumes (mcf.abi.platform.ACLK_HZ).
set_property CONFIG.PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ {{{pl_mhz}}} [get_bd_cells ps]

# The node top as a module reference: {MODULE_REF_VLNV.format(name=top)} in the .hwh. Vivado
# infers s_axi_ctrl (AXI4-Lite), m_axi_hp* (AXI4) and the link streams from the port prefixes.
create_bd_cell -type module -reference {top} node
# UG994: an AXI interface of a module reference needs an associated clock. Without the
# X_INTERFACE_PARAMETER attribute on aclk, validate_bd_design names the unassociated interfaces.
if {{[get_property CONFIG.ASSOCIATED_BUSIF [get_bd_pins node/aclk]] eq ""}} {{
    puts "WARNING: node/aclk has no ASSOCIATED_BUSIF (see docs/board.md, section 3)"
}}

create_bd_cell -type ip -vlnv xilinx.com:ip:smartconnect ctrl_smc
set_property -dict [list CONFIG.NUM_SI {{1}} CONFIG.NUM_MI {{1}}] [get_bd_cells ctrl_smc]
create_bd_cell -type ip -vlnv xilinx.com:ip:proc_sys_reset rst

# Clock and reset: pl_clk0 -> aclk of everything; pl_resetn0 -> proc_sys_reset -> aresetn.
connect_bd_net [get_bd_pins ps/pl_clk0] [get_bd_pins node/aclk] [get_bd_pins ctrl_smc/aclk] \\
    [get_bd_pins rst/slowest_sync_clk] [get_bd_pins ps/maxihpm0_fpd_aclk] \\
    {hp_clks}
connect_bd_net [get_bd_pins ps/pl_resetn0] [get_bd_pins rst/ext_reset_in]
connect_bd_net [get_bd_pins rst/peripheral_aresetn] [get_bd_pins node/aresetn] \\
    [get_bd_pins ctrl_smc/aresetn]

# Control: M_AXI_HPM0_FPD -> SmartConnect -> node/s_axi_ctrl (AXI4-Lite, 4 KiB).
connect_bd_intf_net [get_bd_intf_pins ps/M_AXI_HPM0_FPD] [get_bd_intf_pins ctrl_smc/S00_AXI]
connect_bd_intf_net [get_bd_intf_pins ctrl_smc/M00_AXI] [get_bd_intf_pins node/s_axi_ctrl]

# DMA: the node's AXI4 masters on S_AXI_HP0..3_FPD (S_AXI_GP2..5 in the PS configuration).
{hp_links}

# Interrupt: IRQ_STATUS & IRQ_ENABLE -> pl_ps_irq0[0].
connect_bd_net [get_bd_pins node/irq] [get_bd_pins ps/pl_ps_irq0]

{link_text}

{address}
validate_bd_design
# The PS makes pl_clk0 by integer division of a PLL: stop unless it came out at {pl_mhz} MHz.
set pl_hz [get_property CONFIG.FREQ_HZ [get_bd_pins ps/pl_clk0]]
if {{![string is double -strict $pl_hz] || abs($pl_hz - {aclk_hz}) > {tol_hz}}} {{
    error [join [list "mcf: ps/pl_clk0 is '$pl_hz' Hz, the design assumes {aclk_hz} Hz" \\
        "(mcf.abi.platform.ACLK_HZ) within {tol_pct}%"]]
}}
save_bd_design
set wrapper [make_wrapper -files [get_files $bd.bd] -top]
add_files -norecurse $wrapper
set_property top ${{bd}}_wrapper [current_fileset]
update_compile_order -fileset sources_1

launch_runs impl_1 -to_step write_bitstream -jobs $jobs
wait_on_run impl_1
if {{[get_property PROGRESS [get_runs impl_1]] ne "100%"}} {{
    error "impl_1 did not finish: see [file join $proj_dir $name.runs impl_1]"
}}

# Timing: nothing is copied unless the routed design meets every constraint (WNS, WHS >= 0).
# <name>.timing.json (read by mcf build --json) is written first, met or not: the worst slacks
# and aclk's own (pl_clk0's clock clk_pl_0: its period and its worst intra-clock setup slack).
open_run impl_1
report_timing_summary -max_paths 10 -file [file join $here $name.timing.rpt]
set wns [get_property SLACK [get_timing_paths -max_paths 1 -nworst 1 -setup]]
set whs [get_property SLACK [get_timing_paths -max_paths 1 -nworst 1 -hold]]
set aclk_clk [get_clocks -quiet {aclk_clock}]
set aclk_period [get_property PERIOD $aclk_clk]
set aclk_wns [get_property SLACK [get_timing_paths -max_paths 1 -nworst 1 -setup \
    -from $aclk_clk -to $aclk_clk]]
set fields {{}}
foreach {{key value}} [list wns_ns $wns whs_ns $whs aclk_period_ns $aclk_period \
        aclk_wns_ns $aclk_wns] {{
    lappend fields [format {{"%s": %s}} $key \
        [expr {{[string is double -strict $value] ? $value : "null"}}]]
}}
set tj [open [file join $here $name.timing.json] w]
puts $tj "{{[join $fields {{, }}]}}"
close $tj
foreach {{what slack}} [list WNS $wns WHS $whs] {{
    set rpt [file join $here $name.timing.rpt]
    if {{![string is double -strict $slack]}} {{
        error "mcf: no timed path ($what '$slack'): the constraints did not apply; see $rpt"
    }}
    if {{$slack < 0}} {{
        error "mcf: timing failed, $what $slack ns < 0: no $name.bit written; see $rpt"
    }}
}}
puts "timing met: WNS $wns ns, WHS $whs ns"

# PYNQ: <name>.bit and <name>.hwh side by side.
file copy -force [file join $proj_dir $name.runs impl_1 ${{bd}}_wrapper.bit] \\
    [file join $here $name.bit]
set hwh [glob -nocomplain [file join $proj_dir $name.gen sources_1 bd $bd hw_handoff $bd.hwh] \\
    [file join $proj_dir $name.srcs sources_1 bd $bd hw_handoff $bd.hwh]]
if {{[llength $hwh] == 0}} {{ error "no $bd.hwh under $proj_dir" }}
file copy -force [lindex $hwh 0] [file join $here $name.hwh]
puts "wrote [file join $here $name.bit] and [file join $here $name.hwh]"
"""


if __name__ == "__main__":  # pragma: no cover - `python -m mcf.hdl.platform.kr260 [path]`
    import sys
    from pathlib import Path
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "constraints/kr260.xdc")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(kr260_xdc())
    print(out)
