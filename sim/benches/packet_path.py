"""cocotb bench: packetizer → parser in loopback (the bench top's ``loopback`` input).

Random stress: ``stress_packets`` (default 10,000) random packets of random size and port pushed
through both blocks under random idle and backpressure, checked against the two golden models
chained (``packetize`` then ``ParserModel``) and against every status counter.
"""

from __future__ import annotations

import random

import cocotb

from mcf.abi.meta import Port
from mcf.golden.packet import ParserModel, packetize, payload_frame, random_good_packet

from .packet_common import PacketTB
from .packet_parser import check_outputs


@cocotb.test()
async def path_stress(dut):
    tb = PacketTB(dut)
    await tb.start(7, 8, loopback=True)
    rng = random.Random(tb.width + 2024)
    n = tb.params.get("stress_packets", 10_000)
    max_len = tb.params.get("stress_max_len", 2 * tb.bpb)
    metas, frames = [], []
    for _ in range(n):
        length = 0 if rng.random() < 0.1 else rng.randrange(1, max_len + 1)
        meta, payload = random_good_packet(rng, tb.width, max_len=max_len,
                                           num_nodes=tb.num_nodes, meta_layout=tb.meta_layout,
                                           length=length, port=rng.choice(list(Port)),
                                           local_id=tb.local_id)
        metas.append(meta.pack(tb.meta_layout))
        if length:
            frames.append(payload_frame(payload, tb.width))
    wire = packetize(metas, frames, tb.width, tb.meta_layout)
    model = ParserModel(tb.width, max_payload=tb.max_payload, local_id=tb.local_id,
                        num_nodes=tb.num_nodes, meta_layout=tb.meta_layout)
    model.feed(wire)
    for raw in metas:
        await tb.send_meta(raw)
    for frame in frames:
        await tb.send_payload(frame)
    await check_outputs(tb, model)
    assert model.counters["rx_packets"] == n
    assert sum(v for k, v in model.counters.items() if k.startswith("drop_")) == 0
    assert tb.pz_status() == {"packets": n, "beats": len(wire)}
