# amaranth: UnusedElaboratable=no
"""LinkMap crossbar (hdl/node/link_map.py, docs/node.md §9): amaranth.sim for every
permutation of the three links and for maps that share or name no link, random frames on
every TX port and RX link with idle cycles and backpressure; scoreboards per path against
mcf.abi.link_map.link_map_routes and the drain counters."""

from __future__ import annotations

import itertools
import random

import pytest
from amaranth.sim import Simulator

from mcf.abi.csrmap import NODE_LINKS
from mcf.abi.framing import beat_layout, parsed_layout
from mcf.abi.link_map import LINK_MAP_STATUS, link_map_routes, link_map_value
from mcf.hdl.node.link_map import LinkMap

DW = 64
N = NODE_LINKS
TX, RX = 0, 1       # source kinds in the frame tag


def frames(rng, kind, src, n_frames, max_beats=5):
    out = []
    for f in range(n_frames):
        nb = rng.randint(1, max_beats)
        out.append([{"data": (kind << 60) | (src << 52) | (f << 16) | b,
                     "keep": 0xFF if b < nb - 1 else rng.randrange(1, 256),
                     "last": int(b == nb - 1)} for b in range(nb)])
    return out


def run(links, *, seed, idle=0.3, ready=0.6, n_frames=15, layout=None):
    layout = layout or beat_layout(DW)
    dut = LinkMap(N, layout)
    rng = random.Random(seed)
    tx = [frames(rng, TX, p, n_frames) for p in range(N)]
    rx = [frames(rng, RX, ln, n_frames) for ln in range(N)]
    outs = {f"link_tx{ln}": [] for ln in range(N)} | {f"mac_rx{p}": [] for p in range(N)}
    status = {}
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    def producer(port, fr, s):
        async def proc(ctx):
            prng = random.Random(s)
            for frame in fr:
                for beat in frame:
                    while prng.random() < idle:
                        ctx.set(port.valid, 0)
                        await ctx.tick()
                    ctx.set(port.payload.as_value(),
                            sum(beat.get(f, 0) << fld.offset for f, fld in layout))
                    ctx.set(port.valid, 1)
                    await ctx.tick().until(port.ready)
            ctx.set(port.valid, 0)
            done.append(1)
        return proc

    def consumer(port, out, s):
        async def proc(ctx):
            crng = random.Random(s)
            while True:
                r = int(crng.random() < ready)
                ctx.set(port.ready, r)
                _, _, valid, raw = await ctx.tick().sample(port.valid, port.payload.as_value())
                if valid and r:
                    out.append({f: (raw >> fld.offset) & ((1 << fld.width) - 1)
                                for f, fld in layout})
        return proc

    done = []

    async def tb(ctx):
        ctx.set(dut.map.as_value(), link_map_value(links))
        while len(done) < 2 * N:
            await ctx.tick()
        for _ in range(20):
            await ctx.tick()
        raw = ctx.get(dut.status.as_value())
        status.update({n: (raw >> f.offset) & ((1 << f.width) - 1) for n, f in LINK_MAP_STATUS})

    for p in range(N):
        sim.add_testbench(producer(getattr(dut, f"mac_tx{p}"), tx[p], seed * 50 + p),
                          background=True)
        sim.add_process(consumer(getattr(dut, f"mac_rx{p}"), outs[f"mac_rx{p}"],
                                 seed * 50 + 10 + p))
    for ln in range(N):
        sim.add_testbench(producer(getattr(dut, f"link_rx{ln}"), rx[ln], seed * 50 + 20 + ln),
                          background=True)
        sim.add_process(consumer(getattr(dut, f"link_tx{ln}"), outs[f"link_tx{ln}"],
                                 seed * 50 + 30 + ln))
    sim.add_testbench(tb)
    sim.run()
    return tx, rx, outs, status


def flat(fr):
    return [b for frame in fr for b in frame]


def check(links, seed, **kw):
    tx, rx, outs, status = run(links, seed=seed, **kw)
    link_of_port, port_of_link = link_map_routes(links, N)
    for ln in range(N):
        p = port_of_link[ln]
        assert outs[f"link_tx{ln}"] == (flat(tx[p]) if p is not None else []), (links, ln)
    for p in range(N):
        ln = link_of_port[p]
        assert outs[f"mac_rx{p}"] == (flat(rx[ln]) if ln is not None else []), (links, p)
    assert status == {
        "tx_unmapped": sum(len(tx[p]) for p in range(N) if link_of_port[p] is None),
        "rx_unmapped": sum(len(rx[ln]) for ln in range(N) if port_of_link[ln] is None)}
    return status


@pytest.mark.parametrize("links", list(itertools.permutations(range(N))))
def test_every_permutation(links):
    status = check(links, seed=sum(v * 3 ** i for i, v in enumerate(links)))
    assert status == {"rx_unmapped": 0, "tx_unmapped": 0}


@pytest.mark.parametrize("links", [(0, 0, 1), (2, 1, 2), (1, 1, 1), (3, 0, 1), (3, 3, 3)])
def test_shared_or_missing_links_drain_and_count(links):
    """Lowest port wins a shared link; the losing port's TX and every unowned link's RX are
    drained (never stall) and counted."""
    status = check(links, seed=7 + links[0] + 4 * links[1] + 16 * links[2])
    assert status["tx_unmapped"] > 0 and status["rx_unmapped"] > 0


def test_parsed_layout_no_pauses():
    """Any layout with ``last`` (here the parsed beat, meta 0), no idle, no backpressure."""
    tx, rx, outs, status = run((2, 0, 1), seed=99, idle=0.0, ready=1.01,
                               layout=parsed_layout(DW))
    assert [{k: v for k, v in b.items() if k != "meta"} for b in outs["link_tx2"]] \
        == flat(tx[0])
    assert [{k: v for k, v in b.items() if k != "meta"} for b in outs["mac_rx0"]] \
        == flat(rx[2])
    assert status == {"rx_unmapped": 0, "tx_unmapped": 0}


def test_rejects_bad_parameters():
    with pytest.raises(ValueError):
        LinkMap(4)
    with pytest.raises(ValueError):
        LinkMap(2, parsed_layout(DW).members["meta"])
