"""amaranth.sim stream helpers shared by the unit tests (no cocotb): a source that sends words
on an ``amaranth.lib.stream`` interface with random idle cycles, the rule every producer in the
tests follows (fixed seeds; ``rng`` is a ``random.Random`` or a numpy ``Generator``)."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["send"]


async def send(ctx, stream, words: Iterable[int], rng, idle: float = 0.0) -> None:
    """Send ``words`` (payload bits) on ``stream`` in order, each held until taken; before each
    word ``valid`` drops for a cycle with probability ``idle`` (again and again); ``valid`` is
    low after the last word."""
    for bits in words:
        while idle and rng.random() < idle:
            ctx.set(stream.valid, 0)
            await ctx.tick()
        ctx.set(stream.payload.as_value(), bits)
        ctx.set(stream.valid, 1)
        await ctx.tick().until(stream.ready)
    ctx.set(stream.valid, 0)
