"""Top-level assemblies of the packet path: packetizer → parser for Verilog and benchmarks, and
the combined cocotb bench top (both blocks side by side, with an internal loopback).

The metadata input is a plain ``meta_layout.size``-bit stream here so that :class:`FlatTop`
names it ``s_axis_meta_tdata`` (a struct payload would be flattened field by field).
"""

from __future__ import annotations

from amaranth import Module, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.csrmap import PACKETIZER_STATUS, PARSER_STATUS
from mcf.abi.framing import MAX_PAYLOAD, beat_layout, parsed_layout
from mcf.abi.meta import META, Port

from ..flat import FlatTop
from .packetizer import Packetizer
from .parser import Parser, port_member_name

__all__ = ["PacketPath", "PacketBench", "packet_path_top", "packet_bench_top", "AXIS_NAMES"]

AXIS_NAMES = {"i_meta": "s_axis_meta", "i_payload": "s_axis_payload",
              "o_packet": "m_axis_packet", "i_packet": "s_axis_packet",
              **{port_member_name(p): f"m_axis_{p.name.lower()}" for p in Port}}
"""Flat AXI-Stream prefixes of the packet-path tops (cocotbext-axi ``from_prefix``)."""


def _members(data_width, meta_layout):
    parsed = stream.Signature(parsed_layout(data_width, meta_layout))
    node_bits = meta_layout["dst"].width
    return {
        "i_meta": In(stream.Signature(unsigned(meta_layout.size))),
        "i_payload": In(stream.Signature(beat_layout(data_width, meta_layout))),
        **{port_member_name(p): Out(parsed) for p in Port},
        "local_id": In(node_bits),
        "num_nodes": In(node_bits + 1),
        "pz_status": Out(PACKETIZER_STATUS),
        "ps_status": Out(PARSER_STATUS),
    }


def _connect_meta(m, outer, pz, meta_layout):
    m.d.comb += [
        pz.i_meta.valid.eq(outer.valid),
        pz.i_meta.payload.eq(data.View(meta_layout, outer.payload)),
        outer.ready.eq(pz.i_meta.ready),
    ]


def _connect_outputs(m, top, ps):
    for p in Port:
        wiring.connect(m, ps.output(p), wiring.flipped(getattr(top, port_member_name(p))))
    m.d.comb += [ps.local_id.eq(top.local_id), ps.num_nodes.eq(top.num_nodes),
                 top.ps_status.eq(ps.status)]


class _PacketPair(wiring.Component):
    """A packetizer and a parser with the members of :func:`_members` (plus ``extra``): what
    :class:`PacketPath` and :class:`PacketBench` share — their parameters, the two blocks and
    the metadata and payload inputs into the packetizer."""

    def __init__(self, data_width: int, meta_layout: data.StructLayout, max_payload: int,
                 payload_depth: int, meta_depth: int, extra: dict | None = None):
        self._params = dict(data_width=data_width, meta_layout=meta_layout)
        self._pz_args = dict(payload_depth=payload_depth, meta_depth=meta_depth)
        self._ps_args = dict(max_payload=max_payload)
        super().__init__({**_members(data_width, meta_layout), **(extra or {})})

    def _blocks(self, m) -> tuple[Packetizer, Parser]:
        m.submodules.packetizer = pz = Packetizer(**self._params, **self._pz_args)
        m.submodules.parser = ps = Parser(**self._params, **self._ps_args)
        _connect_meta(m, self.i_meta, pz, self._params["meta_layout"])
        wiring.connect(m, wiring.flipped(self.i_payload), pz.i_payload)
        return pz, ps


class PacketPath(_PacketPair):
    """Packetizer → parser, as on one node between the compute side and the NIC engines.

    Members: ``i_meta`` (raw metadata words), ``i_payload``, one ``o_<port>`` per
    :class:`~mcf.abi.meta.Port`, ``local_id``, ``num_nodes``, ``pz_status``, ``ps_status``.
    Latency: packetizer (2 cycles to the header) + parser (store-and-forward, see
    :class:`~mcf.hdl.packet.parser.Parser`). Throughput: one wire beat per cycle.
    """

    def __init__(self, data_width: int = 128, meta_layout: data.StructLayout = META, *,
                 max_payload: int = MAX_PAYLOAD, payload_depth: int = 512,
                 meta_depth: int = 16):
        super().__init__(data_width, meta_layout, max_payload, payload_depth, meta_depth)

    def elaborate(self, platform):
        m = Module()
        pz, ps = self._blocks(m)
        wiring.connect(m, pz.o_packet, ps.i_packet)
        _connect_outputs(m, self, ps)
        m.d.comb += self.pz_status.eq(pz.status)
        return m


class PacketBench(_PacketPair):
    """Both blocks in one design for the cocotb benches (one Verilator build per width).

    Members: those of :class:`PacketPath`, plus ``o_packet`` (the packetizer's output) and
    ``i_packet`` (the parser's input), and ``loopback``: when high the packetizer feeds the
    parser directly (``o_packet.valid`` and ``i_packet.ready`` held low); when low the two
    blocks are independent. Change ``loopback`` only while both are idle.
    """

    def __init__(self, data_width: int = 128, meta_layout: data.StructLayout = META, *,
                 max_payload: int = MAX_PAYLOAD, payload_depth: int = 64,
                 meta_depth: int = 8):
        beat = stream.Signature(beat_layout(data_width, meta_layout))
        super().__init__(data_width, meta_layout, max_payload, payload_depth, meta_depth,
                         {"o_packet": Out(beat), "i_packet": In(beat), "loopback": In(1)})

    def elaborate(self, platform):
        m = Module()
        pz, ps = self._blocks(m)
        _connect_outputs(m, self, ps)
        m.d.comb += [self.pz_status.eq(pz.status),
                     self.o_packet.payload.eq(pz.o_packet.payload)]
        with m.If(self.loopback):
            m.d.comb += [ps.i_packet.valid.eq(pz.o_packet.valid),
                         ps.i_packet.payload.eq(pz.o_packet.payload),
                         pz.o_packet.ready.eq(ps.i_packet.ready)]
        with m.Else():
            m.d.comb += [self.o_packet.valid.eq(pz.o_packet.valid),
                         pz.o_packet.ready.eq(self.o_packet.ready),
                         ps.i_packet.valid.eq(self.i_packet.valid),
                         ps.i_packet.payload.eq(self.i_packet.payload),
                         self.i_packet.ready.eq(ps.i_packet.ready)]
        return m


def packet_path_top(data_width: int = 128, **kwargs) -> FlatTop:
    return FlatTop(PacketPath(data_width, **kwargs), AXIS_NAMES)


def packet_bench_top(data_width: int = 128, **kwargs) -> FlatTop:
    return FlatTop(PacketBench(data_width, **kwargs), AXIS_NAMES)
