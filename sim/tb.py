"""Helpers the cocotb benches share with the tests and benchmarks outside ``sim/benches``
(no cocotb import here; ``sim/benches`` holds the cocotb benches only, the amaranth.sim ones are
in :mod:`mcf.sim.amsim`):

* **pause patterns** — idle cycles on cocotbext-axi sources and backpressure on sinks, from
  fixed seeds. A pattern is a repeating random bit sequence (1 = pause this cycle) with the
  given pause probability; its period is prime so that patterns of different streams drift
  against each other (:func:`bernoulli`: no period, each cycle drawn as it comes). Probabilities
  are a number, or a ``(low, high)`` range drawn from once per stream.
* **CSR test maps** — the register maps the CSR bank's bench, tests and benchmark elaborate:
  ``kinds`` exercises every access kind, fields straddling byte lanes, non-zero reset values and
  registers mixing kinds; ``node`` is the real node map from :func:`mcf.abi.csrmap.node_regmap`.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator

from mcf.abi.csrmap import node_regmap
from mcf.abi.regs import Access, Field, Register, RegisterMap

__all__ = ["pattern", "bernoulli", "set_pauses", "kinds_regmap", "MAPS"]

PERIOD = 101


def pattern(p: float, rng: random.Random, period: int = PERIOD) -> Iterator[int]:
    """An endless pause pattern pausing with probability ``p``."""
    return itertools.cycle([int(rng.random() < p) for _ in range(period)])


def bernoulli(p: float, rng: random.Random) -> Iterator[bool]:
    """An endless pause pattern without a period: each cycle pauses with probability ``p``,
    drawn from ``rng`` as it is consumed."""
    while True:
        yield rng.random() < p


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


KINDS_MAP_VERSION = 0x0001


def kinds_regmap() -> RegisterMap:
    regs = RegisterMap("csr_kinds", KINDS_MAP_VERSION)
    regs.add(Register("CTRL", (
        Field("enable", 1, Access.RW, 1),
        Field("mode", 3, Access.RW, 5),
        Field("limit", 12, Access.RW, 0xABC),   # bits 15:4, straddles lanes 0 and 1
        Field("shift", 9, Access.RW, 0x101),    # bits 24:16, straddles lanes 2 and 3
    ), "RW fields across byte lanes"))
    regs.add(Register.single("SCRATCH", 32, Access.RW, 0x1234_5678))
    regs.add(Register("CMD", (
        Field("go", 1, Access.W),
        Field("arg", 15, Access.W, 0x11),
        Field("tag", 8, Access.W),
    ), "write-only fields with strobes"))
    regs.add(Register("STATUS", (
        Field("busy", 1, Access.R),
        Field("level", 10, Access.R),
        Field("err", 5, Access.RW1C),
        Field("flags", 16, Access.RW1C, 0x8001),
    ), "hardware status and sticky flags"))
    regs.add(Register.single("IRQ", 32, Access.RW1C))
    regs.add(Register("MIX", (
        Field("hw", 4, Access.R),
        Field("cfg", 8, Access.RW, 0x5A),
        Field("kick", 4, Access.W),
        Field("evt", 8, Access.RW1C),
        Field("top", 7, Access.RW, 0x40),
    ), "every kind in one word"))
    regs.add(Register.single("COUNT", 32, Access.R))
    return regs


MAPS = {"kinds": kinds_regmap, "node": node_regmap}
