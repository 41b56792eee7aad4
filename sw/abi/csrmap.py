"""Status layouts and the node's AXI-Lite register map, built from the ABI.

Each engine exposes its counters as one ``data.StructLayout`` defined here; the HDL drives a
signal of that layout, :func:`node_regmap` turns every field into a read-only register, and the
PYNQ driver reads them by name. Counters are 32 bits and wrap (software takes differences).
"""

from __future__ import annotations

from amaranth.lib import enum

from .attend import attend_registers
from .compute import COMPUTE_BUSY_STATUS, DMA_STATUS, GEMM_STATUS, STRIPE_STATUS, VECTOR_STATUS
from .decode_land import decode_land_registers
from .directory import directory_registers
from .emit import emit_registers
from .jobs import jobs_registers
from .kv import attn_status_layout
from .kv_channel import kvq_status_layout
from .kv_reader import kv_reader_registers
from .landing import landing_registers
from .link_map import link_map_registers
from .local_sink import local_sink_registers
from .meta import META, Port
from .nic import (
    A2A_STATUS,
    LINK_RX_STATUS,
    LINK_TX_STATUS,
    REDUCE_CONFIG,
    REDUCE_STATUS,
    ROUTER_STATUS,
)
from .node import dir_land_register, ingress_registers, irq_registers
from .node_config import caps_register
from .platform import HP_PORTS, NODE_LINKS
from .regs import (
    COUNTER_BITS,
    Access,
    Field,
    Register,
    RegisterMap,
    counters,
    status_registers,
)
from .route import ROUTE_ENTRY
from .send import send_registers
from .sequencer import sequencer_registers

__all__ = ["COUNTER_BITS", "DropCause", "counters", "PARSER_STATUS", "PACKETIZER_STATUS",
           "node_regmap", "nic_regmap", "nic_registers", "node_register", "NODE_MAP_VERSION",
           "NIC_MAP_VERSION", "NODE_LINKS", "PARSER_PORTS", "compute_registers",
           "node_top_registers", "stripe_registers"]

NODE_MAP_VERSION = 0x0403  # minor 1: jobs_bad_gemm; minor 2: the stripe_* counters (appended);
#                           minor 3: DIR_ENTRY.fresh (a field appended)
NIC_MAP_VERSION = 0x0200
PARSER_PORTS = NODE_LINKS + 1
"""Parsers of a node, each with its own counter set in the node map: parser 0 checks the local
packetizer's packets, parser ``1 + i`` the packets arriving on link ``i``."""


class DropCause(enum.Enum, shape=3):
    """Why the parser dropped a packet whole."""
    UNKNOWN_OP = 0   # op code not assigned in Op
    BAD_DST = 1      # dst >= number of nodes
    OVERSIZE = 2     # length > the parser's maximum payload
    TRUNCATED = 3    # last arrived before length bytes
    BAD_LENGTH = 4   # payload longer than length, or keep inconsistent with length


PARSER_STATUS = counters(
    "rx_packets",
    *(f"drop_{c.name.lower()}" for c in DropCause),
    *(f"tx_{p.name.lower()}" for p in Port),
)

PACKETIZER_STATUS = counters("packets", "beats")


def node_register() -> Register:
    """``NODE``: this node's identity, read by the parsers and the NIC engines."""
    node_bits = META["dst"].width
    return Register("NODE", (
        Field("local_id", node_bits, Access.RW, 0, "this node's id (Meta.src/dst space)"),
        Field("num_nodes", node_bits + 1, Access.RW, 1, "nodes in the cluster; dst >= is dropped"),
    ), "node identity")


def nic_registers(n_links: int = NODE_LINKS) -> list[Register]:
    """The NIC engines' registers (:mod:`mcf.abi.nic`): table write ports, watchdogs, status
    counters of the router, reduction, all-to-all and each link's framer/deframer. The node
    map and the NIC's own map both take them from here."""
    route_bits = META["route_id"].width
    regs = [
        Register("ROUTE_WR", (
            Field("route_id", route_bits, Access.W, desc="route-table entry to write"),
            Field("entry", ROUTE_ENTRY.size, Access.W, desc="ROUTE_ENTRY: port mask, local bit"),
        ), "router route-table write port (one write per strobe)"),
        Register("REDUCE_CFG_WR", (
            Field("route_id", route_bits, Access.W, desc="reduction tree to configure"),
            Field("config", REDUCE_CONFIG.size, Access.W,
                  desc="REDUCE_CONFIG: contributors k, final, result_route"),
        ), "reduction-engine configuration write port"),
        Register.single("reduce_timeout", COUNTER_BITS, Access.RW,
                        desc="reduction watchdog in cycles (0 disables)"),
        Register.single("a2a_timeout", COUNTER_BITS, Access.RW,
                        desc="all-to-all gather watchdog in cycles (0 disables)"),
    ]
    regs += status_registers("nic_router", ROUTER_STATUS, "router")
    regs += status_registers("nic_reduce", REDUCE_STATUS, "reduction")
    regs += status_registers("nic_a2a", A2A_STATUS, "all-to-all")
    for link in range(n_links):
        regs += status_registers(f"link{link}_tx", LINK_TX_STATUS, f"link {link} tx")
        regs += status_registers(f"link{link}_rx", LINK_RX_STATUS, f"link {link} rx")
    return regs


def node_regmap() -> RegisterMap:
    """The register map of one node's control/status block."""
    regs = RegisterMap("mcf_node", NODE_MAP_VERSION)
    regs.add(node_register())
    regs.add_status("pkt", PACKETIZER_STATUS, "packetizer")
    for port in range(PARSER_PORTS):
        regs.add_status(f"parser{port}", PARSER_STATUS,
                        "parser of the local packetizer" if port == 0 else
                        f"parser of link {port - 1}")
    regs.extend(nic_registers())
    regs.extend(compute_registers())
    regs.extend(node_top_registers())
    regs.extend(stripe_registers())
    return regs


def stripe_registers() -> list[Register]:
    """``stripe_<field>``: the GEMM's stripe readers (:data:`mcf.abi.compute.STRIPE_STATUS`;
    weights from every HP port, docs/node.md §4), after every other register of the map."""
    return status_registers("stripe", STRIPE_STATUS, "stripe readers (GEMM weights)")


def node_top_registers() -> list[Register]:
    """The registers of the node top's own blocks (docs/node.md §2–§9): configuration word,
    interrupts, command rings, sequencer, directory, landing, local sink, decode lander, send
    unit, link map, KV reader and the compute half's units (template walker, K/V emitter, ATTEND
    executor) — each block's list from its ABI module."""
    return [caps_register(), *irq_registers(), *ingress_registers(), *sequencer_registers(),
            *directory_registers(), dir_land_register(), *landing_registers(),
            *local_sink_registers(), *decode_land_registers(), *send_registers(),
            *link_map_registers(), *kv_reader_registers(), *jobs_registers(),
            *emit_registers(), *attend_registers()]


def compute_registers() -> list[Register]:
    """Status counters of the compute half of the node: one DMA loader per HP port, the GEMM
    engine, the vector unit, the attention engine and the K/V emitter (:mod:`mcf.abi.compute`,
    :mod:`mcf.abi.kv`)."""
    regs = []
    for port in range(HP_PORTS):
        regs += status_registers(f"dma{port}", DMA_STATUS, f"DMA loader on HP port {port}")
    regs += status_registers("gemm", GEMM_STATUS, "GEMM engine")
    regs += status_registers("vector", VECTOR_STATUS, "vector unit")
    regs += status_registers("attn", attn_status_layout(), "attention engine")
    regs += status_registers("kvq", kvq_status_layout(), "K/V emitter")
    regs += status_registers("cmp", COMPUTE_BUSY_STATUS, "compute half")
    return regs


def nic_regmap(n_links: int = NODE_LINKS) -> RegisterMap:
    """The register map of the NIC block on its own (:class:`mcf.hdl.nic.top.NicCsrTop`):
    ``NODE`` and :func:`nic_registers`, in the node map's order."""
    regs = RegisterMap("mcf_nic", NIC_MAP_VERSION)
    regs.add(node_register())
    regs.extend(nic_registers(n_links))
    return regs
