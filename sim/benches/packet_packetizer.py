"""cocotb bench: the packetizer (``s_axis_meta`` + ``s_axis_payload`` → ``m_axis_packet``).

Expected packets come from :func:`mcf.abi.framing.encode_packet` (through
:func:`mcf.golden.packet.packet_beats`) and the golden packetizer; the DUT's code is never used
to build them.
"""

from __future__ import annotations

import random

import cocotb
from cocotb.triggers import ClockCycles

from mcf.golden.packet import packet_beats, packetize, payload_frame, random_good_packet

from .packet_common import PacketTB


def frame_lengths(tb: PacketTB) -> list[int]:
    """1..4×lanes bytes, the maximum, then a run of minimum-size (zero-length) packets."""
    return list(range(1, 4 * tb.bpb + 1)) + [tb.max_payload] + [0] * 16


async def _push(tb: PacketTB, packets) -> list[list]:
    """Queue every packet on the two inputs; return the expected wire packets."""
    metas = [m.pack(tb.meta_layout) for m, _ in packets]
    frames = [payload_frame(p, tb.width) for m, p in packets if m.length]
    flat = packetize(metas, frames, tb.width, tb.meta_layout)
    assert flat == [b for m, p in packets
                    for b in packet_beats(m, p, tb.width, tb.meta_layout)]
    for raw in metas:
        await tb.send_meta(raw)
    for frame in frames:
        await tb.send_payload(frame)
    expected, cur = [], []
    for b in flat:
        cur.append(b)
        if b.last:
            expected.append(cur)
            cur = []
    return expected


@cocotb.test()
@cocotb.parametrize(idle=[False, True], backpressure=[False, True])
async def packetizer_frames(dut, idle, backpressure):
    tb = PacketTB(dut)
    await tb.start(1 if idle else None, 2 if backpressure else None)
    rng = random.Random(tb.width + 4 * idle + 2 * backpressure)
    packets = [random_good_packet(rng, tb.width, max_len=tb.max_payload,
                                  num_nodes=tb.num_nodes, meta_layout=tb.meta_layout, length=n)
               for n in frame_lengths(tb)]
    expected = await _push(tb, packets)
    for i, exp in enumerate(expected):
        got = await tb.recv_packet()
        assert got == exp, f"packet {i} (length {packets[i][0].length})"
    await tb.drain()
    assert tb.packet_sink.empty()
    assert tb.pz_status() == {"packets": len(expected),
                              "beats": sum(len(p) for p in expected)}


@cocotb.test()
async def packetizer_congestion(dut):
    """NIC stalled: the compute side fills the buffer, then stops (tready low); nothing is lost
    or reordered when the NIC resumes."""
    tb = PacketTB(dut)
    await tb.reset()
    tb.packet_sink.pause = True
    rng = random.Random(7)
    packets = [random_good_packet(rng, tb.width, max_len=3 * tb.bpb, num_nodes=tb.num_nodes,
                                  meta_layout=tb.meta_layout,
                                  length=rng.randrange(2 * tb.bpb, 3 * tb.bpb + 1))
               for _ in range(64)]
    expected = await _push(tb, packets)
    await ClockCycles(dut.clk, 400)
    # inputs are blocked, the buffer holds what it can, nothing was sent
    assert int(dut.s_axis_payload_tready.value) == 0
    assert not tb.payload_src.empty() and tb.packet_sink.empty()
    assert tb.pz_status()["beats"] == 0
    tb.packet_sink.pause = False
    for exp in expected:
        assert await tb.recv_packet() == exp
    await tb.drain()
    assert tb.pz_status()["packets"] == len(packets)
