"""A hardware-handoff (``.hwh``) file for the KR260 block design of docs/board.md §2, written the
way Vivado writes one, so that ``pynq.Overlay`` parses it with its own metadata front end
(``pynqmetadata``) and binds :class:`mcf.driver.NodeDriver` by the module reference's VLNV.

What it holds, as the Tcl builds it: the PS (``ps``, ``zynq_ultra_ps_e``) with its memory map
(the node's ``s_axi_ctrl`` segment on ``M_AXI_HPM0_FPD``), ``pl_clk0`` and ``pl_ps_irq0``; the
SmartConnect ``ctrl_smc`` between ``M_AXI_HPM0_FPD`` and the node; ``rst`` (``proc_sys_reset``);
the node (``node``, ``xilinx.com:module_ref:<top>:1.0``) with every port of the real top, its
``s_axi_ctrl`` slave and ``m_axi_hp0..3`` masters as bus interfaces, and ``irq`` wired to
``pl_ps_irq0``. Only what a PYNQ overlay reads is written (no PS configuration dump).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mcf.abi.csrmap import node_regmap
from mcf.abi.node_config import AXI_WIDTH
from mcf.abi.platform import CTRL_BASE
from mcf.hdl.platform.kr260 import BOARD_PART, PART

__all__ = ["CTRL_BASE", "Port", "ctrl_range", "node_hwh", "write_hwh", "verilog_ports"]

PS = "ps"
NODE = "node"
SMC = "ctrl_smc"
RST = "rst"
VIVADO = "2023.2"


@dataclass(frozen=True)
class Port:
    """A top-level port: name, direction (``"i"``/``"o"``), width in bits."""
    name: str
    dir: str
    width: int


_DECL = re.compile(r"^\s*(input|output)\s+(?:wire\s+|reg\s+)?(?:\[(\d+):0\]\s+)?(\w+)\s*;")


def verilog_ports(text: str, module: str) -> list[Port]:
    """The ports of ``module`` as declared in Verilog ``text`` (what Vivado's module reference
    sees), in declaration order."""
    m = re.search(rf"^module {re.escape(module)}\s*\(", text, re.M)
    if m is None:
        raise ValueError(f"no module {module} in the Verilog")
    body = text[m.end(): text.index("endmodule", m.end())]
    out = []
    for line in body.splitlines():
        d = _DECL.match(line)
        if d:
            out.append(Port(d.group(3), d.group(1)[0], int(d.group(2) or 0) + 1))
    return out


def ctrl_range() -> int:
    """The control segment's size: the CSR bank decodes ``max(12, bits of the map)`` address
    bits (docs/node.md §10 note (a)), so at least 4 KiB."""
    return max(1 << 12, node_regmap().size)


def _sub(parent, tag, **attrs) -> ET.Element:
    return ET.SubElement(parent, tag, {k: str(v) for k, v in attrs.items()})


def _port(parent, p: Port, signame: str, conns: Iterable[tuple[str, str]], sigis: str = "undef",
          **extra):
    attrs = {"DIR": "O" if p.dir == "o" else "I", "NAME": p.name, "SIGIS": sigis,
             "SIGNAME": signame, **extra}
    if p.width > 1:
        attrs.update(LEFT=p.width - 1, RIGHT=0)
    el = _sub(parent, "PORT", **attrs)
    cs = _sub(el, "CONNECTIONS")
    for inst, port in conns:
        _sub(cs, "CONNECTION", INSTANCE=inst, PORT=port)
    return el


def _busif(parent, name: str, kind: str, busname: str, vlnv: str, prefix: str,
           ports: list[Port], params: dict[str, str] | None = None):
    el = _sub(parent, "BUSINTERFACE", BUSNAME=busname, NAME=name, TYPE=kind, VLNV=vlnv,
              DATAWIDTH=AXI_WIDTH if "hp" in prefix else 32)
    ps = _sub(el, "PARAMETERS")
    for k, v in (params or {}).items():
        _sub(ps, "PARAMETER", NAME=k, VALUE=v)
    pm = _sub(el, "PORTMAPS")
    for p in ports:
        if p.name.startswith(prefix + "_"):
            logical = p.name[len(prefix) + 1:].upper()
            m = _sub(pm, "PORTMAP", LOGICAL=logical, PHYSICAL=p.name)
            if p.width > 1:
                m.set("LEFT", str(p.width - 1))
                m.set("RIGHT", "0")
    return el


def node_hwh(top: str, ports: Iterable[Port], *, base: int = CTRL_BASE,
             part: str = PART) -> str:
    """The ``.hwh`` text of the block design with the node top ``top`` (its ``ports``)."""
    from mcf.driver import module_ref_vlnv
    ports = list(ports)
    names = {p.name for p in ports}
    for need in ("aclk", "aresetn", "irq", "s_axi_ctrl_awaddr"):
        if need not in names:
            raise ValueError(f"the top {top} has no port {need}")
    vlnv = module_ref_vlnv(top)
    hp = sorted({p.name.split("_")[2] for p in ports if p.name.startswith("m_axi_hp")})
    size = ctrl_range()
    root = ET.Element("EDKSYSTEM", EDWVERSION="1.2", TIMESTAMP="mcf", VIVADOVERSION=VIVADO)
    dev, pkg, speed, *_ = part.split("-")
    _sub(root, "SYSTEMINFO", ARCH="zynquplus", BOARD=BOARD_PART,
         DEVICE=dev, NAME=f"{top}_bd", PACKAGE=pkg, SPEEDGRADE=f"-{speed}")
    _sub(root, "EXTERNALPORTS")
    _sub(root, "EXTERNALINTERFACES")
    mods = _sub(root, "MODULES")

    # --- the PS ----------------------------------------------------------------------------------
    ps = _sub(mods, "MODULE", CONFIGURABLE="TRUE", COREREVISION="5", FULLNAME=f"/{PS}",
              HWVERSION="3.5", INSTANCE=PS, IPTYPE="PERIPHERAL", IS_ENABLE="1", IS_PL="FALSE",
              MODTYPE="zynq_ultra_ps_e", VLNV="xilinx.com:ip:zynq_ultra_ps_e:3.5")
    params = _sub(ps, "PARAMETERS")
    ps_params = [("PSU__USE__M_AXI_GP0", "1"), ("PSU__USE__IRQ0", "1")]
    for i in range(4):      # PL clocks: pl_clk0 on at the preset's 100 MHz (IOPLL / 15 / 1)
        ps_params += [(f"PSU__FPGA_PL{i}_ENABLE", str(int(i == 0))),
                      (f"PSU__CRL_APB__PL{i}_REF_CTRL__SRCSEL", "IOPLL"),
                      (f"PSU__CRL_APB__PL{i}_REF_CTRL__DIVISOR0", "15" if i == 0 else "4"),
                      (f"PSU__CRL_APB__PL{i}_REF_CTRL__DIVISOR1", "1"),
                      (f"PSU__CRL_APB__PL{i}_REF_CTRL__ACT_FREQMHZ",
                       "99.999001" if i == 0 else "374.996246")]
    for i, _ in enumerate(hp):
        ps_params += [(f"PSU__USE__S_AXI_GP{2 + i}", "1"),
                      (f"PSU__SAXIGP{2 + i}__DATA_WIDTH", str(AXI_WIDTH))]
    for k, v in ps_params:
        _sub(params, "PARAMETER", NAME=k, VALUE=v)
    pports = _sub(ps, "PORTS")
    _port(pports, Port("pl_clk0", "o", 1), f"{PS}_pl_clk0",
          [(NODE, "aclk"), (SMC, "aclk"), (RST, "slowest_sync_clk")], sigis="clk",
          CLKFREQUENCY="99999001")
    _port(pports, Port("pl_resetn0", "o", 1), f"{PS}_pl_resetn0", [(RST, "ext_reset_in")],
          sigis="rst")
    _port(pports, Port("pl_ps_irq0", "i", 1), f"{NODE}_irq", [(NODE, "irq")],
          sigis="INTERRUPT", SENSITIVITY="LEVEL_HIGH:EDGE_RISING")
    pbus = _sub(ps, "BUSINTERFACES")
    _sub(pbus, "BUSINTERFACE", BUSNAME=f"{PS}_M_AXI_HPM0_FPD", DATAWIDTH="128",
         NAME="M_AXI_HPM0_FPD", TYPE="MASTER", VLNV="xilinx.com:interface:aximm:1.0")
    for i, _ in enumerate(hp):
        _sub(pbus, "BUSINTERFACE", BUSNAME=f"{NODE}_m_axi_hp{i}", DATAWIDTH=str(AXI_WIDTH),
             NAME=f"S_AXI_HP{i}_FPD", TYPE="SLAVE", VLNV="xilinx.com:interface:aximm:1.0")
    mm = _sub(ps, "MEMORYMAP")
    _sub(mm, "MEMRANGE", ADDRESSBLOCK="reg0", BASENAME="C_BASEADDR", BASEVALUE=f"{base:#010X}"
         .replace("0X", "0x"), HIGHNAME="C_HIGHADDR",
         HIGHVALUE=f"{base + size - 1:#010X}".replace("0X", "0x"), INSTANCE=NODE,
         IS_DATA="TRUE", IS_INSTRUCTION="TRUE", MASTERBUSINTERFACE="M_AXI_HPM0_FPD",
         MEMTYPE="REGISTER", SLAVEBUSINTERFACE="s_axi_ctrl")

    # --- the SmartConnect and the reset block ----------------------------------------------------
    smc = _sub(mods, "MODULE", COREREVISION="22", FULLNAME=f"/{SMC}", HWVERSION="1.0",
               INSTANCE=SMC, IPTYPE="BUS", IS_ENABLE="1", MODCLASS="BUS", MODTYPE="smartconnect",
               VLNV="xilinx.com:ip:smartconnect:1.0")
    sports = _sub(smc, "PORTS")
    _port(sports, Port("aclk", "i", 1), f"{PS}_pl_clk0", [(PS, "pl_clk0")], sigis="clk")
    _port(sports, Port("aresetn", "i", 1), f"{RST}_peripheral_aresetn",
          [(RST, "peripheral_aresetn")], sigis="rst")
    sbus = _sub(smc, "BUSINTERFACES")
    _sub(sbus, "BUSINTERFACE", BUSNAME=f"{PS}_M_AXI_HPM0_FPD", NAME="S00_AXI", TYPE="SLAVE",
         VLNV="xilinx.com:interface:aximm:1.0")
    _sub(sbus, "BUSINTERFACE", BUSNAME=f"{SMC}_M00_AXI", NAME="M00_AXI", TYPE="MASTER",
         VLNV="xilinx.com:interface:aximm:1.0")
    rst = _sub(mods, "MODULE", COREREVISION="14", FULLNAME=f"/{RST}", HWVERSION="5.0",
               INSTANCE=RST, IPTYPE="PERIPHERAL", IS_ENABLE="1", MODCLASS="PERIPHERAL",
               MODTYPE="proc_sys_reset", VLNV="xilinx.com:ip:proc_sys_reset:5.0")
    rports = _sub(rst, "PORTS")
    _port(rports, Port("slowest_sync_clk", "i", 1), f"{PS}_pl_clk0", [(PS, "pl_clk0")],
          sigis="clk")
    _port(rports, Port("ext_reset_in", "i", 1), f"{PS}_pl_resetn0", [(PS, "pl_resetn0")],
          sigis="rst")
    _port(rports, Port("peripheral_aresetn", "o", 1), f"{RST}_peripheral_aresetn",
          [(NODE, "aresetn"), (SMC, "aresetn")], sigis="rst")

    # --- the node (module reference) -------------------------------------------------------------
    node = _sub(mods, "MODULE", COREREVISION="1", FULLNAME=f"/{NODE}", HWVERSION="1.0",
                INSTANCE=NODE, IPTYPE="PERIPHERAL", IS_ENABLE="1", MODCLASS="PERIPHERAL",
                MODTYPE=top, VLNV=vlnv)
    nparams = _sub(node, "PARAMETERS")
    _sub(nparams, "PARAMETER", NAME="C_BASEADDR", VALUE=f"{base:#010x}")
    _sub(nparams, "PARAMETER", NAME="C_HIGHADDR", VALUE=f"{base + size - 1:#010x}")
    blocks = _sub(node, "ADDRESSBLOCKS")
    _sub(blocks, "ADDRESSBLOCK", ACCESS="read-write", INTERFACE="s_axi_ctrl", NAME="reg0",
         RANGE=str(size), USAGE="register")
    nports = _sub(node, "PORTS")
    for p in ports:
        if p.name == "aclk":
            _port(nports, p, f"{PS}_pl_clk0", [(PS, "pl_clk0")], sigis="clk",
                  CLKFREQUENCY="99999001")
        elif p.name == "aresetn":
            _port(nports, p, f"{RST}_peripheral_aresetn", [(RST, "peripheral_aresetn")],
                  sigis="rst", POLARITY="ACTIVE_LOW")
        elif p.name == "irq":
            _port(nports, p, f"{NODE}_irq", [(PS, "pl_ps_irq0")], sigis="INTERRUPT",
                  SENSITIVITY="LEVEL_HIGH")
        elif p.name.startswith("s_axi_ctrl_"):          # SmartConnect M00_AXI <-> s_axi_ctrl
            net, peer = f"{SMC}_M00_AXI_{p.name[11:].upper()}", f"M00_AXI_{p.name[11:]}"
            _port(nports, p, net, [(SMC, peer)])
            _port(sports, Port(peer, "o" if p.dir == "i" else "i", p.width), net,
                  [(NODE, p.name)])
        elif p.name.startswith("m_axi_hp"):             # m_axi_hp<i> <-> S_AXI_HP<i>_FPD
            i = int(p.name.split("_")[2][2:])
            net, peer = f"{NODE}_{p.name}", f"saxigp{2 + i}_{p.name.split('_', 3)[3]}"
            _port(nports, p, net, [(PS, peer)])
            _port(pports, Port(peer, "o" if p.dir == "i" else "i", p.width), net,
                  [(NODE, p.name)])
        else:
            _port(nports, p, "", [])        # the links: not connected (docs/board.md §3)
    nbus = _sub(node, "BUSINTERFACES")
    _busif(nbus, "s_axi_ctrl", "SLAVE", f"{SMC}_M00_AXI", "xilinx.com:interface:aximm:1.0",
           "s_axi_ctrl", ports, {"PROTOCOL": "AXI4LITE", "ADDR_WIDTH": "12",
                                 "DATA_WIDTH": "32"})
    for i, _ in enumerate(hp):
        _busif(nbus, f"m_axi_hp{i}", "MASTER", f"{NODE}_m_axi_hp{i}",
               "xilinx.com:interface:aximm:1.0", f"m_axi_hp{i}", ports,
               {"PROTOCOL": "AXI4", "DATA_WIDTH": str(AXI_WIDTH)})
    ET.indent(root, "  ")
    return '<?xml version="1.0" encoding="UTF-8" standalone="no" ?>\n' + \
        ET.tostring(root, encoding="unicode") + "\n"


def write_hwh(path: Path, top: str, ports: Iterable[Port], **kw) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(node_hwh(top, ports, **kw), encoding="utf-8")
    return path
