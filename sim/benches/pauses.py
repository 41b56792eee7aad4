"""Idle cycles on cocotbext-axi sources and backpressure on sinks, from fixed seeds.

A pause pattern is a repeating random bit sequence (1 = pause this cycle) with the given
pause probability; its period is prime so that patterns of different streams drift against
each other. Probabilities are given as a number, or as a ``(low, high)`` range drawn from
once per stream. No cocotb import: the patterns are plain iterators.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator

__all__ = ["pattern", "set_pauses"]

PERIOD = 101


def pattern(p: float, rng: random.Random, period: int = PERIOD) -> Iterator[int]:
    """An endless pause pattern pausing with probability ``p``."""
    return itertools.cycle([int(rng.random() < p) for _ in range(period)])


def _draw(spec, rng: random.Random) -> float:
    if isinstance(spec, tuple):
        low, high = spec
        return low + (high - low) * rng.random()
    return float(spec)


def set_pauses(rng: random.Random, sources: Iterable = (), sinks: Iterable = (), *,
               idle=0.3, backpressure=(0.2, 0.7)) -> None:
    """Give every source an idle pattern and every sink a backpressure pattern; ``None``
    (for ``idle`` or ``backpressure``) removes the patterns of that side instead."""
    for streams, spec in ((sources, idle), (sinks, backpressure)):
        for s in streams:
            s.set_pause_generator(None if spec is None else pattern(_draw(spec, rng), rng))
