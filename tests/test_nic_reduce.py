"""Reduction engine tests: amaranth.sim against mcf.golden.nic.ReduceModel (bit-exact, random
arrival order, interleaved tags, malformed contributions, watchdog), and a float64 check that
merged softmax states equal attention over the concatenated keys."""

from __future__ import annotations

import random

import numpy as np
from amaranth.sim import Simulator

from mcf.abi.csrmap import DropCause
from mcf.abi.meta import Collective, Port, ReduceOp, dispatch_port
from mcf.abi.nic import REDUCE_STATUS, REDUCE_TAG, reduce_config
from mcf.abi.softmax import SCORE, STATE_L, STATE_O, pack_state, unpack_state
from mcf.golden.nic import ReduceModel, beats_to_packet, parsed_beats, softmax_payload_merge
from mcf.golden.packet import packet_beats
from mcf.hdl.nic.reduce import ReduceEngine
from mcf.hdl.packet.parser import Parser
from mcf.sim.amsim import drive, run_parser, split_packets, unpack_fields, write_table
from mcf.sim.benches.nic_reduce import HeldReduceModel, replay, trip_key
from mcf.sim.benches.nic_traffic import K_OF_ROUTE, contribution, make_stream

DW = 64
async def configure(ctx, dut, configs=None):
    """Write ``configs`` (route id → entry; default: k of every route of K_OF_ROUTE) through
    the engine's configuration port."""
    configs = configs or {rid: reduce_config(k) for rid, k in K_OF_ROUTE.items()}
    await write_table(ctx, dut.cfg_wr, configs)


def run_engine(contribs, *, n_slots=4, timeout=3000, ready=0.7, idle=0.2, seed=1,
               tail_cycles=0, max_payload=128, configs=None, block=0):
    """Run ``contribs`` through the engine with random idle input and output backpressure;
    the expected results come from :class:`HeldReduceModel` replayed at the recorded head and
    result-end cycles (a result holds its slot until its last beat left). ``block``: cycles
    from the start during which ``o.ready`` is held low; every cycle ``i.ready`` was low is
    counted in ``status["i_stalls"]``."""
    dut = ReduceEngine(data_width=DW, n_slots=n_slots, max_payload=max_payload)
    model = HeldReduceModel(n_slots, max_payload, local_id=3)
    configs = configs or {rid: reduce_config(k) for rid, k in K_OF_ROUTE.items()}
    for rid, entry in configs.items():
        model.write_config(rid, entry)
    got = []
    status = {}
    heads, ends, trips = [], [], []
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(sink_process(dut.o, got, random.Random(seed), ready, block))
    sim.add_process(handshake_log(dut, heads, ends, trips, status))

    async def tb(ctx):
        ctx.set(dut.local_id, 3)
        ctx.set(dut.timeout, timeout)
        await configure(ctx, dut, configs)
        beats = [b for meta, p in contribs for b in parsed_beats(meta, p, DW)]
        await drive(ctx, dut.i, beats, random.Random(seed + 1), idle)
        quiet = 0
        while quiet < 50:          # until the output has been idle for 50 cycles
            _, _, valid = await ctx.tick().sample(dut.o.valid)
            quiet = 0 if valid else quiet + 1
        for _ in range(tail_cycles):
            await ctx.tick()
        status.update(unpack_fields(REDUCE_STATUS, ctx.get(dut.status.as_value())))

    status["i_stalls"] = 0
    sim.add_testbench(tb)
    sim.run()
    expected = replay(model, contribs, heads, ends, trips)
    return dut, model, expected, got, status


def sink_process(stream, out, rng, ready, block=0):
    """Collect beats from ``stream``: ``ready`` low for ``block`` cycles, then random."""
    layout = stream.payload.shape()

    async def proc(ctx):
        cycle = 0
        while True:
            r = 0 if cycle < block else int(ready >= 1.0 or rng.random() < ready)
            ctx.set(stream.ready, r)
            _, _, valid, raw = await ctx.tick().sample(stream.valid, stream.payload.as_value())
            cycle += 1
            if valid and r:
                out.append(unpack_fields(layout, raw))
    return proc


def handshake_log(dut, heads, ends, trips, status):
    """A process recording the cycles of input heads, output last beats and watchdog trips
    (``(cycle, key)``; the counter changes one edge after the trip), and counting the cycles
    in which ``i.ready`` was low (``status["i_stalls"]``)."""
    async def proc(ctx):
        cycle, in_pkt, n_trips = 0, False, 0
        async for _, _, iv, ir, il, ov, o_r, ol, n, tag in ctx.tick().sample(
                dut.i.valid, dut.i.ready, dut.i.payload.last,
                dut.o.valid, dut.o.ready, dut.o.payload.last,
                dut.status.watchdog_trips, dut.status.last_trip.as_value()):
            cycle += 1
            status["i_stalls"] = status.get("i_stalls", 0) + (not ir)
            if iv and ir:
                if not in_pkt:
                    heads.append(cycle)
                in_pkt = not il
            if ov and o_r and ol:
                ends.append(cycle)
            if n != n_trips:
                assert n == n_trips + 1, "two trips in one cycle"
                n_trips = n
                trips.append((cycle - 1, trip_key(tag)))
    return proc


def counters_only(d):
    return {k: v for k, v in d.items() if k not in ("last_trip", "i_stalls")}


def test_reduce_random_interleaved_bit_exact():
    # two slots more than open tags: results held by backpressure rarely take the last slot
    contribs = make_stream(seed=7, n_tags=100, window=4)
    dut, model, expected, got, status = run_engine(contribs, n_slots=6)
    results = [beats_to_packet(b, DW) for b in split_packets(got)]
    assert results == expected
    assert len(expected) > 80
    assert counters_only(status) == counters_only(model.counters)
    assert status["watchdog_trips"] == 0
    assert sum(status[f"drop_{c}"] for c in ("bad_length", "bad_op", "no_config")) > 0


def test_reduce_full_rate_and_no_slot_drops():
    """Six tags open against four slots: later tags are dropped (NO_SLOT) and the stranded
    slots are freed by the watchdog; counters and results match the golden model."""
    contribs = make_stream(seed=11, n_tags=24, window=6, malformed=0.0)
    dut, model, expected, got, status = run_engine(contribs, timeout=400, ready=1.0, idle=0.0,
                                                   tail_cycles=600)
    results = [beats_to_packet(b, DW) for b in split_packets(got)]
    assert results == expected
    # the trips were replayed at their cycles: the model has no open slot left either
    assert model.expire_all() == 0
    assert status["drop_no_slot"] > 0 and status["watchdog_trips"] > 0
    assert counters_only(status) == counters_only(model.counters)


def test_reduce_watchdog_frees_slot_and_reports():
    """k = 3 but only two contributors arrive: after the timeout the slot is freed and the trip
    is counted with its tag; with the watchdog disabled the slot stays open and the golden
    model's arrival-order result comes out once a third contribution arrives."""
    rng = np.random.default_rng(3)
    tag = 77
    part = [contribution(rng, tag, 2, ReduceOp.SUM, 16, s) for s in range(3)]
    first = part[:2]
    dut, model, expected, got, status = run_engine(first, timeout=50, tail_cycles=200)
    assert got == [] and expected == []
    assert status["watchdog_trips"] == 1
    trip = REDUCE_TAG.from_bits(status["last_trip"])
    assert (int(trip.kv_id), int(trip.seq), int(trip.route_id)) == (tag, tag & 0xFF, 2)
    dut, model, expected, got, status = run_engine(first + part, timeout=0)
    # with the watchdog disabled, contributions 1, 2 and 1 again complete the tag (k = 3); the
    # remaining two open a new slot that stays open
    assert [beats_to_packet(b, DW) for b in split_packets(got)] == expected
    assert len(expected) == 1 and status["watchdog_trips"] == 0


def test_softmax_merge_matches_float_attention():
    """Merging per-shard fixed-point states reproduces attention over the concatenated keys:
    |o/l − softmax(s)·V| ≤ 2^-9 for values |v| < 1, scores within ±16 (log2 units), k ≤ 8."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(200):
        k = int(rng.integers(1, 9))
        n = int(rng.integers(1, 32))
        hd = 8
        scores = rng.uniform(-16, 16, (k, n))        # log2-domain scores t = q·k·scale·log2 e
        values = rng.uniform(-1, 1, (k, n, hd))
        states = []
        for j in range(k):
            t = SCORE.to_float(SCORE.quantize(scores[j]))
            m = t.max()
            w = np.exp2(t - m)
            states.append(pack_state(SCORE.quantize(m), STATE_L.quantize(w.sum()),
                                     STATE_O.quantize(w @ values[j])))
        acc = states[0]
        for s in states[1:]:
            acc = softmax_payload_merge(acc, s)
        m, l_sum, o = unpack_state(acc, hd)
        got = STATE_O.to_float(o) / STATE_L.to_float(l_sum)
        t_all = SCORE.to_float(SCORE.quantize(scores.ravel()))
        p = np.exp2(t_all - t_all.max())
        ref = (p / p.sum()) @ values.reshape(-1, hd)
        worst = max(worst, float(np.abs(got - ref).max()))
    assert worst <= 2.0 ** -9, worst


def _round_robin(rng, tags, k_route, ops, length):
    """Contributions of ``tags`` interleaved: every tag's first, then every tag's second..."""
    per_tag = [[contribution(rng, t, k_route, ops[j % len(ops)], length, s)
                for s in range(K_OF_ROUTE[k_route])] for j, t in enumerate(tags)]
    return [c for group in zip(*per_tag) for c in group]


def test_input_never_waits_on_output():
    """docs/node.md §6 rule 2: with ``o.ready`` low for 3,000 cycles the input keeps taking a
    beat every cycle. Three tags complete and their results wait in their slots while a fourth
    tag keeps merging; a contribution to a held tag and a fifth tag (every slot busy) are
    NO_SLOT drops. Then the output opens: nothing else is lost, the results are bit-exact and
    in completion order, and further tags reuse the freed slots."""
    rng = np.random.default_rng(21)
    k3 = next(r for r, k in K_OF_ROUTE.items() if k == 3)
    ops = [ReduceOp.SUM, ReduceOp.MAX, ReduceOp.SOFTMAX_MERGE]
    done = _round_robin(rng, [10, 11, 12], k3, ops, 40)
    other = _round_robin(rng, [13], k3, ops, 40)
    held_again = [contribution(rng, 11, k3, ReduceOp.MAX, 40, 7)]
    fifth = [contribution(rng, 14, k3, ReduceOp.SUM, 40, 0)]
    later = _round_robin(rng, [20, 21, 22, 23], k3, ops, 24)
    contribs = done + other[:2] + held_again + fifth + other[2:] + later
    # 'later' arrives while the output is still blocked: its tags find no slot until the
    # results leave, so feed it only after the block (second run below)
    dut, model, expected, got, status = run_engine(
        done + other[:2] + held_again + fifth + other[2:], n_slots=4, ready=0.6, idle=0.0,
        block=3000)
    results = [beats_to_packet(b, DW) for b in split_packets(got)]
    assert status["i_stalls"] == 0
    assert results == expected and len(expected) == 4
    assert [r.meta.kv_id for r in results] == [10, 11, 12, 13]
    assert status["drop_no_slot"] == 2 and status["tx_results"] == 4
    assert counters_only(status) == counters_only(model.counters)
    # blocked output with traffic that fits, then the output opens and more tags follow
    dut, model, expected, got, status = run_engine(contribs, n_slots=4, ready=0.5, idle=0.1,
                                                   block=600)
    results = [beats_to_packet(b, DW) for b in split_packets(got)]
    assert status["i_stalls"] == 0
    assert results == expected
    assert counters_only(status) == counters_only(model.counters)
    assert status["drop_no_slot"] >= 2


def test_held_result_is_not_freed_by_the_watchdog():
    """A complete result waiting for ``o.ready`` keeps its slot whatever the timeout (the
    watchdog guards open slots only); an open slot whose contributor never comes is freed
    meanwhile, since the input kept running."""
    k1 = next(r for r, k in K_OF_ROUTE.items() if k == 1)
    k2 = next(r for r, k in K_OF_ROUTE.items() if k == 2)
    rng = np.random.default_rng(5)
    lone = contribution(rng, 2, k1, ReduceOp.MAX, 16, 1)      # k = 1: a result at once
    stranded = contribution(rng, 1, k2, ReduceOp.SUM, 16, 0)  # its partner never arrives
    dut, model, expected, got, status = run_engine([lone, stranded], n_slots=2, timeout=40,
                                                   block=400)
    assert [beats_to_packet(b, DW) for b in split_packets(got)] == expected
    assert len(expected) == 1 and status["tx_results"] == 1 and status["i_stalls"] == 0
    assert status["watchdog_trips"] == 1
    trip = REDUCE_TAG.from_bits(status["last_trip"])
    assert int(trip.kv_id) == 1


def test_twelve_slots_in_flight():
    """The kr260 configuration (docs/node.md §7): 12 slots = H_q of Qwen2.5-1.5B. Twelve tags
    are open at once (contributions round robin), all complete, bit-exact, no drop; a 13th
    tag while all twelve are open is a NO_SLOT drop."""
    rng = np.random.default_rng(12)
    k2 = next(r for r, k in K_OF_ROUTE.items() if k == 2)
    ops = [ReduceOp.SUM, ReduceOp.MAX, ReduceOp.SOFTMAX_MERGE]
    rr = _round_robin(rng, list(range(100, 112)), k2, ops, 64)
    extra = contribution(rng, 112, k2, ReduceOp.SUM, 64, 0)
    contribs = rr[:12] + [extra] + rr[12:]
    dut, model, expected, got, status = run_engine(contribs, n_slots=12, max_payload=128,
                                                   ready=0.7, idle=0.1)
    assert dut.n_slots == 12
    results = [beats_to_packet(b, DW) for b in split_packets(got)]
    assert results == expected and len(expected) == 12
    assert status["drop_no_slot"] == 1 and status["tx_results"] == 12
    assert counters_only(status) == counters_only(model.counters)


def test_final_result_is_forwarded_not_reduced_again():
    """ABI rule (mcf.abi.nic.reduce_config_layout): with ``final`` set, the result leaves with
    reduce_op NONE, collective MULTICAST and the configured result route, so every parser
    forwards it (FORWARD port) and an engine handed it drops it as BAD_OP instead of merging
    it; a partial (``final`` clear) keeps its fields and is merged again by the next hop."""
    rng = np.random.default_rng(11)
    configs = {1: reduce_config(2, final=True, result_route=0xA5), 2: reduce_config(2)}
    first = []
    for tag, rid in ((1, 1), (2, 2), (3, 1)):
        op = ReduceOp(1 + tag % 3)
        first += [contribution(rng, tag, rid, op, 24, s) for s in range(2)]
    model = ReduceModel(4, 128, local_id=3)
    for rid, entry in configs.items():
        model.write_config(rid, entry)
    results = [r for meta, p in first if (r := model.contribute(meta, p)) is not None]
    assert len(results) == 3
    finals = [r for r in results if r.meta.route_id == 0xA5]
    partial = [r for r in results if r.meta.route_id == 2]
    assert len(finals) == 2 and len(partial) == 1
    for r in finals:
        assert r.meta.reduce_op == ReduceOp.NONE and r.meta.collective == Collective.MULTICAST
        assert r.meta.src == 3
        assert all(dispatch_port(r.meta, node) == Port.FORWARD for node in range(32))
    assert partial[0].meta.reduce_op != ReduceOp.NONE
    assert dispatch_port(partial[0].meta, 0) == Port.REDUCTION
    # the results re-injected into the engine: the finals are dropped whole (BAD_OP), never
    # merged; the partial opens a new reduction of its tag
    stream = first + [(r.meta, r.payload) for r in results]
    dut, model, expected, got, status = run_engine(stream, configs=configs, ready=0.8)
    assert [beats_to_packet(b, DW) for b in split_packets(got)] == expected == results
    assert counters_only(status) == counters_only(model.counters)
    assert status["drop_bad_op"] == 2
    assert status["tx_results"] == 3
    assert status["rx_packets"] == len(first) + 3
    # on the wire, the parser of any receiving node sends the finals to FORWARD (the router)
    # and the partial to REDUCTION
    wire = [b for r in results for b in packet_beats(r.meta, r.payload, DW)]
    parser = Parser(DW, max_payload=128)
    out, pstatus, _ = run_parser(parser, wire, local_id=0, num_nodes=8,
                                 expected_beats=sum(len(r.payload) // 8 for r in results))
    assert pstatus["tx_forward"] == 2 and pstatus["tx_reduction"] == 1
    assert sum(pstatus[f"drop_{c.name.lower()}"] for c in DropCause) == 0


def test_result_latency_and_back_to_back_results():
    """The docstring's figures: a result's first beat is on ``o`` 4 cycles after the k-th
    contribution's last beat was accepted; results complete together leave back to back."""
    k1 = next(r for r, k in K_OF_ROUTE.items() if k == 1)
    rng = np.random.default_rng(4)
    parts = [contribution(rng, 30 + j, k1, ReduceOp.SUM, 24, 0) for j in range(3)]
    dut = ReduceEngine(data_width=DW, n_slots=4, max_payload=64)
    rec = {"in_last": [], "o_valid": []}

    async def tb(ctx):
        await configure(ctx, dut)
        ctx.set(dut.o.ready, 1)
        beats = [b for meta, p in parts for b in parsed_beats(meta, p, DW)]
        await drive(ctx, dut.i, beats, random.Random(0))
        for _ in range(20):
            await ctx.tick()

    async def monitor(ctx):
        cycle = 0
        async for _, _, iv, il, ov in ctx.tick().sample(dut.i.valid, dut.i.payload.last,
                                                         dut.o.valid):
            if iv and il:
                rec["in_last"].append(cycle)
            if ov:
                rec["o_valid"].append(cycle)
            cycle += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(monitor)
    sim.add_testbench(tb)
    sim.run()
    assert rec["o_valid"][0] == rec["in_last"][0] + 4
    # 3 results x 3 beats, input back to back: the output never pauses once it started
    assert rec["o_valid"] == list(range(rec["o_valid"][0], rec["o_valid"][0] + 9))
