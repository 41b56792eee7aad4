"""NIC benchmarks (paper §3.2, §5): sustained rates of the router (multicast, 1- and 2-beat
packets) and its hop latency, the reduction engine's elements/cycle/lane, the link framer's
efficiency and the all-to-all engine's scatter and gather rates (cycles from amaranth.sim), and a
yosys resource estimate per engine and for the whole NIC block (``mcf_nic``: 3 links, engines,
AXI-Lite registers) with its K26 LUT share (no fmax: no open UltraScale+ timing).

Every figure is computed from a run whose outputs were all checked bit-exact against the golden
models of :mod:`mcf.golden.nic` (every copy on every router output, every reduction result, every
link frame, every all-to-all part and gathered tensor), and whose status counters equal the
models'. A run with a mismatch, a stall, or any drop / reject / watchdog counter above zero (the
bench plans none) raises :class:`~mcf.sim.perf.BenchRefused`. The per-engine functions take
the configuration as parameters (route entry, contributor count ``k``, ``reduce_op``,
all-to-all ``num_nodes``, ...), so a misconfigured run is expressible — and refused.

    mcf bench nic [--small] [--no-synth] [--json]
"""

from __future__ import annotations

import random

from amaranth.sim import Simulator

from mcf.abi.framing import MAX_PAYLOAD
from mcf.abi.meta import Collective, Meta, Op, ReduceOp
from mcf.abi.nic import Topology, reduce_config
from mcf.abi.route import route_entry
from mcf.golden.nic import (
    A2AModel,
    Packet,
    ReduceModel,
    RouterModel,
    link_frame,
    parsed_beats,
)
from mcf.hdl.nic.all_to_all import AllToAll
from mcf.hdl.nic.link import LinkRx, LinkTx
from mcf.hdl.nic.reduce import ReduceEngine
from mcf.hdl.nic.router import Router
from mcf.sim.amsim import pack_fields, unpack_fields, write_table
from mcf.sim.perf import BenchRefused, refuse_unplanned, resource_table

__all__ = ["collect", "render", "router_rate", "reduce_rate", "link_rate", "a2a_rate"]

DW = 64
BPB = DW // 8
LOCAL_ID = 1


# --- one harness for every engine -------------------------------------------------------------

def _run(dut, feeds, outs, *, setup=None, limit: int = 200_000, quiet: int = 32) -> dict:
    """Simulate ``dut``: every ``(stream, beats)`` of ``feeds`` offered back to back (valid held
    high), every stream of ``outs`` (name → stream) always ready. Stops ``quiet`` cycles after
    the last transfer once every feed is sent. Returns the accept cycles per feed, the beats
    (with their cycle) per output and the raw status word; a run longer than ``limit`` cycles
    is a stall."""
    rec = {"in": [[] for _ in feeds], "out": {n: [] for n in outs}, "stalled": False}
    in_lay = [s.payload.shape() for s, _ in feeds]
    out_lay = {n: s.payload.shape() for n, s in outs.items()}
    names = list(outs)
    sampled = [s.ready for s, _ in feeds]
    for n in names:
        sampled += [outs[n].valid, outs[n].payload.as_value()]

    async def tb(ctx):
        if setup is not None:
            await setup(ctx)
        for s in outs.values():
            ctx.set(s.ready, 1)
        pos = [0] * len(feeds)
        cycle = idle = 0
        while True:
            for j, (s, beats) in enumerate(feeds):
                if pos[j] < len(beats):
                    ctx.set(s.payload.as_value(), pack_fields(in_lay[j], beats[pos[j]]))
                ctx.set(s.valid, pos[j] < len(beats))
            vals = (await ctx.tick().sample(*sampled))[2:]
            moved = False
            for j, (_, beats) in enumerate(feeds):
                if pos[j] < len(beats) and vals[j]:
                    rec["in"][j].append(cycle)
                    pos[j] += 1
                    moved = True
            base = len(feeds)
            for k, n in enumerate(names):
                if vals[base + 2 * k]:
                    rec["out"][n].append((cycle, unpack_fields(out_lay[n], vals[base + 2 * k + 1])))
                    moved = True
            cycle += 1
            sent = all(p == len(b) for p, (_, b) in zip(pos, feeds))
            idle = 0 if moved or not sent else idle + 1
            if idle >= quiet:
                break
            if cycle > limit:
                rec["stalled"] = True
                break
        for s, _ in feeds:
            ctx.set(s.valid, 0)
        rec["status"] = int(ctx.get(dut.status.as_value()))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return rec


def _status(rec, layout) -> dict[str, int]:
    return unpack_fields(layout, rec["status"])


def _check(what: str, rec, layout, model_counters: dict, expected: dict) -> None:
    """Refuse on a stall, an unplanned drop/reject/trip, a golden mismatch or a counter that
    differs from the model's. ``expected``: output name → list of beats (dicts)."""
    if rec["stalled"]:
        raise BenchRefused(f"{what}: stalled")
    status = _status(rec, layout)
    refuse_unplanned(what, {k: v for k, v in status.items()
                            if k.startswith("drop_") or k in ("watchdog_trips", "scatter_drops")})
    for name, want in expected.items():
        got = [b for _, b in rec["out"][name]]
        if got != want:
            raise BenchRefused(f"{what}: output {name} differs from the golden model "
                               f"({len(got)} beats, expected {len(want)})")
    for name, beats in rec["out"].items():
        if name not in expected and beats:
            raise BenchRefused(f"{what}: unexpected beats on {name}")
    bad = {k: (status[k], v) for k, v in model_counters.items() if status[k] != v}
    if bad:
        raise BenchRefused(f"{what}: counters differ from the golden model (hw, model): {bad}")


def _rate(cycles: list[int]) -> float:
    """Transfers per cycle over the window from the first to the last transfer."""
    if not cycles:
        raise BenchRefused("no transfer to measure")
    return len(cycles) / (cycles[-1] - cycles[0] + 1)


def _beats(pkts) -> list[dict]:
    return [b for p in pkts for b in parsed_beats(p.meta, p.payload, DW)]


# --- engines ----------------------------------------------------------------------------------

def router_rate(n_beats: int = 2, n_packets: int = 120, *, n_ports: int = 4,
                route: int | None = None, max_payload: int = MAX_PAYLOAD,
                length: int | None = None, packet_slots: int = 4, seed: int = 1) -> dict:
    """Local input → multicast (default: all 4 ports + local, ``route``), every output ready.
    Rate: copies' beats on output 0 per cycle; hop latency: the first packet, idle router."""
    route = route_entry({0, 1, 2, 3}, local=True) if route is None else route
    length = n_beats * BPB if length is None else length
    dut = Router(data_width=DW, n_ports=n_ports, topology=Topology.MESH, max_payload=max_payload,
                 packet_slots=packet_slots)
    model = RouterModel(n_ports, max_payload)
    model.write_route(1, route)
    rng = random.Random(seed)
    expected = {p: [] for p in range(n_ports)} | {"local": []}
    feed = []
    for n in range(n_packets):
        pkt = Packet(Meta(route_id=1, kv_id=n, seq=n & 0xFF, length=length),
                     rng.randbytes(length))
        dest = model.route(pkt.meta)
        feed += parsed_beats(pkt.meta, pkt.payload, DW)
        for d in ([] if isinstance(dest, str) else dest):
            expected[d] += parsed_beats(pkt.meta, pkt.payload, DW)
    outs = {("local" if o == n_ports else o): s for o, s in enumerate(dut.outputs())}

    async def setup(ctx):
        await write_table(ctx, dut.route_wr, {1: route})

    rec = _run(dut, [(dut.inputs()[n_ports], feed)], outs, setup=setup)
    _check(f"router ({n_beats}-beat packets)", rec, dut.status.shape(), model.counters,
           expected)
    o0 = [c for c, _ in rec["out"][0]]
    return {"beats_per_cycle": round(_rate(o0), 3),
            "hop_latency_cycles": o0[0] - rec["in"][0][0], "packet_slots": dut.packet_slots}


def _reduce_payload(rng: random.Random, op: ReduceOp, length: int) -> bytes:
    words = length // 4
    if op == ReduceOp.SOFTMAX_MERGE:
        vals = [rng.randrange(-2000, 2000), rng.randrange(1 << 16, 1 << 20)]
        vals += [rng.randrange(-(1 << 20), 1 << 20) for _ in range(words - 2)]
    else:
        vals = [rng.randrange(-(1 << 31), 1 << 31) for _ in range(words)]
    return b"".join((v & 0xFFFFFFFF).to_bytes(4, "little") for v in vals)


def reduce_rate(n_beats: int = 2, n_packets: int = 120, *, k: int = 2,
                reduce_op: ReduceOp = ReduceOp.SOFTMAX_MERGE, contributors: int = 2,
                n_slots: int = 4, seed: int = 1) -> dict:
    """Back-to-back contributions of ``n_beats`` beats: groups of 4 tags, each receiving
    ``contributors`` contributions interleaved with the other tags'; the route's configured
    contributor count is ``k``; output always ready. Rate: accepted beats per cycle (= elements
    per cycle per lane)."""
    dut = ReduceEngine(data_width=DW, n_slots=n_slots)
    model = ReduceModel(n_slots, dut.max_payload, local_id=LOCAL_ID)
    model.write_config(0, reduce_config(k))
    rng = random.Random(seed)
    length = n_beats * BPB
    feed, results = [], []
    groups = max(1, n_packets // (4 * contributors))
    for g in range(groups):
        for _ in range(contributors):
            for t in range(4):
                meta = Meta(op=Op.PARTIAL_STATE, collective=Collective.ALL_REDUCE,
                            reduce_op=reduce_op, kv_id=4 * g + t, length=length)
                payload = _reduce_payload(rng, reduce_op, length)
                feed += parsed_beats(meta, payload, DW)
                out = model.contribute(meta, payload)
                if isinstance(out, Packet):
                    results.append(out)

    async def setup(ctx):
        ctx.set(dut.local_id, LOCAL_ID)
        await write_table(ctx, dut.cfg_wr, {0: reduce_config(k)})

    rec = _run(dut, [(dut.i, feed)], {"o": dut.o}, setup=setup)
    what = f"reduction ({reduce_op.name}, k={k})"
    _check(what, rec, dut.status.shape(), model.counters, {"o": _beats(results)})
    if len(results) != 4 * groups:
        raise BenchRefused(f"{what}: {len(results)} results for {4 * groups} tags")
    return {"elements_per_cycle_per_lane": round(_rate(rec["in"][0]), 3), "lanes": DW // 32}


def link_rate(n_beats: int = 8, n_packets: int = 30, *, seed: int = 1) -> dict:
    """LinkTx framing back-to-back packets; output always ready. Every frame is compared with
    :func:`mcf.golden.nic.link_frame` (header, Meta, payload, CRC-32)."""
    dut = LinkTx(data_width=DW)
    rng = random.Random(seed)
    length = n_beats * BPB
    pkts = [Packet(Meta(kv_id=n, length=length), rng.randbytes(length))
            for n in range(n_packets)]
    frames = [link_frame(p, n, DW) for n, p in enumerate(pkts)]
    expected = []
    for fr in frames:
        for j, (data, keep) in enumerate(fr):
            nbytes = bin(keep).count("1")
            expected.append({"data": int.from_bytes(data[:nbytes], "little"), "keep": keep,
                             "last": int(j == len(fr) - 1)})
    rec = _run(dut, [(dut.i, _beats(pkts))], {"o": dut.o})
    # compare the bytes under keep (the rest of a beat is not part of the frame)
    for _, b in rec["out"]["o"]:
        b["data"] &= (1 << (8 * bin(b["keep"]).count("1"))) - 1
    counters = {"frames": n_packets, "beats": len(expected)}
    _check("link tx", rec, dut.status.shape(), counters, {"o": expected})
    outs = [c for c, _ in rec["out"]["o"]]
    window = outs[-1] - outs[0] + 1           # first header beat to last CRC beat
    return {"wire_beats_per_cycle": round(len(outs) / window, 3),
            "payload_beats_per_cycle": round(n_packets * n_beats / window, 3)}


def a2a_rate(n: int = 4, part_beats: int = 4, n_ops: int = 20, *, num_nodes: int | None = None,
             max_nodes: int = 8, n_slots: int = 2, seed: int = 1) -> dict:
    """Scatter ``n_ops`` tensors of ``n`` parts, then gather ``n_ops`` tags of ``n`` parts
    (each tag's parts in a random source order); the engine is told ``num_nodes`` (default
    ``n``); outputs always ready. Rates: scatter = accepted beats per cycle; gather = the lower
    of the accepted and the emitted beats per cycle, each over its first-to-last window (the
    steady state); ``gather_run_beats_per_cycle`` also counts the fill and the last gather's
    emission after the input ended."""
    num_nodes = n if num_nodes is None else num_nodes
    plen = part_beats * BPB
    rng = random.Random(seed)

    def engine():
        dut = AllToAll(data_width=DW, max_nodes=max_nodes, n_slots=n_slots)
        model = A2AModel(DW, max_nodes, dut.part_max, n_slots, num_nodes, local_id=LOCAL_ID)

        async def setup(ctx):
            ctx.set(dut.num_nodes, num_nodes)
            ctx.set(dut.local_id, LOCAL_ID)
            await ctx.tick()
        return dut, model, setup

    what = f"all-to-all (n={n}, num_nodes={num_nodes})"
    dut, model, setup = engine()
    feed, parts = [], []
    for t in range(n_ops):
        meta = Meta(collective=Collective.ALL_TO_ALL, kv_id=t, route_id=8, length=n * plen)
        payload = rng.randbytes(n * plen)
        feed += parsed_beats(meta, payload, DW)
        out = model.scatter(meta, payload)
        parts += [] if isinstance(out, str) else out
    rec = _run(dut, [(dut.scatter, feed)], {"net": dut.net, "o": dut.o}, setup=setup)
    _check(f"{what} scatter", rec, dut.status.shape(), model.counters, {"net": _beats(parts)})
    scatter = _rate(rec["in"][0])

    dut, model, setup = engine()
    feed, tensors = [], []
    for t in range(n_ops):
        for s in rng.sample(range(n), n):
            meta = Meta(collective=Collective.ALL_TO_ALL, kv_id=t, src=s, dst=LOCAL_ID,
                        route_id=8 + LOCAL_ID, seq=LOCAL_ID, length=plen)
            payload = rng.randbytes(plen)
            feed += parsed_beats(meta, payload, DW)
            out = model.part(meta, payload)
            if isinstance(out, Packet):
                tensors.append(out)
    rec = _run(dut, [(dut.i, feed)], {"net": dut.net, "o": dut.o}, setup=setup)
    _check(f"{what} gather", rec, dut.status.shape(), model.counters, {"o": _beats(tensors)})
    if len(tensors) != n_ops:
        raise BenchRefused(f"{what}: {len(tensors)} gathered tensors for {n_ops} tags")
    g_in = _rate(rec["in"][0])
    outs = [c for c, _ in rec["out"]["o"]]
    g_out = _rate(outs)
    # the whole run, first part beat in to last tensor beat out: adds the fill and the tail
    # (the last gather is emitted after its last part arrived)
    g_run = len(outs) / (outs[-1] - rec["in"][0][0] + 1)
    return {"scatter_beats_per_cycle": round(scatter, 3),
            "gather_beats_per_cycle": round(min(g_in, g_out), 3),
            "gather_in_beats_per_cycle": round(g_in, 3),
            "gather_out_beats_per_cycle": round(g_out, 3),
            "gather_run_beats_per_cycle": round(g_run, 3)}


# --- the bench --------------------------------------------------------------------------------

def _resource_tops() -> dict:
    from mcf.hdl.tops import TOPS
    return {
        "router_4port": Router(data_width=DW, n_ports=4),
        "reduction_4slot": ReduceEngine(data_width=DW, n_slots=4),
        "all_to_all": AllToAll(data_width=DW, max_nodes=8, n_slots=2),
        "link_tx": LinkTx(data_width=DW),
        "link_rx": LinkRx(data_width=DW),
        "nic_block": TOPS["mcf_nic"](),     # 3 links + engines + AXI-Lite registers
    }


def collect(small: bool = False, synth: bool = True) -> dict:
    """Every engine's figures (see the module docstring); ``resources`` unless ``synth`` is
    False. ``small``: fewer packets (CI)."""
    n = 40 if small else 120
    mc2 = router_rate(n_beats=2, n_packets=n)
    mc1 = router_rate(n_beats=1, n_packets=n)
    red = reduce_rate(n_packets=n)
    link = link_rate(n_packets=10 if small else 30)
    a2a = a2a_rate(n_ops=8 if small else 20)
    result = {
        "max_payload": MAX_PAYLOAD,
        "multicast": {"beats_per_cycle": mc2["beats_per_cycle"],
                      "beats_per_cycle_1beat": mc1["beats_per_cycle"],
                      "packet_slots": mc2["packet_slots"],
                      "hop_latency_cycles": mc2["hop_latency_cycles"]},
        "all_to_all": {"beats_per_cycle": min(a2a["scatter_beats_per_cycle"],
                                              a2a["gather_beats_per_cycle"]), **a2a},
        "reduction": red,
        "link": link,
    }
    if synth:
        from mcf.sim.synth import resources
        result["resources"] = {name: resources(top, f"bench_{name}")
                               for name, top in _resource_tops().items()}
    return result


def render(result: dict) -> str:
    mc, red, link, a2a = (result[k] for k in ("multicast", "reduction", "link", "all_to_all"))
    rows = [
        ("router (multicast 4+local)", "output beats/cycle, 2-beat pkts", mc["beats_per_cycle"]),
        ("router (multicast 4+local)", "output beats/cycle, 1-beat pkts",
         mc["beats_per_cycle_1beat"]),
        ("router", "hop latency (cycles)", mc["hop_latency_cycles"]),
        ("reduction (softmax merge)", "elements/cycle/lane", red["elements_per_cycle_per_lane"]),
        ("link tx", "payload beats/cycle, 8-beat pkts", link["payload_beats_per_cycle"]),
        ("all-to-all (N=4, 4-beat)", "scatter beats/cycle", a2a["scatter_beats_per_cycle"]),
        ("all-to-all", "gather beats/cycle (min of in, out)", a2a["gather_beats_per_cycle"]),
    ]
    lines = [f"{'engine':<28}{'figure':<36}{'value':>10}"]
    lines += [f"{e:<28}{f:<36}{v:>10}" for e, f, v in rows]
    if result.get("resources"):
        lines += ["", *resource_table(result["resources"], "resources")]
    return "\n".join(lines)
