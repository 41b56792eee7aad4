"""amaranth.sim stream helpers shared by the unit tests (no cocotb): a source that sends words
on an ``amaranth.lib.stream`` interface with random idle cycles, the rule every producer in the
tests follows (fixed seeds; ``rng`` is a ``random.Random`` or a numpy ``Generator``), and a
packet as the parsers hand it on (:func:`mcf.abi.framing.parsed_layout` beats)."""

from __future__ import annotations

from collections.abc import Iterable

from mcf.abi.framing import parsed_layout
from mcf.abi.meta import Meta

__all__ = ["send", "parsed_beats"]


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


def parsed_beats(meta: Meta, payload: bytes, data_width: int = 64) -> list[int]:
    """A packet on a parser's output stream: one :func:`~mcf.abi.framing.parsed_layout` beat
    per ``data_width`` bits of payload, ``meta`` on every beat, ``keep`` per byte, ``last`` on
    the final one; a header-only packet is one empty beat."""
    lay, nb = parsed_layout(data_width), data_width // 8

    def beat(**fields: int) -> int:
        return sum(v << lay[n].offset for n, v in fields.items())

    raw = meta.pack()
    if not payload:
        return [beat(meta=raw, data=0, keep=0, last=1)]
    return [beat(meta=raw, data=int.from_bytes(payload[k:k + nb], "little"),
                 keep=(1 << len(payload[k:k + nb])) - 1, last=int(k + nb >= len(payload)))
            for k in range(0, len(payload), nb)]
