"""cocotb bench of the link framing (flat top ``nic_link_loop``, paper §5): ``LinkTx → LinkModel
(latency, bandwidth, injected frame drops and single-bit flips) → LinkRx``, plus a second
``LinkRx`` fed with hand-made malformed frames. Idle × backpressure on every stream.

Scoreboard (independent of the DUT: :func:`mcf.golden.nic.link_frame`, ``zlib`` CRC-32,
:class:`mcf.golden.nic.LinkRxModel`):

* link: a bus monitor on the link model's output records every frame the receiver sees; each
  is matched to the frame the transmitter had to send for its packet (``link_frame``): equal,
  or differing in exactly one bit (a flip). Frames never seen were dropped. The model's
  counters must equal those numbers; ``LinkRxModel`` fed with the seen frames gives the
  packets the receiver must deliver (in order, bit-exact) and its counters; every flipped
  frame must be rejected (CRC error, or oversize when it was too long anyway) and every loss
  must show up in ``lost_frames`` unless it trails the last delivered frame.
* injection: good frames, gaps, stale and duplicate sequence numbers, CRC errors (bit flips,
  truncation, a CRC beat with the wrong ``keep``), bad magic with a valid CRC, runt frames
  (shorter than header + Meta + CRC), oversize frames — every drop cause of ``LINK_RX_STATUS``.
"""

from __future__ import annotations

import logging
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, with_timeout
from cocotbext.axi import (
    AxiStreamBus,
    AxiStreamFrame,
    AxiStreamMonitor,
    AxiStreamSink,
    AxiStreamSource,
)

from mcf.abi.meta import META, Collective, Meta, Op, ReduceOp, Stage
from mcf.abi.nic import CRC_BYTES, LINK_HEADER, LINK_MAGIC, LINK_RX_STATUS, LINK_TX_STATUS, link_crc
from mcf.golden.nic import LinkRxModel, Packet, link_frame
from mcf.hdl.nic.link_model import LINK_MODEL_STATUS
from mcf.sim.tb import set_pauses
from mcf.sim.toolchain import bench_params

SEQ_MOD = 1 << LINK_HEADER["seq"].width
META_MASK = (1 << META.size) - 1
LOOKAHEAD = 64          # consecutive dropped frames the matcher tolerates (p(drop) ≈ 5 %)


def unpack(layout, raw):
    return {n: (raw >> f.offset) & ((1 << f.width) - 1) for n, f in layout}


def frame_beats(f: AxiStreamFrame, bpb: int) -> list[tuple[bytes, int]]:
    """A received AXI-Stream frame (``compact=False``) as (beat bytes, keep) pairs."""
    data, keep = bytes(f.tdata), list(f.tkeep)
    assert len(data) % bpb == 0
    return [(data[b:b + bpb], sum(k << n for n, k in enumerate(keep[b:b + bpb])))
            for b in range(0, len(data), bpb)]


def to_axis(beats: list[tuple[bytes, int]], bpb: int) -> AxiStreamFrame:
    """(beat bytes, keep) pairs as one AXI-Stream frame (``tlast`` on the final beat)."""
    data = b"".join(d.ljust(bpb, b"\0") for d, _ in beats)
    keep = [k >> n & 1 for _, k in beats for n in range(bpb)]
    return AxiStreamFrame(data, tkeep=keep)


def wire_packet(beats: list[tuple[bytes, int]]) -> tuple[int, bytes]:
    """A delivered wire packet (Meta beat, payload beats) as (raw meta, payload bytes)."""
    payload = b""
    for d, k in beats[1:]:
        n = bin(k).count("1")
        assert k == (1 << n) - 1, f"keep {k:#x} not contiguous"
        payload += d[:n]
    return int.from_bytes(beats[0][0], "little") & META_MASK, payload


def as_raw(p: Packet) -> tuple[int, bytes]:
    return p.meta.pack(), p.payload


def bit_distance(a, b) -> int | None:
    """Bits that differ between two frames of the same shape (``None``: shapes differ)."""
    if len(a) != len(b) or any(ka != kb for (_, ka), (_, kb) in zip(a, b)):
        return None
    return sum(bin(int.from_bytes(da, "little") ^ int.from_bytes(db, "little")).count("1")
               for (da, _), (db, _) in zip(a, b))


def seal(body: list[tuple[bytes, int]], bpb: int) -> list[tuple[bytes, int]]:
    """``body`` (header, Meta, payload beats) plus a correct CRC-32 beat."""
    return body + [(link_crc(body).to_bytes(CRC_BYTES, "little").ljust(bpb, b"\0"),
                    (1 << CRC_BYTES) - 1)]


def header(seq: int, bpb: int, magic: int = LINK_MAGIC) -> tuple[bytes, int]:
    raw = LINK_HEADER.const({"magic": magic, "seq": seq % SEQ_MOD}).as_bits()
    return raw.to_bytes(bpb, "little"), (1 << bpb) - 1


def random_packet(rng: random.Random, uid: int, bpb: int, max_payload: int,
                  oversize: float = 0.0) -> Packet:
    r = rng.random()
    if r < oversize:                    # longer than the receiver's buffer allows
        length = max_payload + rng.randrange(1, 3 * bpb)
    elif r < 0.08:
        length = 0
    elif r < 0.14:
        length = max_payload
    else:
        length = rng.choice([1, bpb - 1, bpb, bpb + 1, 2 * bpb, rng.randrange(1, 6 * bpb),
                             rng.randrange(1, max_payload + 1)])
    meta = Meta(stage=rng.choice(list(Stage)), op=rng.choice(list(Op)),
                collective=rng.choice(list(Collective)), reduce_op=rng.choice(list(ReduceOp)),
                src=rng.randrange(32), dst=rng.randrange(32), route_id=rng.randrange(256),
                kv_id=uid % (1 << 16), length=length, seq=rng.randrange(256))
    return Packet(meta, rng.randbytes(length))


def flip_bit(frame, rng):
    """One random bit of a valid byte flipped (the frame's CRC no longer matches)."""
    b = rng.randrange(len(frame))
    d, k = frame[b]
    nbytes = bin(k).count("1")
    if nbytes == 0:
        return None
    bit = rng.randrange(8 * nbytes)
    flipped = (int.from_bytes(d, "little") ^ (1 << bit)).to_bytes(len(d), "little")
    return frame[:b] + [(flipped, k)] + frame[b + 1:]


INJECT_KINDS = ("good", "gap", "stale", "duplicate", "flip", "truncated", "crc_keep",
                "bad_magic", "runt", "oversize", "oversize_bad_crc")


def injected_frame(kind, rng, model: LinkRxModel, last_good, uid, bpb, max_payload):
    """One hand-made frame of the given kind, built around the model's expected sequence."""
    exp = model.expected
    pkt = random_packet(rng, uid, bpb, max_payload)
    if kind == "good":
        return link_frame(pkt, exp, 8 * bpb)
    if kind == "gap":
        ahead = rng.choice([1, 2, rng.randrange(1, SEQ_MOD // 2)])
        return link_frame(pkt, (exp + ahead) % SEQ_MOD, 8 * bpb)
    if kind == "stale":
        return link_frame(pkt, (exp - rng.randrange(2, SEQ_MOD // 2 + 1)) % SEQ_MOD, 8 * bpb)
    if kind == "duplicate":             # the last frame delivered, again
        return last_good or link_frame(pkt, (exp - 1) % SEQ_MOD, 8 * bpb)
    frame = link_frame(pkt, exp, 8 * bpb)
    if kind == "flip":
        return flip_bit(frame, rng)
    if kind == "truncated":             # payload beats missing, the original CRC kept
        if len(frame) < 4:
            frame = link_frame(Packet(pkt.meta.replace(length=2 * bpb), bytes(2 * bpb)), exp,
                               8 * bpb)
        cut = rng.randrange(1, len(frame) - 2)
        return frame[:len(frame) - 1 - cut] + frame[-1:]
    if kind == "crc_keep":              # right CRC bytes, wrong keep on the CRC beat
        d, _ = frame[-1]
        return frame[:-1] + [(d, rng.choice([(1 << (CRC_BYTES - 1)) - 1, (1 << bpb) - 1,
                                             (1 << (CRC_BYTES + 1)) - 1]))]
    if kind == "bad_magic":
        magic = LINK_MAGIC ^ (1 << rng.randrange(LINK_HEADER["magic"].width))
        return seal([header(exp, bpb, magic)] + frame[1:-1], bpb)
    if kind == "runt":                  # shorter than header + Meta + CRC, valid CRC
        return seal(rng.choice([[], [header(exp, bpb)]]), bpb)
    extra = [(rng.randbytes(bpb), (1 << bpb) - 1)] * rng.randrange(1, 4)
    filler = [(rng.randbytes(bpb), (1 << bpb) - 1)] * (max_payload // bpb)
    big = seal(frame[:2] + filler + extra, bpb)
    if kind == "oversize":
        return big
    return flip_bit(big, rng)           # oversize_bad_crc: oversize wins over the CRC


class TB:
    def __init__(self, dut, bpb):
        self.dut = dut
        self.bpb = bpb
        cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
        self.src = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis"), dut.clk, dut.rst)
        self.sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis"), dut.clk, dut.rst)
        self.isrc = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_inj"), dut.clk,
                                    dut.rst)
        self.isink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_inj"), dut.clk,
                                   dut.rst)
        self.mon = AxiStreamMonitor(AxiStreamBus.from_prefix(dut, "tap"), dut.clk, dut.rst)
        for x in (self.src, self.sink, self.isrc, self.isink, self.mon):
            x.log.setLevel(logging.WARNING)

    async def reset(self):
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 3)
        self.dut.rst.value = 0
        await RisingEdge(self.dut.clk)

    def status(self, name, layout):
        return unpack(layout, int(getattr(self.dut, name).value))

    def send_packet(self, p: Packet):
        raw = p.meta.pack()
        if not p.payload:
            return AxiStreamFrame(bytes(self.bpb), tkeep=[0] * self.bpb, tuser=raw)
        return AxiStreamFrame(p.payload, tuser=raw)


def match_frames(sent, seen):
    """Pair every seen frame with the sent frame it came from (in order; equal or one bit
    flipped). Returns [(index in sent, bits flipped)]."""
    pairs, j = [], 0
    for f in seen:
        for k in range(j, min(j + LOOKAHEAD, len(sent))):
            d = bit_distance(sent[k], f)
            if d is not None and d <= 1:
                pairs.append((k, d))
                j = k + 1
                break
        else:
            raise AssertionError(f"a frame on the link matches no sent frame after #{j}")
    return pairs


async def drain(tb, n_frames, limit_cycles=20_000):
    """Wait until the transmitter sent ``n_frames`` and the link model let all of them out
    (called once the source is idle: only the frames in flight remain)."""
    for _ in range(limit_cycles // 50):
        tx = tb.status("tx_status", LINK_TX_STATUS)
        lm = tb.status("link_status", LINK_MODEL_STATUS)
        if tx["frames"] == n_frames and lm["frames"] == n_frames and \
                tb.mon.queue.qsize() == n_frames - lm["dropped"]:
            return
        await ClockCycles(tb.dut.clk, 50)
    raise AssertionError("the link did not drain: hang")


async def run_test(dut, idle, backpressure, seed, n_packets, n_inject):
    prm = bench_params()
    dw, maxp = prm["data_width"], prm["max_payload"]
    bpb = dw // 8
    tb = TB(dut, bpb)
    rng = random.Random(seed)
    await tb.reset()
    set_pauses(rng, [tb.src, tb.isrc], [tb.sink, tb.isink], idle=0.3 if idle else None,
               backpressure=(0.2, 0.7) if backpressure else None)

    # ---- traffic: packets for the link, hand-made frames for the second receiver -------------
    pkts = [random_packet(rng, uid, bpb, maxp, oversize=0.01) for uid in range(n_packets)]
    sent = [link_frame(p, k % SEQ_MOD, dw) for k, p in enumerate(pkts)]
    inj_model = LinkRxModel(dw, maxp)
    inj_frames, inj_expected, last_good = [], [], None
    kinds = list(INJECT_KINDS) + [rng.choice(INJECT_KINDS[:3] * 4 + INJECT_KINDS)
                                  for _ in range(max(0, n_inject - len(INJECT_KINDS)))]
    for uid, kind in enumerate(kinds):
        f = None
        while f is None:
            f = injected_frame(kind, rng, inj_model, last_good, uid, bpb, maxp)
        r = inj_model.receive(f)
        if isinstance(r, Packet):
            inj_expected.append(as_raw(r))
            last_good = f
        inj_frames.append(f)
    for p in pkts:
        await tb.src.send(tb.send_packet(p))
    for f in inj_frames:
        await tb.isrc.send(to_axis(f, bpb))

    # ---- injection receiver: delivered packets and counters ----------------------------------
    got = []
    for _ in inj_expected:
        f = await with_timeout(tb.isink.recv(compact=False), 2000, "us")
        got.append(wire_packet(frame_beats(f, bpb)))
    assert got == inj_expected, "injection receiver: delivered packets differ from the model"

    # ---- link: what the link model let through, and what the receiver made of it ------------
    total_beats = sum(len(f) for f in sent) + sum(len(f) for f in inj_frames)
    await with_timeout(tb.src.wait(), 10 * (10_000 + 200 * total_beats), "ns")
    await drain(tb, n_packets)
    seen = []
    while not tb.mon.empty():
        seen.append(frame_beats(tb.mon.recv_nowait(compact=False), bpb))
    pairs = match_frames(sent, seen)
    lm = tb.status("link_status", LINK_MODEL_STATUS)
    flipped = [k for k, d in pairs if d == 1]
    assert lm == {"frames": n_packets, "dropped": n_packets - len(seen),
                  "corrupted": len(flipped)}, lm
    model = LinkRxModel(dw, maxp)
    expected, delivered = [], []
    for (k, d), f in zip(pairs, seen):
        r = model.receive(f)
        if d:                                    # every flipped frame is rejected
            assert r in ("crc_errors", "drop_oversize"), (k, r)
        elif len(f) <= model.max_frame_beats():  # an intact frame is delivered
            assert r == pkts[k], (k, r)
        if isinstance(r, Packet):
            expected.append(as_raw(r))
            delivered.append(k)
    got = []
    for _ in expected:
        f = await with_timeout(tb.sink.recv(compact=False), 2000, "us")
        got.append(wire_packet(frame_beats(f, bpb)))
    assert got == expected, "link receiver: delivered packets differ from the model"

    await with_timeout(tb.isrc.wait(), 10 * (10_000 + 200 * total_beats), "ns")
    await ClockCycles(dut.clk, 200)
    assert tb.sink.empty() and tb.isink.empty(), "unexpected extra packet"
    tx = tb.status("tx_status", LINK_TX_STATUS)
    assert tx == {"frames": n_packets, "beats": sum(len(f) for f in sent)}, tx
    rx = tb.status("rx_status", LINK_RX_STATUS)
    assert rx == model.counters, (rx, model.counters)
    assert rx["crc_errors"] == sum(len(seen[i]) <= model.max_frame_beats()
                                   for i, (_, d) in enumerate(pairs) if d)
    # loss is never silent: every frame not delivered, up to the last delivered one, is counted
    last = delivered[-1] if delivered else -1
    assert rx["lost_frames"] == last + 1 - rx["frames_ok"], (rx, last)
    inj = tb.status("inj_status", LINK_RX_STATUS)
    assert inj == inj_model.counters, (inj, inj_model.counters)
    for c in ("frames_ok", "crc_errors", "drop_bad_header", "drop_oversize", "drop_stale",
              "seq_gaps", "lost_frames"):
        assert inj[c] > 0, f"injection never exercised {c}"
    if n_packets >= 200:
        assert lm["dropped"] > 0 and lm["corrupted"] > 0 and rx["drop_oversize"] > 0
    dut._log.info("link: %d packets, %d dropped, %d flipped, %d delivered; injection: %d frames "
                  "%s", n_packets, lm["dropped"], lm["corrupted"], rx["frames_ok"],
                  len(inj_frames), inj)


@cocotb.test()
@cocotb.parametrize(idle=[False, True], backpressure=[False, True])
async def test_link(dut, idle, backpressure):
    prm = bench_params()
    n = prm.get("n_packets", 200)
    await run_test(dut, idle, backpressure, seed=40 + 2 * int(idle) + int(backpressure),
                   n_packets=n, n_inject=prm.get("n_inject", max(len(INJECT_KINDS), n // 4)))
