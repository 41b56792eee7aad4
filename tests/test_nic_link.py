"""Link framing tests (amaranth.sim): TX frames bit-exact with mcf.golden.nic.link_frame (CRC-32
= zlib), RX checks against LinkRxModel (stale, gaps, bad header, oversize), and TX → link model
(latency, bandwidth, drops, bit flips) → RX: every corrupted frame detected, every loss counted,
every delivered packet bit-exact."""

from __future__ import annotations

import random

from amaranth.sim import Simulator

from mcf.abi.meta import Meta
from mcf.abi.nic import LINK_RX_STATUS, LINK_TX_STATUS, link_crc
from mcf.golden.nic import LinkRxModel, Packet, link_frame, parsed_beats
from mcf.hdl.nic.link import LinkRx, LinkTx
from mcf.hdl.nic.link_loop import LinkLoop
from mcf.hdl.nic.link_model import LINK_MODEL_STATUS
from mcf.sim.amsim import drive, sink_process, split_packets, unpack_fields

DW = 64
BPB = DW // 8
MAXP = 64


def wire_to_packet(beats):
    meta = Meta.unpack(beats[0]["data"] & ((1 << 64) - 1))
    payload = b"".join(b["data"].to_bytes(BPB, "little")[:bin(b["keep"]).count("1")]
                       for b in beats[1:])
    return Packet(meta, payload)


def random_packets(rng, n):
    out = []
    for uid in range(n):
        length = rng.choice([0, 1, 8, 9, 17, rng.randrange(MAXP + 1)])
        out.append(Packet(Meta(kv_id=uid, route_id=uid & 0xFF, length=length),
                          rng.randbytes(length)))
    return out


def frame_beats(frame):
    return [{"data": int.from_bytes(d, "little"), "keep": k, "last": int(n == len(frame) - 1)}
            for n, (d, k) in enumerate(frame)]


def test_tx_frames_match_golden():
    rng = random.Random(1)
    pkts = random_packets(rng, 30)
    dut = LinkTx(data_width=DW)
    got, status = [], {}
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(sink_process(dut.o, got, random.Random(2), 0.6))

    async def tb(ctx):
        beats = [b for p in pkts for b in parsed_beats(p.meta, p.payload, DW)]
        await drive(ctx, dut.i, beats, random.Random(3), 0.3)
        n = sum(len(link_frame(p, 0, DW)) for p in pkts)
        while len(got) < n:
            await ctx.tick()
        await ctx.tick()
        status.update(unpack_fields(LINK_TX_STATUS, ctx.get(dut.status.as_value())))

    sim.add_testbench(tb)
    sim.run()
    frames = split_packets(got)
    assert len(frames) == len(pkts)
    for seq, (p, f) in enumerate(zip(pkts, frames)):
        exp = frame_beats(link_frame(p, seq, DW))
        assert [(b["data"] & ((1 << (8 * bin(b["keep"]).count("1"))) - 1), b["keep"], b["last"])
                for b in f] == [(b["data"], b["keep"], b["last"]) for b in exp]
    assert status == {"frames": len(pkts), "beats": len(got)}


def run_rx(frames, ready=0.7, seed=4):
    dut = LinkRx(data_width=DW, max_payload=MAXP)
    model = LinkRxModel(DW, MAXP)
    expected = [r for r in (model.receive(f) for f in frames) if isinstance(r, Packet)]
    got, status = [], {}
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(sink_process(dut.o, got, random.Random(seed), ready))

    async def tb(ctx):
        beats = [b for f in frames for b in frame_beats(f)]
        await drive(ctx, dut.i, beats, random.Random(seed + 1), 0.2)
        for _ in range(400):
            await ctx.tick()
        status.update(unpack_fields(LINK_RX_STATUS, ctx.get(dut.status.as_value())))

    sim.add_testbench(tb)
    sim.run()
    return [wire_to_packet(b) for b in split_packets(got)], expected, status, model.counters


def test_rx_checks_match_golden():
    rng = random.Random(5)
    pkts = random_packets(rng, 40)
    frames, seq = [], 0
    for n, p in enumerate(pkts):
        f = link_frame(p, seq, DW)
        kind = n % 8
        if kind == 1:                       # CRC error: flip a payload/header bit
            d, k = f[0]
            f[0] = (bytes([d[0] ^ 0x10]) + d[1:], k)
        elif kind == 2:                     # a gap: two frames lost before this one
            seq += 2
            f = link_frame(p, seq, DW)
        elif kind == 3 and seq > 3:         # stale: a duplicate of an old sequence number
            f = link_frame(p, seq - 3, DW)
            seq -= 1
        elif kind == 4:                     # bad magic (with a valid CRC)
            from mcf.golden import nic as g
            hdr = g._link_header(seq, magic=0x1234).to_bytes(BPB, "little")
            body = [(hdr, f[0][1])] + f[1:-1]
            crc = link_crc(body).to_bytes(4, "little").ljust(BPB, b"\0")
            f = body + [(crc, 0xF)]
        elif kind == 5:                     # oversize: payload beats beyond the maximum
            extra = [(rng.randbytes(BPB), 0xFF)] * 12
            body = f[:-1] + extra
            f = body + [(link_crc(body).to_bytes(4, "little").ljust(BPB, b"\0"), 0xF)]
        frames.append(f)
        seq += 1
    got, expected, status, counters = run_rx(frames)
    assert got == expected
    assert status == counters
    for c in ("crc_errors", "seq_gaps", "drop_stale", "drop_bad_header", "drop_oversize"):
        assert status[c] > 0, c


def run_loop(dut: LinkLoop, pkts, seed: int, ready: float, idle: float, tail: int,
             inject: bool = False):
    """``pkts`` through ``dut`` (random ready/idle from ``seed``); ``inject`` pulses the link
    model's ``inject`` before the first frame. Returns the delivered packets and the link
    model's and receiver's counters."""
    got, status = [], {}
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(sink_process(dut.o, got, random.Random(seed), ready))

    async def tb(ctx):
        if inject:
            ctx.set(dut.link.inject, 1)
            await ctx.tick()
            ctx.set(dut.link.inject, 0)
        beats = [b for p in pkts for b in parsed_beats(p.meta, p.payload, DW)]
        await drive(ctx, dut.i, beats, random.Random(seed + 1), idle)
        for _ in range(tail):
            await ctx.tick()
        status["link"] = unpack_fields(LINK_MODEL_STATUS, ctx.get(dut.link_status.as_value()))
        status["rx"] = unpack_fields(LINK_RX_STATUS, ctx.get(dut.rx_status.as_value()))

    sim.add_testbench(tb)
    sim.run()
    return [wire_to_packet(b) for b in split_packets(got)], status["link"], status["rx"]


def test_link_model_drops_and_flips_all_detected():
    rng = random.Random(8)
    pkts = random_packets(rng, 150)
    dut = LinkLoop(data_width=DW, max_payload=MAXP, latency=12, rate=(5, 2), drop_p16=6000,
                   flip_p16=9000, seed=0x1234)
    delivered, link, rx = run_loop(dut, pkts, 9, 0.8, 0.1, 600)
    ids = [p.meta.kv_id for p in delivered]
    assert ids == sorted(ids)
    for p in delivered:
        assert p == pkts[p.meta.kv_id], "a delivered packet differs from the one sent"
    assert link["frames"] == len(pkts)
    assert link["dropped"] > 5 and link["corrupted"] > 5
    assert rx["crc_errors"] == link["corrupted"]                  # every flip detected
    assert rx["frames_ok"] == len(delivered)
    assert link["dropped"] + link["corrupted"] == len(pkts) - len(delivered)
    trailing = len(pkts) - 1 - ids[-1]
    assert rx["lost_frames"] == len(pkts) - len(delivered) - trailing
    assert rx["drop_stale"] == rx["drop_bad_header"] == rx["drop_oversize"] == 0


def test_link_model_inject_flips_exactly_the_next_frame():
    """``inject`` (a one-cycle pulse) corrupts the next frame only: the receiver counts one CRC
    error and drops that frame, every other packet arrives bit-exact."""
    pkts = random_packets(random.Random(11), 12)
    dut = LinkLoop(data_width=DW, max_payload=MAXP, latency=12, rate=(8, 1))
    delivered, link, rx = run_loop(dut, pkts, 12, 0.9, 0.2, 400, inject=True)
    assert [p.meta.kv_id for p in delivered] == list(range(1, len(pkts)))
    assert delivered == pkts[1:]
    assert link["corrupted"] == 1 and link["frames"] == len(pkts)
    assert rx["crc_errors"] == 1 and rx["frames_ok"] == len(pkts) - 1


def test_crc_of_beat_every_keep_pattern():
    """The beat CRC unit against zlib for every ``keep`` (all 256): the whole beat folds into
    the register, the bytes outside ``keep`` as zero (:func:`mcf.abi.nic.link_crc`)."""
    import zlib

    from mcf.hdl.nic.crc import CrcOfBeat

    dut = CrcOfBeat(DW)
    rng = random.Random(12)

    def step(crc: int, data: bytes) -> int:   # zlib state convention: register = ~crc
        return ~zlib.crc32(data, ~crc & 0xFFFFFFFF) & 0xFFFFFFFF

    async def bench(ctx):
        for keep in range(1 << BPB):
            for _ in range(4):
                crc, data = rng.getrandbits(32), rng.randbytes(BPB)
                ctx.set(dut.crc_in, crc)
                ctx.set(dut.data, int.from_bytes(data, "little"))
                ctx.set(dut.keep, keep)
                masked = bytes(b if keep >> n & 1 else 0 for n, b in enumerate(data))
                want = step(crc, masked)
                assert ctx.get(dut.crc_out) == want, keep

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()
