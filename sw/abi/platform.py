"""The target device's capacities: the programmable logic of the Kria K26 SOM on the KR260
(XCK26-SFVC784-2LV-C, Zynq UltraScale+). Resource estimates (:mod:`mcf.sim.synth`), the MARS
cost model's compute peak and the node's sizing all read this one table.

``LUT`` counts logic and LUT-RAM/SRL LUTs together (the estimates report LUT-RAM separately and
add it when they compute utilisation); ``BRAM36`` counts 36 Kb block RAMs (a RAMB18 is half).
"""

from __future__ import annotations

__all__ = ["K26", "HP_PORTS", "ACLK_HZ", "SFP_RATE_BPS", "RGMII_RATE_BPS", "LINK_LATENCY_S",
           "CTRL_BASE", "CTRL_RANGE", "ETH_CTRL_BASE", "ETH_CTRL_RANGE", "ETH_CLK_HZ",
           "MODULE_REF_VLNV", "NODE_LINKS"]

NODE_LINKS = 3
"""The KR260 node's PL-side links: one 10G SFP+, two 1G RGMII."""

K26: dict[str, int] = {"LUT": 117_120, "FF": 234_240, "DSP": 1_248, "BRAM36": 144, "URAM": 64}

HP_PORTS = 4
"""The PS's high-performance AXI slave ports the PL's DMA masters use (S_AXI_HP0..3_FPD,
128 bits each): one DMA loader per port."""

ACLK_HZ = 300e6
"""The node's one clock (``aclk``, the PS's ``pl_clk0``, docs/node.md §8) at which every cycle
figure of the project is turned into seconds: an **assumption** (MARS's cost model, the cluster
simulation's link rates and the system model all use it). No fmax is claimed: no open tool gives
UltraScale+ timing."""

SFP_RATE_BPS = 10e9
"""MAC data rate of the KR260's SFP+ cage (10GBASE-R) and of a 10G switch port, bit/s."""
RGMII_RATE_BPS = 1e9
"""MAC data rate of the KR260's two PL RGMII jacks (1000BASE-T), bit/s."""
LINK_LATENCY_S = 2e-6
"""One cable hop's latency (PHY, MAC wrapper, wire) in seconds: an assumption, the same for
every link kind, until a board measures it."""

CTRL_BASE = 0xA000_0000
"""Address of the node's control window (``node/s_axi_ctrl``) on ``M_AXI_HPM0_FPD``: the first
address of the HPM0_FPD window, where the Vivado flow places it (docs/board.md §2)."""
CTRL_RANGE = 0x1000
"""Its size: 4 KiB (the CSR bank's 12 address bits)."""
ETH_CTRL_BASE = CTRL_BASE + CTRL_RANGE
"""The MAC wrapper's register window (``eth/s_axi_eth``, :func:`mcf.abi.eth.eth_regmap`): the
4 KiB right after the node's, on the same SmartConnect."""
ETH_CTRL_RANGE = 0x1000
ETH_CLK_HZ = RGMII_RATE_BPS / 8
"""The clocking wizard's output for the RGMII transmitters (``eth_tx``) and the GT wizard's
free-running clock."""

MODULE_REF_VLNV = "xilinx.com:module_ref:{name}:1.0"
"""The VLNV a module-reference cell of Verilog module ``name`` has in the ``.hwh`` (the Vivado
flow's ``create_bd_cell -type module -reference``, :mod:`mcf.hdl.platform.kr260`): what a PYNQ
driver's ``bindto`` matches (:func:`mcf.driver.module_ref_vlnv`)."""
