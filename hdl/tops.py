"""Every top-level design ``mcf verilog`` writes: name → factory returning a
:class:`mcf.hdl.flat.FlatTop` (flat Xilinx-style port names). Add a line when a top lands."""

from __future__ import annotations

from collections.abc import Callable

from .flat import FlatTop

TOPS: dict[str, Callable[[], FlatTop]] = {}


def _packet_path() -> FlatTop:
    from .packet.top import packet_path_top
    return packet_path_top()


TOPS["mcf_packet_path"] = _packet_path  # packetizer -> parser, 128-bit (hdl/packet/top.py)


def _attention() -> FlatTop:
    from .compute.attention_top import AXIS_NAMES, AttentionTop
    return FlatTop(AttentionTop(), AXIS_NAMES)


def _kv_quantizer() -> FlatTop:
    from .compute.attention_kvq import KVQuantizer
    return FlatTop(KVQuantizer(), {"i": "s_axis", "o": "m_axis"})


TOPS["mcf_attention"] = _attention        # attention engine, Qwen2.5-1.5B heads (hdl/compute)
TOPS["mcf_kv_quantizer"] = _kv_quantizer  # prefill K/V → INT4 block payload (hdl/compute)


def _csr() -> FlatTop:
    from ..abi.csrmap import node_regmap
    from .csr.top import csr_flat_top
    return csr_flat_top(node_regmap())


TOPS["mcf_csr"] = _csr  # AXI-Lite CSR bank for the node register map (hdl/csr, docs/csr.md)


def _nic_router() -> FlatTop:
    from .nic.router import Router
    r = Router(data_width=64, n_ports=4, n_local_in=1, max_payload=256)
    axis = {f"i{i}": f"s_axis_i{i}" for i in range(r.n_inputs)}
    axis.update({f"o{p}": f"m_axis_o{p}" for p in range(r.n_ports)})
    axis["local"] = "m_axis_local"
    return FlatTop(r, axis)


TOPS["nic_router"] = _nic_router  # NIC forwarding/multicast router, 4 ports (docs/nic.md)


def _matrix_engine() -> FlatTop:
    from .compute.gemm_top import MatrixEngine
    return FlatTop(MatrixEngine())


def _dma_loader() -> FlatTop:
    from .mem.dma import DmaLoader
    return FlatTop(DmaLoader(), {"rd_desc": "s_axis_rd_desc", "rd": "m_axis_rd",
                                 "wr_desc": "s_axis_wr_desc", "wr": "s_axis_wr"})


TOPS["mcf_matrix_engine"] = _matrix_engine  # DMA x2 + INT4 GEMM + vector unit (docs/compute.md)
TOPS["mcf_dma_loader"] = _dma_loader        # AXI4 DMA read/write loader, 128-bit (hdl/mem)


def _nic_reduce() -> FlatTop:
    from .nic.reduce import ReduceEngine
    return FlatTop(ReduceEngine(data_width=64, n_slots=4, max_payload=256),
                   {"i": "s_axis", "o": "m_axis"})


TOPS["nic_reduce"] = _nic_reduce  # NIC reduction engine (max/sum/softmax merge, docs/nic.md)


def _nic_link_loop() -> FlatTop:
    from .nic.link_loop import LinkLoop
    return FlatTop(LinkLoop(data_width=64, max_payload=256, latency=12, rate=(6, 1),
                            drop_p16=3000, flip_p16=5000, seed=0xACE1),
                   {"i": "s_axis", "o": "m_axis", "inj": "s_axis_inj", "inj_o": "m_axis_inj"})


def _nic_all_to_all() -> FlatTop:
    from .nic.all_to_all import AllToAll
    return FlatTop(AllToAll(data_width=64, max_nodes=8, part_max=256, n_slots=2),
                   {"scatter": "s_axis_scatter", "net": "m_axis_net", "i": "s_axis",
                    "o": "m_axis"})


TOPS["nic_link_loop"] = _nic_link_loop    # bench only: LinkTx → LinkModel → LinkRx (+ 2nd RX)
TOPS["nic_all_to_all"] = _nic_all_to_all  # NIC all-to-all scatter/gather engine (docs/nic.md)


def _nic() -> FlatTop:
    from .nic.top import NicCsrTop, nic_axis_names
    top = NicCsrTop()
    return FlatTop(top, nic_axis_names(top.nic.n_links, top.nic.n_inject))


TOPS["mcf_nic"] = _nic  # NIC engines + links behind the AXI-Lite NIC registers (docs/nic.md)


def _node(config_name: str) -> Callable[[], FlatTop]:
    def make() -> FlatTop:
        from ..abi.node_config import NODE_CONFIGS
        from .node.top import NodeTop
        return FlatTop(NodeTop(NODE_CONFIGS[config_name]), clock="aclk", resetn="aresetn")
    return make


TOPS["mcf_node"] = _node("kr260")      # one KR260 node, kr260 configuration (docs/node.md)
TOPS["mcf_node_sim"] = _node("sim")    # the same ports, the sim configuration (docs/node.md §12)


def _eth() -> FlatTop:
    from .eth.links import EthLinks
    return FlatTop(EthLinks(primitives=True), clock="aclk", resetn="aresetn")


TOPS["mcf_eth"] = _eth  # the node's three MACs + their AXI-Lite bank s_axi_eth (docs/eth.md)
