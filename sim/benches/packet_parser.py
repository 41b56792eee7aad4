"""cocotb bench: the parser (``s_axis_packet`` → ``m_axis_<port>``, metadata on ``tuser``).

Input packets are built with the ABI (``Meta.pack``, ``encode_packet``) and the golden
stimulus helpers; expected outputs and counters come from the golden
:class:`mcf.golden.packet.ParserModel`.
"""

from __future__ import annotations

import random

import cocotb

from mcf.abi.csrmap import DropCause
from mcf.abi.meta import Port
from mcf.golden.packet import ParserModel, malformed_packet, packet_beats, random_good_packet

from .packet_common import PacketTB


async def check_outputs(tb: PacketTB, model: ParserModel):
    """Every expected packet, bit for bit (meta on tuser, data, keep, last), at its port; no
    extra packet anywhere; counters exact."""
    await tb.drain()
    for port in Port:
        for i, exp in enumerate(model.outputs[port]):
            got = await tb.recv_parsed(port)
            assert got == exp, f"{port.name} packet {i}"
        assert tb.sinks[port].empty(), f"extra packets on {port.name}"
    assert tb.ps_status() == model.counters


def _model(tb: PacketTB) -> ParserModel:
    return ParserModel(tb.width, max_payload=tb.max_payload, local_id=tb.local_id,
                       num_nodes=tb.num_nodes, meta_layout=tb.meta_layout)


@cocotb.test()
@cocotb.parametrize(idle=[False, True], backpressure=[False, True])
async def parser_frames(dut, idle, backpressure):
    tb = PacketTB(dut)
    await tb.start(3 if idle else None, 4 if backpressure else None)
    rng = random.Random(tb.width * 5 + 4 * idle + 2 * backpressure)
    lengths = list(range(1, 4 * tb.bpb + 1)) + [tb.max_payload] + [0] * 16
    ports = list(Port)
    model = _model(tb)
    for i, n in enumerate(lengths):
        meta, payload = random_good_packet(rng, tb.width, max_len=tb.max_payload,
                                           num_nodes=tb.num_nodes, meta_layout=tb.meta_layout,
                                           length=n, port=ports[i % len(ports)],
                                           local_id=tb.local_id)
        beats = packet_beats(meta, payload, tb.width, tb.meta_layout)
        model.feed(beats)
        await tb.send_packet(beats)
    await check_outputs(tb, model)
    assert all(model.outputs[p] for p in Port)
    assert model.counters["rx_packets"] == len(lengths)


@cocotb.test()
async def parser_fuzz(dut):
    """Good packets with malformed ones of every cause mixed in, random idle and backpressure:
    every good packet arrives bit-exact at the right port and every counter is exact."""
    tb = PacketTB(dut)
    await tb.start(5, 6)
    rng = random.Random(tb.width + 99)
    model = _model(tb)
    causes = list(DropCause)
    for _ in range(tb.params.get("fuzz_packets", 600)):
        if rng.random() < 0.3:
            beats = malformed_packet(rng, rng.choice(causes), tb.width,
                                     max_payload=tb.max_payload, num_nodes=tb.num_nodes,
                                     max_len=4 * tb.bpb, meta_layout=tb.meta_layout)
        else:
            meta, payload = random_good_packet(
                rng, tb.width, max_len=4 * tb.bpb, num_nodes=tb.num_nodes,
                meta_layout=tb.meta_layout, port=rng.choice(list(Port)), local_id=tb.local_id)
            beats = packet_beats(meta, payload, tb.width, tb.meta_layout)
        model.feed(beats)
        await tb.send_packet(beats)
    await check_outputs(tb, model)
    for c in causes:
        assert model.counters[f"drop_{c.name.lower()}"] > 0, c
