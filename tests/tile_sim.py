"""amaranth.sim pieces of the tiled-prefill units' tests (tests/test_tile_*.py): a source that
feeds a stream with random idle cycles, a sink that takes a unit's output beats under random
backpressure while watching one stream in front of or inside the unit (fixed seeds: numpy
``Generator``s), and the merged rows read back from the merge's output beats."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mcf.sim.amsim import send


def feeder(port, beats, seed: int, idle: float):
    """A testbench sending ``beats`` on ``port``, an idle cycle before a beat with probability
    ``idle`` (drawn from ``default_rng(seed)``)."""
    async def feed(ctx):
        await send(ctx, port, beats, np.random.default_rng(seed), idle)
    return feed


@dataclass
class Taken:
    """What a :func:`taking_sink` saw: ``bits`` the output beats taken (raw), ``out`` the cycles
    they were taken, ``take`` the cycles a beat passed on the watched stream and ``wait`` the
    count of cycles one waited there (valid without ready); ``probes`` the values of the
    signals asked for, read after the last beat and the quiet cycles."""
    bits: list[int] = field(default_factory=list)
    out: list[int] = field(default_factory=list)
    take: list[int] = field(default_factory=list)
    wait: int = 0
    probes: list[int] = field(default_factory=list)


def taking_sink(out, tap, n: int, rng, stall: float, *, quiet: int = 0, probes=()):
    """A testbench taking ``n`` beats from the stream ``out`` — its ``ready`` low with
    probability ``stall`` each cycle (drawn from ``rng``) — while watching the stream ``tap``;
    then ``quiet`` more cycles in which ``out`` must not be valid, and the signals ``probes``
    read. Returns the testbench and the :class:`Taken` it fills."""
    seen = Taken()

    async def sink(ctx):
        cyc = 0
        while len(seen.bits) < n:
            ctx.set(out.ready, int(not stall or rng.random() >= stall))
            _, _, tv, tr, ov, ordy, op = await ctx.tick().sample(
                tap.valid, tap.ready, out.valid, out.ready, out.payload.as_value())
            if tv and tr:
                seen.take.append(cyc)
            elif tv:
                seen.wait += 1
            if ov and ordy:
                seen.bits.append(int(op))
                seen.out.append(cyc)
            cyc += 1
        for _ in range(quiet):
            await ctx.tick()
            assert not ctx.get(out.valid)
        seen.probes.extend(ctx.get(p) for p in probes)

    return sink, seen


def beats_per_row(olay, d: int) -> int:
    """Beats of a ``d``-channel row in the merge-output beat layout ``olay``
    (:func:`mcf.abi.attn_tile.merge_beat_layout`)."""
    return d // olay["state"].shape["o"].shape.length


def beat_rows(bits, olay, d: int) -> list:
    """The merged states ``(row, m, l, o)`` of the merge-output beats ``bits`` (layout
    ``olay``): a row's :func:`beats_per_row` beats in channel order, ``last`` on the final one,
    the row, ``m`` and ``l`` the same on each."""
    nb = beats_per_row(olay, d)
    beats = [olay.from_bits(raw) for raw in bits]
    assert len(beats) % nb == 0
    got = []
    for n in range(0, len(beats), nb):
        part = beats[n:n + nb]
        assert [int(b.last) for b in part] == [0] * (nb - 1) + [1]
        head = (int(part[0].row), int(part[0].state.m), int(part[0].state.l))
        assert {(int(b.row), int(b.state.m), int(b.state.l)) for b in part} == {head}
        got.append((*head, np.array([int(v) for b in part for v in b.state.o])))
    return got


def merged_rows(bits, finals, olay, d: int, tile_rows: int) -> list:
    """:func:`beat_rows` as ``(chunk row, m, l, o)``: row ``n`` is chunk row ``finals[n]``,
    whose place in its ``tile_rows``-row tile must be the beats' ``row``."""
    got = beat_rows(bits, olay, d)
    assert len(got) == len(finals)
    for x, (r, *_) in zip(finals, got):
        assert x % tile_rows == r
    return [(x, *rest) for x, (_, *rest) in zip(finals, got)]
