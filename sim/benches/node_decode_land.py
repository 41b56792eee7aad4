"""cocotb bench of the decode lander (flat top ``node_decode_land``: ``DecodeLander`` under
``FlatTop``; docs/node.md §5, §7) against cocotbext-axi ``AxiRam``.

Traffic (:func:`make_traffic`): decode queries of random INT8 codes and scales
(:func:`mcf.abi.query.pack_query`) cut as MARS cuts them (:func:`mcf.abi.query.query_fragments`),
final states — the :func:`mcf.abi.softmax.merge_states` fold of random per-node partial
states, packed by :func:`mcf.abi.softmax.pack_state`, with edge cases (empty state ``l = 0``,
``l`` of one LSB, ``l`` with its top bit set, ``o`` that saturates) — and the two-phase
decode's all-reduced maxima (``Op.REDUCTION``, ``reduce_op = NONE``: 1..8 random
:data:`mcf.abi.softmax.STATE_M` words, ``M_EMPTY`` among them, from a random first head) with
MARS's Meta (``kv_id = decode_tag(k, head)``, ``seq`` = layer), mixed with malformed packets:
queries whose length disagrees with their header, with no heads, beyond ``Q_HEADS`` or longer
than the slot; states with a ``reduce_op`` other than NONE, a wrong length, a head beyond
``Q_HEADS``; maxima with a ``reduce_op`` other than NONE, of length 0, not a multiple of 4 or
above ``M_SLOT_BYTES``, from a head beyond ``Q_HEADS`` (each of these at least once); every
other op. One OBUF row and one MBUF slot have an injected SLVERR (``AxiRam``'s own
mechanism: a write that raises). ``MBUF_BASE`` is 4- but not 16-byte aligned, so maxima
slots share AXI beats and one slot crosses a 4 KiB page.

Scoreboard (:class:`mcf.golden.decode_land.DecodeLandModel`): every byte of QBUF, OBUF and MBUF
and around them equals the model's (bytes never written keep the fill pattern; the failed
writes' bytes are skipped), and every ``DECODE_LAND_STATUS`` counter exactly. Idle cycles on
the input, pauses on AW/W/B.

Params: ``seed``, ``n`` (packets), ``idle``, ``pause`` (AXI channel pause probability),
``head_dim`` (must equal the built lander's), ``tests``; ``out``: a JSON file for the rate
measurement (``rate`` test: full input rate, no pauses; input beats per cycle from the first
input beat to the last count; ``rate_mixes``: of ``states``, ``queries``, ``mixed`` — the
three without maxima — and ``with_maxima``).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge

from mcf.abi.decode_land import (
    DECODE_LAND_STATUS,
    M_SLOT_BYTES,
    DecodeLandConfig,
    DecodeLandResult,
    decode_land_decision,
    mbuf_bytes,
    obuf_row_bytes,
    query_slot_bytes,
    state_bytes,
)
from mcf.abi.framing import MAX_PAYLOAD, payload_beats
from mcf.abi.meta import META, Collective, Meta, Op, ReduceOp, Stage
from mcf.abi.quant import SCALE_EXP_BITS, SCALE_MANT_BITS
from mcf.abi.query import QUERY_HEADER, pack_query, query_bytes, query_fragments
from mcf.abi.softmax import M_EMPTY, STATE_L, STATE_M, STATE_O, merge_states, pack_state
from mcf.golden.decode_land import DecodeLandModel
from mcf.sim.benches.packet_lander import LanderTB
from mcf.sim.toolchain import bench_params, skip_unless_selected

MEM = 1 << 20
FILL = 0xA5
HEAD_DIM = 16          # the bench's DecodeLander(head_dim=...) (the sim configuration's)
TAG_BITS = META["kv_id"].width

__all__ = ["Traffic", "make_traffic", "random_state", "edge_states", "query_packet",
           "state_packet", "maxima_packet", "HEAD_DIM"]


@dataclass
class Traffic:
    cfg: DecodeLandConfig
    head_dim: int
    packets: list          # [(Meta, bytes)]
    bad_addrs: tuple[int, ...] = ()   # the AXI beats (16 B) whose writes raise
    beat_bytes: int = 16

    def span(self, meta: Meta, payload: bytes) -> range | None:
        """Bytes a packet lands on, or ``None`` when it is dropped."""
        result, addr = decode_land_decision(self.cfg, meta, payload, self.head_dim)
        if addr is None:
            return None
        size = obuf_row_bytes(self.head_dim) if result is DecodeLandResult.RESULT else \
            meta.length
        return range(addr, addr + size)

    def write_error(self, meta: Meta, payload: bytes) -> bool:
        """The packet's bursts include a raising beat."""
        span = self.span(meta, payload)
        return span is not None and any(span.start < a + self.beat_bytes and a < span.stop
                                        for a in self.bad_addrs)

    def model(self) -> DecodeLandModel:
        model = DecodeLandModel(self.cfg, self.head_dim)
        for meta, payload in self.packets:
            model.land(meta, payload, self.write_error(meta, payload))
        return model


def random_state(g: np.random.Generator, head_dim: int, nodes: int = 3):
    """A root's final state: the merge of ``nodes`` random partial states (scores around 0 in
    SCORE units, ``l`` of one to a thousand keys, ``o`` within ``l`` times a value range)."""
    parts = []
    for _ in range(nodes):
        m = int(g.integers(-1 << 12, 1 << 12))
        l_sum = int(g.integers(1 << STATE_L.frac, 1000 << STATE_L.frac))
        vmax = 1 << int(g.integers(0, 8))
        o = g.integers(-l_sum * vmax, l_sum * vmax + 1, head_dim) >> int(g.integers(0, 12))
        o = np.clip(o, STATE_O.min_int, STATE_O.max_int)
        parts.append((np.int64(m), np.int64(l_sum), o.astype(np.int64)))
    return merge_states(parts)


def edge_states(g: np.random.Generator, head_dim: int) -> list:
    """Empty state, ``l`` of one LSB, ``l`` with its top bit set, saturating ``o``."""
    big = np.full(head_dim, STATE_O.max_int, dtype=np.int64)
    big[::2] = STATE_O.min_int
    rnd = g.integers(STATE_O.min_int, STATE_O.max_int + 1, head_dim)
    return [(M_EMPTY, 0, np.zeros(head_dim, dtype=np.int64)),
            (0, 1, rnd), (5, STATE_L.max_int, rnd), (-3, 3, big),
            (7, 1 << 15, rnd), (0, (1 << 16) + 1, big)]


def query_packet(rng: random.Random, cfg: DecodeLandConfig, head_dim: int, k: int,
                 layer: int, head0: int, count: int) -> tuple[Meta, bytes]:
    g = np.random.default_rng([rng.randrange(1 << 30), head0])
    codes = g.integers(-128, 128, (count, head_dim))
    scales = np.stack([g.integers(0, 1 << SCALE_MANT_BITS, count),
                       g.integers(-(1 << (SCALE_EXP_BITS - 1)), 1 << (SCALE_EXP_BITS - 1),
                                  count)], axis=-1)
    payload = pack_query(codes, scales, pos=rng.randrange(1 << 20), layer=layer, head0=head0)
    meta = Meta(stage=Stage.DECODE, op=Op.QUERY, collective=Collective.MULTICAST,
                src=rng.randrange(4), dst=rng.randrange(4), route_id=rng.randrange(256),
                kv_id=(k * cfg.q_heads + head0) % (1 << TAG_BITS), length=len(payload),
                seq=layer)
    return meta, payload


def state_packet(rng: random.Random, cfg: DecodeLandConfig, state, head: int,
                 layer: int) -> tuple[Meta, bytes]:
    payload = pack_state(*state)
    meta = Meta(stage=Stage.DECODE, op=Op.PARTIAL_STATE, collective=Collective.MULTICAST,
                reduce_op=ReduceOp.NONE, src=rng.randrange(4), dst=rng.randrange(4),
                route_id=rng.randrange(256),
                kv_id=(cfg.tag_base + head) % (1 << TAG_BITS), length=len(payload), seq=layer)
    return meta, payload


def maxima_packet(rng: random.Random, cfg: DecodeLandConfig, head0: int, heads: int,
                  layer: int) -> tuple[Meta, bytes]:
    """The root's all-reduced maxima of query heads ``head0 .. head0 + heads − 1``: ``heads``
    random :data:`mcf.abi.softmax.STATE_M` words (one in ten ``M_EMPTY``), MARS's Meta
    (``kv_id = decode_tag(k, head0)``, ``seq`` = layer, the root's multicast)."""
    words = [M_EMPTY if rng.random() < 0.1 else rng.randint(STATE_M.min_int, STATE_M.max_int)
             for _ in range(heads)]
    payload = b"".join(w.to_bytes(4, "little", signed=True) for w in words)
    meta = Meta(stage=Stage.DECODE, op=Op.REDUCTION, collective=Collective.MULTICAST,
                reduce_op=ReduceOp.NONE, src=rng.randrange(4), dst=rng.randrange(4),
                route_id=rng.randrange(256),
                kv_id=(cfg.tag_base + head0) % (1 << TAG_BITS), length=len(payload), seq=layer)
    return meta, payload


def make_traffic(seed: int, n: int, head_dim: int = HEAD_DIM, q_heads: int = 6,
                 max_payload: int = 64, bad_fraction: float = 0.25,
                 qbuf_base: int = 0xF18, obuf_base: int = 0x7_FF44, mbuf_base: int = 0x4_0FB4,
                 k: int = 4099, bad_write: bool = True, max_fraction: float = 0.2) -> Traffic:
    """``n`` packets (queries, final states and — ``max_fraction`` of them — maxima;
    ``bad_fraction`` of them malformed, plus one malformed maxima packet of each drop cause
    when both fractions are non-zero), for decode token ``k`` (``TAG_BASE = k · q_heads``);
    queries cut at ``max_payload`` bytes. ``bad_write``: one OBUF row and (with maxima) one
    MBUF slot answer SLVERR. ``max_fraction = 0`` draws exactly the packets it drew before
    maxima existed (the rate figures compare)."""
    rng = random.Random(seed)
    g = np.random.default_rng(seed)
    frags = query_fragments(q_heads, head_dim, max_payload)
    widest = max(c for _, c in frags)
    cfg = DecodeLandConfig(qbuf_base, obuf_base, query_slot_bytes(widest, head_dim), q_heads,
                           (k * q_heads) % (1 << TAG_BITS), mbuf_base)
    edges = edge_states(g, head_dim)
    packets = []
    n_max = M_SLOT_BYTES // 4
    for _ in range(n):
        layer = rng.randrange(1 << META["seq"].width)
        if max_fraction and rng.random() < max_fraction:
            meta, payload = maxima_packet(rng, cfg, rng.randrange(q_heads),
                                          rng.randint(1, n_max), layer)
        elif rng.random() < 0.4:
            head0, count = rng.choice(frags)
            meta, payload = query_packet(rng, cfg, head_dim, k, layer, head0, count)
        else:
            state = edges.pop() if edges else random_state(g, head_dim, rng.randrange(1, 5))
            meta, payload = state_packet(rng, cfg, state, rng.randrange(q_heads), layer)
        if rng.random() < bad_fraction:
            meta, payload = _malform(rng, cfg, head_dim, k, meta, payload)
        packets.append((meta, payload))
    if max_fraction and bad_fraction:
        for kind in range(len(_MAXIMA_MALFORM)):
            meta, payload = maxima_packet(rng, cfg, rng.randrange(q_heads),
                                          rng.randint(1, n_max), rng.randrange(4))
            packets.insert(rng.randrange(len(packets) + 1),
                           _malform_maxima(rng, cfg, meta, payload, kind))
    t = Traffic(cfg, head_dim, packets)
    if bad_write:
        bad = [state_packet(rng, cfg, random_state(g, head_dim), q_heads - 1, 1)]
        if max_fraction:
            bad.append(maxima_packet(rng, cfg, q_heads // 2, n_max, 0))
        addrs = []
        for meta, payload in bad:
            addr = t.span(meta, payload).start + 20
            addrs.append(addr - addr % t.beat_bytes)
            packets.insert(rng.randrange(len(packets) + 1), (meta, payload))
        t.bad_addrs = tuple(addrs)
    return t


_MAXIMA_MALFORM = ("reduce_op", "empty", "unaligned", "long", "slot")


def _malform_maxima(rng, cfg, meta, payload, kind=None):
    """Maxima with one of the drop causes: a ``reduce_op`` other than NONE (a contribution
    that should have gone to the reduction engine), length 0, not a multiple of 4 or above
    ``M_SLOT_BYTES``, a first head beyond ``Q_HEADS``."""
    name = _MAXIMA_MALFORM[rng.randrange(len(_MAXIMA_MALFORM)) if kind is None else kind]
    if name == "reduce_op":
        return meta.replace(reduce_op=rng.choice(
            [ReduceOp.MAX, ReduceOp.SUM, ReduceOp.SOFTMAX_MERGE])), payload
    if name == "empty":         # one keep = 0 beat
        return meta.replace(length=0), b""
    if name == "unaligned":     # 4·j + 1..3 bytes
        body = payload[:4 * rng.randrange(len(payload) // 4)] + \
            bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4)))
        return meta.replace(length=len(body)), body
    if name == "long":
        body = payload + bytes(rng.randrange(256) for _ in range(M_SLOT_BYTES + 4 -
                                                                 len(payload)))
        body += bytes(4 * rng.randrange(3))
        return meta.replace(length=len(body)), body
    head = rng.randrange(cfg.q_heads, 1 << TAG_BITS)
    return meta.replace(kv_id=(cfg.tag_base + head) % (1 << TAG_BITS)), payload


def _malform(rng, cfg, head_dim, k, meta, payload):
    """One of the drop causes (or a framing-free variant of it)."""
    if meta.op == Op.REDUCTION:
        return _malform_maxima(rng, cfg, meta, payload)
    kind = rng.randrange(8)
    if kind == 0:               # another op
        op = rng.choice([o for o in Op if o not in (Op.QUERY, Op.PARTIAL_STATE, Op.REDUCTION)])
        return meta.replace(op=op), payload
    if kind == 1:               # a state that should have gone to the reduction engine
        return meta.replace(op=Op.PARTIAL_STATE, reduce_op=rng.choice(
            [ReduceOp.MAX, ReduceOp.SUM, ReduceOp.SOFTMAX_MERGE])), payload
    if kind == 2:               # a state of the wrong length
        length = state_bytes(head_dim) + rng.choice([-8, -4, 4, 8, 64])
        body = bytes(rng.randrange(256) for _ in range(length))
        return meta.replace(op=Op.PARTIAL_STATE, reduce_op=ReduceOp.NONE, length=length), body
    if kind == 3:               # a state for a head beyond Q_HEADS
        head = rng.randrange(cfg.q_heads, 1 << TAG_BITS)
        body = pack_state(M_EMPTY, 1 << 16, np.zeros(head_dim, dtype=np.int64))
        return meta.replace(op=Op.PARTIAL_STATE, reduce_op=ReduceOp.NONE, length=len(body),
                            kv_id=(cfg.tag_base + head) % (1 << TAG_BITS)), body
    if kind == 4:               # a query whose length disagrees with its header
        body = payload + bytes(4 * rng.randrange(1, 4))
        return meta.replace(op=Op.QUERY, length=len(body)), body
    if kind == 5:               # a query header naming no head
        body = bytes(8) + payload[8:]
        return meta.replace(op=Op.QUERY), body
    if kind == 6:               # a query beyond Q_HEADS
        count = rng.randrange(1, 3)
        head0 = rng.randrange(cfg.q_heads - count + 1, 1 << QUERY_HEADER["head0"].shape.width)
        return query_packet(rng, cfg, head_dim, k, meta.seq, head0, count)
    count = next((c for c in range(1, cfg.q_heads + 1)          # longer than a QBUF slot
                  if query_bytes(c, head_dim) > cfg.q_slot), None)
    if count is None or query_bytes(count, head_dim) > MAX_PAYLOAD:
        return meta.replace(op=Op.FETCH_REQUEST), payload       # (geometry without one)
    return query_packet(rng, cfg, head_dim, k, meta.seq, 0, count)


class TB(LanderTB):
    def __init__(self, dut, rng, idle=0.0, pause=0.0):
        super().__init__(dut, rng, bus="bus", size=MEM, fill=FILL, fields=DECODE_LAND_STATUS,
                         idle=idle, pause=pause)

    async def reset(self, t: Traffic):
        await self.release(t.cfg)
        await RisingEdge(self.dut.clk)


def _regions(t: Traffic) -> list[tuple[int, int]]:
    q = t.cfg.q_slot * 2 * t.cfg.q_heads
    o = obuf_row_bytes(t.head_dim) * 2 * t.cfg.q_heads
    mb = mbuf_bytes(t.cfg.q_heads)
    return [(t.cfg.qbuf_base - 256, q + 512), (t.cfg.obuf_base - 256, o + 512),
            (t.cfg.mbuf_base - 256, mb + 512)]


def maxima_drops(t: Traffic) -> dict[DecodeLandResult, int]:
    """Dropped maxima (``Op.REDUCTION``) packets of the traffic by cause."""
    out: dict[DecodeLandResult, int] = {}
    for meta, payload in t.packets:
        if meta.op == Op.REDUCTION:
            result, addr = decode_land_decision(t.cfg, meta, payload, t.head_dim)
            if addr is None:
                out[result] = out.get(result, 0) + 1
    return out


def _check(tb: TB, t: Traffic, model: DecodeLandModel) -> None:
    """QBUF, OBUF, MBUF and 256 bytes either side: bytes equal to the model's (or the
    fill)."""
    skip = {a for meta, pl in t.packets if t.write_error(meta, pl) for a in t.span(meta, pl)}
    for start, size in _regions(t):
        got = tb.ram.read(start, size)
        bad = [start + i for i in range(size)
               if start + i not in skip and got[i] != model.mem.get(start + i, FILL)]
        assert not bad, f"{len(bad)} DDR bytes differ, first at {bad[0]:#x}"
    written = set(model.mem) | skip
    inside = {a for s, n in _regions(t) for a in range(s, s + n)}
    assert written <= inside, "the model wrote outside the checked regions"


@cocotb.test()
async def random_mix(dut):
    """Random queries, final states, maxima and malformed packets, idle input, AXI pauses: DDR
    bytes, counters."""
    p = bench_params()
    skip_unless_selected("random_mix", p)
    seed = p.get("seed", 1)
    rng = random.Random(seed)
    t = make_traffic(seed, p.get("n", 300), head_dim=p.get("head_dim", HEAD_DIM))
    tb = TB(dut, rng, p.get("idle", 0.3), p.get("pause", 0.3))
    assert t.beat_bytes == len(dut.bus_wdata) // 8
    tb.bad_write.update(t.bad_addrs)
    await tb.reset(t)
    model = t.model()
    for meta, payload in t.packets:
        await tb.src.send(tb.frame(meta, payload))
    beats = sum(max(1, payload_beats(len(pl), 64)) for _, pl in t.packets)
    await tb.drain(model.status, 20 * beats + 20_000)
    st = model.status
    assert st["write_errors"] >= 2 and st["queries_landed"] > 0 and st["results_landed"] > 0
    assert st["maxes_landed"] > 0
    assert min(st[k] for k in ("drop_op", "drop_reduce_op", "drop_length", "drop_slot")) > 0
    drops = maxima_drops(t)
    assert min(drops.get(r, 0) for r in (DecodeLandResult.DROP_REDUCE_OP,
                                         DecodeLandResult.DROP_LENGTH,
                                         DecodeLandResult.DROP_SLOT)) > 0
    _check(tb, t, model)


@cocotb.test()
async def rate(dut):
    """Full input rate, no pauses: input beats per cycle for back-to-back final states,
    queries, both, and all three kinds with maxima (reported, not asserted)."""
    p = bench_params()
    skip_unless_selected("rate", p)
    rng = random.Random(p.get("seed", 1))
    tb = TB(dut, rng)
    results = []
    for mix in p.get("rate_mixes", ["states", "queries", "mixed", "with_maxima"]):
        seed = p.get("seed", 1) + len(results)
        t = make_traffic(seed, p.get("rate_n", 100), head_dim=p.get("head_dim", HEAD_DIM),
                         bad_fraction=0.0, bad_write=False,
                         max_payload=p.get("rate_max_payload", MAX_PAYLOAD),
                         max_fraction=0.25 if mix == "with_maxima" else 0.0)
        kinds = {"states": (Op.PARTIAL_STATE,), "queries": (Op.QUERY,),
                 "mixed": (Op.QUERY, Op.PARTIAL_STATE),
                 "with_maxima": (Op.QUERY, Op.PARTIAL_STATE, Op.REDUCTION)}[mix]
        t.packets = [pk for pk in t.packets if pk[0].op in kinds]
        await tb.reset(t)
        model = t.model()
        beats, cycles = await tb.timed_run(t.packets, model.status)
        _check(tb, t, model)
        results.append({"mix": mix, **tb.rate_record(t.packets, "input_beats", beats, cycles)})
        dut._log.info("decode landing rate: %s", results[-1])
    if p.get("out"):
        with open(p["out"], "w") as fh:
            json.dump(results, fh)
