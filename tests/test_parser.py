# amaranth: UnusedElaboratable=no
"""Parser unit tests (amaranth.sim): every drop cause, exact counters, dispatch to every port,
rollback (no leak, buffer space reused), random mixes under idle × backpressure, all against
the golden model :mod:`mcf.golden.packet`."""

import random

import pytest

from mcf.abi import (
    DISPATCH_RULES,
    META,
    Collective,
    Meta,
    Op,
    Port,
    ReduceOp,
    parsed_layout,
    payload_beats,
)
from mcf.abi.csrmap import PARSER_STATUS, DropCause
from mcf.golden.packet import (
    ParserModel,
    WireBeat,
    classify,
    malformed_packet,
    packet_beats,
    random_good_packet,
    with_field,
)
from mcf.hdl.packet.parser import Parser, port_member_name
from mcf.sim.amsim import expected_parsed, run_parser

LOCAL_ID, NUM_NODES = 3, 6
MAX_PAYLOAD = 96


def _check(width, beats, *, idle=0.0, backpressure=0.0, seed=0, max_payload=MAX_PAYLOAD,
           buffer_depth=None, meta_layout=META, out_register=False):
    model = ParserModel(width, max_payload=max_payload, local_id=LOCAL_ID,
                        num_nodes=NUM_NODES, meta_layout=meta_layout)
    model.feed(beats)
    layout = parsed_layout(width, meta_layout)
    expected = expected_parsed(model, layout)
    dut = Parser(width, meta_layout, max_payload=max_payload, buffer_depth=buffer_depth,
                 out_register=out_register)
    got, status, stalls = run_parser(dut, beats, local_id=LOCAL_ID, num_nodes=NUM_NODES,
                                     expected_beats=sum(map(len, expected.values())),
                                     idle=idle, backpressure=backpressure, seed=seed)
    for port in Port:
        assert got[port] == expected[port], port
    assert status == model.counters
    return model, status, stalls


def test_output_names_follow_port_enum():
    dut = Parser(64, max_payload=MAX_PAYLOAD)
    names = {n for n in dut.signature.members if n.startswith("o_")}
    assert names == {f"o_{p.name.lower()}" for p in Port}
    assert all(dut.output(p) is getattr(dut, port_member_name(p)) for p in Port)
    assert len(dut.local_id) == META["dst"].width and len(dut.num_nodes) == len(dut.local_id) + 1


@pytest.mark.parametrize("width", (64, 128))
@pytest.mark.parametrize("cause", list(DropCause))
def test_each_drop_cause(width, cause):
    """A bad packet between two good ones: counted once under its cause, nothing of it leaks,
    and the good packet right behind it is delivered."""
    rng = random.Random(width + cause.value)
    bpb = width // 8
    good = [random_good_packet(rng, width, max_len=3 * bpb, num_nodes=NUM_NODES,
                               length=rng.randrange(1, 3 * bpb + 1)) for _ in range(2)]
    beats = packet_beats(*good[0], width)
    for _ in range(4):
        beats += malformed_packet(rng, cause, width, max_payload=MAX_PAYLOAD,
                                  num_nodes=NUM_NODES, max_len=3 * bpb)
    beats += packet_beats(*good[1], width)
    _, status, _ = _check(width, beats, seed=cause.value)
    for c in DropCause:
        assert status[f"drop_{c.name.lower()}"] == (4 if c == cause else 0)
    assert status["rx_packets"] == 6
    assert sum(v for k, v in status.items() if k.startswith("tx_")) == 2


@pytest.mark.parametrize("width", (64, 128))
def test_drop_cause_examples(width):
    """Hand-built packets for the exact boundaries of each rule."""
    bpb = width // 8
    full = (1 << bpb) - 1
    ok = Meta(op=Op.QUERY, dst=NUM_NODES - 1, length=2 * bpb + 1)
    base = packet_beats(ok, bytes(ok.length), width)
    raw = base[0].data
    cases = {
        "good": (base, None),
        "op7": ([base[0]._replace(data=with_field(raw, "op", 7))] + base[1:],
                DropCause.UNKNOWN_OP),
        "dst=num_nodes": ([base[0]._replace(data=with_field(raw, "dst", NUM_NODES))] + base[1:],
                          DropCause.BAD_DST),
        "length=max+1": ([base[0]._replace(data=with_field(raw, "length", MAX_PAYLOAD + 1))]
                         + base[1:], DropCause.OVERSIZE),
        "length=max": (packet_beats(ok.replace(length=MAX_PAYLOAD), bytes(MAX_PAYLOAD), width),
                       None),
        "header only": ([base[0]._replace(last=True)], DropCause.TRUNCATED),
        "one beat short": (base[:-2] + [base[-2]._replace(last=True)], DropCause.TRUNCATED),
        "extra beat": (base[:-1] + [base[-1]._replace(last=False),
                                    WireBeat(0, full, True)], DropCause.BAD_LENGTH),
        "final keep wide": (base[:-1] + [base[-1]._replace(keep=0b11)], DropCause.BAD_LENGTH),
        "middle keep": ([base[0], base[1]._replace(keep=full >> 1)] + base[2:],
                        DropCause.BAD_LENGTH),
        "header keep": ([base[0]._replace(keep=full >> 1)] + base[1:], DropCause.BAD_LENGTH),
        "zero-length with payload": (
            [WireBeat(with_field(raw, "length", 0), full, False), WireBeat(1, 1, True)],
            DropCause.BAD_LENGTH),
        # several causes: the first in DropCause order wins, counted once
        "op7 + truncated": ([base[0]._replace(data=with_field(raw, "op", 7), last=True)],
                            DropCause.UNKNOWN_OP),
        "dst + bad keep": ([base[0]._replace(data=with_field(raw, "dst", 31))] + base[1:-1]
                           + [base[-1]._replace(keep=full)], DropCause.BAD_DST),
        "truncated + middle keep": ([base[0], base[1]._replace(keep=1, last=True)],
                                    DropCause.TRUNCATED),
    }
    beats = []
    for name, (pkt, cause) in cases.items():
        assert classify(pkt, width, max_payload=MAX_PAYLOAD, num_nodes=NUM_NODES) == cause, name
        beats += pkt
    _, status, _ = _check(width, beats)
    expected = {c: sum(1 for _, k in cases.values() if k == c) for c in DropCause}
    for c, n in expected.items():
        assert status[f"drop_{c.name.lower()}"] == n, c
    assert status["rx_packets"] == len(cases)


@pytest.mark.parametrize("width", (64, 128))
def test_dispatch_every_port(width):
    rng = random.Random(width)
    bpb = width // 8
    beats = []
    for port in Port:
        for n in range(3):
            meta, payload = random_good_packet(rng, width, max_len=2 * bpb, num_nodes=NUM_NODES,
                                               port=port, local_id=LOCAL_ID, length=n * bpb // 2)
            beats += packet_beats(meta, payload, width)
    model, status, _ = _check(width, beats)
    for port in Port:
        assert status[f"tx_{port.name.lower()}"] == 3
        assert len(model.outputs[port]) == 3


def test_dispatch_rule_order():
    """Rules that overlap resolve in DISPATCH_RULES order (CONTROL before REDUCTION before
    ALL_TO_ALL before LOCAL)."""
    width = 64
    metas = {
        Port.CONTROL: Meta(op=Op.CONTROL, collective=Collective.ALL_REDUCE,
                           reduce_op=ReduceOp.MAX, dst=LOCAL_ID),
        Port.REDUCTION: Meta(op=Op.PARTIAL_STATE, collective=Collective.ALL_TO_ALL,
                             reduce_op=ReduceOp.SUM, dst=LOCAL_ID),
        Port.ALL_TO_ALL: Meta(op=Op.KV_REPLICA, collective=Collective.ALL_TO_ALL,
                              dst=LOCAL_ID),
        Port.LOCAL: Meta(op=Op.KV_REPLICA, collective=Collective.P2P, dst=LOCAL_ID),
        Port.FORWARD: Meta(op=Op.KV_REPLICA, collective=Collective.P2P, dst=LOCAL_ID - 1),
    }
    assert {r.port for r in DISPATCH_RULES} == set(Port)
    beats = [b for m in metas.values() for b in packet_beats(m, b"", width)]
    model, status, _ = _check(width, beats)
    for port, meta in metas.items():
        assert model.outputs[port][0][0].meta == meta.pack()
        assert status[f"tx_{port.name.lower()}"] == 1


@pytest.mark.parametrize("width", (64, 128))
def test_rollback_reuses_space_and_never_leaks(width):
    """Buffer exactly one maximum packet deep: long bad packets are written speculatively and
    rolled back over and over; no output ever fires for them, and good packets still fit."""
    bpb = width // 8
    max_payload = 8 * bpb
    rng = random.Random(11)
    bad = []
    for i in range(6):
        meta, payload = random_good_packet(rng, width, max_len=max_payload, num_nodes=NUM_NODES,
                                           length=max_payload - i)
        pkt = packet_beats(meta, payload, width)
        if i % 2:
            pkt = pkt[:-1]
            pkt[-1] = pkt[-1]._replace(last=True)          # truncated, after 7 stored beats
        else:
            pkt[-1] = pkt[-1]._replace(keep=pkt[-1].keep >> 1 or 0b10)   # bad final keep
        bad += pkt
    # phase 1: only bad packets — no output valid may ever be seen
    dut = Parser(width, max_payload=max_payload, buffer_depth=payload_beats(max_payload, width))
    got, status, _ = run_parser(dut, bad, local_id=LOCAL_ID, num_nodes=NUM_NODES,
                                expected_beats=0, extra_cycles=40)
    assert all(not items for items in got.values())
    assert status["drop_truncated"] == 3 and status["drop_bad_length"] == 3
    # phase 2: interleaved with maximum-size good packets, with backpressure
    beats = []
    for _ in range(6):
        meta, payload = random_good_packet(rng, width, max_len=max_payload, num_nodes=NUM_NODES,
                                           length=max_payload)
        beats += packet_beats(meta, payload, width)
        beats += malformed_packet(rng, DropCause.TRUNCATED, width, max_payload=max_payload,
                                  num_nodes=NUM_NODES, max_len=max_payload)
    _check(width, beats, backpressure=0.5, seed=4, max_payload=max_payload,
           buffer_depth=payload_beats(max_payload, width))


@pytest.mark.parametrize("out_register", (False, True))
@pytest.mark.parametrize("width", (64, 128))
@pytest.mark.parametrize("idle,backpressure", [(0.0, 0.0), (0.3, 0.0), (0.0, 0.6), (0.3, 0.6)])
def test_random_mix(width, idle, backpressure, out_register):
    """Good and bad packets to every port, idle input cycles × output backpressure, with the
    default ready slice and with ``out_register`` (the node top's parsers)."""
    rng = random.Random(width * 3 + int(idle * 10) + int(backpressure * 10))
    bpb = width // 8
    beats = []
    for _ in range(60):
        if rng.random() < 0.35:
            beats += malformed_packet(rng, rng.choice(list(DropCause)), width,
                                      max_payload=MAX_PAYLOAD, num_nodes=NUM_NODES,
                                      max_len=4 * bpb)
        else:
            port = rng.choice(list(Port))
            meta, payload = random_good_packet(rng, width, max_len=min(4 * bpb, MAX_PAYLOAD),
                                               num_nodes=NUM_NODES, port=port,
                                               local_id=LOCAL_ID)
            beats += packet_beats(meta, payload, width)
    _check(width, beats, idle=idle, backpressure=backpressure, seed=rng.randrange(1000),
           out_register=out_register)


def test_input_not_stalled_by_drops():
    """Dropped packets are consumed at one beat per cycle: with the outputs ready, ``i_packet``
    never refuses a beat, whatever the mix of bad and good packets."""
    width = 64
    rng = random.Random(2)
    beats = []
    for cause in DropCause:
        beats += malformed_packet(rng, cause, width, max_payload=MAX_PAYLOAD,
                                  num_nodes=NUM_NODES, max_len=MAX_PAYLOAD)
    meta, payload = random_good_packet(rng, width, max_len=16, num_nodes=NUM_NODES, length=16)
    beats += packet_beats(meta, payload, width)
    _, status, stalls = _check(width, beats)
    assert status["rx_packets"] == len(DropCause) + 1
    assert stalls == 0


def test_status_layout_is_the_abi_one():
    dut = Parser(64, max_payload=MAX_PAYLOAD)
    assert dut.status.shape() == PARSER_STATUS


def test_rejects_buffer_smaller_than_a_packet():
    with pytest.raises(ValueError):
        Parser(64, max_payload=64, buffer_depth=7)
    with pytest.raises(ValueError):
        Parser(64, max_payload=1 << META["length"].width)


@pytest.mark.parametrize("depth", (5, 8))
def test_packet_buffer_commit_rollback(depth):
    """PacketBuffer alone, random writes / commits / rollbacks / read backpressure against a
    reference queue: only committed words come out, in order, each exactly once; a word written
    in the commit (rollback) cycle is kept (discarded); ``w_ready`` tracks the free space."""
    from amaranth.sim import Simulator

    from mcf.hdl.packet.packet_buffer import PacketBuffer

    dut = PacketBuffer(16, depth)
    rng = random.Random(depth)
    committed_ref: list[int] = []
    out: list[int] = []
    state = {"done": False}

    async def writer(ctx):
        spec: list[int] = []
        word = 1
        for _ in range(600):
            w_en = rng.random() < 0.7
            action = rng.choice(["none"] * 4 + ["commit", "rollback"])
            ready = ctx.get(dut.w_ready)
            assert ready == (ctx.get(dut.level) < depth)
            ctx.set(dut.w_en, w_en)
            ctx.set(dut.w_data, word)
            ctx.set(dut.commit, action == "commit")
            ctx.set(dut.rollback, action == "rollback")
            await ctx.tick()
            if w_en and ready:
                spec.append(word)
                word += 1
            if action == "commit":
                committed_ref.extend(spec)
                spec = []
            elif action == "rollback":
                spec = []
        ctx.set(dut.w_en, 0)
        ctx.set(dut.commit, 0)
        ctx.set(dut.rollback, 0)
        state["done"] = True

    async def reader(ctx):
        held = None
        while True:
            ready = rng.random() < 0.6
            ctx.set(dut.r_stream.ready, ready)
            *_, valid, payload = await ctx.tick().sample(dut.r_stream.valid,
                                                         dut.r_stream.payload)
            if valid and held is not None:
                assert payload == held          # stable under backpressure
            held = None if (not valid or ready) else payload
            if valid and ready:
                out.append(payload)

    async def main(ctx):
        while not state["done"]:
            await ctx.tick()
        await ctx.tick().repeat(8 * depth + 20)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(writer)
    sim.add_testbench(reader, background=True)
    sim.add_testbench(main)
    sim.run()
    assert len(committed_ref) > 50
    assert out == committed_ref
