"""amaranth.sim driver of an attention engine's streams (paper §5): the jobs of
:mod:`mcf.sim.attention_jobs` onto ``job``, ``q``, ``k``, ``v`` (and ``kh``), the
output taken from ``o`` and cut into words, the status counters read at the end. Any component
with :class:`~mcf.hdl.compute.attention.AttentionEngine`'s streams runs on it — the vector
engine and :class:`~mcf.hdl.compute.array_engine.ArrayEngine` alike; shared by the unit tests
(``tests/test_attention_hdl.py``, ``tests/test_array_engine.py``) and the engine-on-the-arrays
bench (:mod:`mcf.sim.perf.attention_arrays`). The expected words come from the golden model
(:func:`~mcf.sim.attention_jobs.expected_words`), never from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from amaranth.sim import Simulator

from mcf.sim.attention_jobs import (
    expected_ends,
    job_k_words,
    job_v_words,
    job_word,
    q_words,
    words_from_beats,
)

__all__ = ["EngineRun", "drive_engine", "STATUS_FIELDS"]

STATUS_FIELDS = ("jobs", "blocks", "err_rows", "err_max", "err_job", "busy")
"""The engine's status counters read after the run (:func:`mcf.abi.kv.attn_status_layout`)."""


@dataclass
class EngineRun:
    """One run of :func:`drive_engine`."""
    words: list[int]              # the output's 32-bit words, in order
    ends: list[int]               # word counts at each payload's ``last`` beat
    end_cycles: list[int]         # the cycle (1 = the first clock edge) of each ``last`` beat
    status: dict[str, int] = field(default_factory=dict)   # STATUS_FIELDS after the run
    timed_out: bool = False       # max_cycles passed before every expected payload ended


def drive_engine(dut, jobs, *, max_heads: int, lanes: int, data_width: int, idle: float = 0.0,
                 backpressure: float = 0.0, seed: int = 0, k_override=None, v_override=None,
                 kh_words=None, max_cycles: int = 200000,
                 n_outputs: int | None = None) -> EngineRun:
    """Run ``jobs`` through ``dut`` in amaranth.sim (clock 100 MHz).

    The four input streams (five with ``kh_words``: ``dut.kh``'s beats) are fed by their own
    testbenches, each word held until taken; with ``idle``, ``valid`` drops for a cycle before
    a word with that probability (again and again). ``o.ready`` is low with probability
    ``backpressure`` per cycle (one ``np.random.default_rng(seed)`` for both). ``k_override`` /
    ``v_override`` replace the jobs' K / V beats. The run ends when ``n_outputs`` payloads
    (default: the jobs' :func:`expected_ends`) have ended or after ``max_cycles`` cycles; four
    cycles later the status counters are read. ``max_heads`` and ``lanes`` are the engine's
    (the job word's and the query / KV beats' layouts), ``data_width`` its output's."""
    rng = np.random.default_rng(seed)
    beats: list[tuple[int, int, int]] = []
    end_cycles: list[int] = []
    n_expected = (sum(len(expected_ends(j)) for j in jobs) if n_outputs is None
                  else n_outputs)
    status: dict[str, int] = {}

    async def send(ctx, s, words):
        for w in words:
            while idle and rng.random() < idle:
                await ctx.tick()
            ctx.set(s.valid, 1)
            ctx.set(s.payload.as_value(), w)
            await ctx.tick().until(s.ready)
            ctx.set(s.valid, 0)

    def feeder(s, words):
        async def tb(ctx):
            await send(ctx, s, words)
        return tb

    k = k_override if k_override is not None else [w for j in jobs
                                                   for w in job_k_words(j, lanes)]
    v = v_override if v_override is not None else [w for j in jobs
                                                   for w in job_v_words(j, lanes)]
    feeds = [(dut.job, [job_word(j, max_heads) for j in jobs]),
             (dut.q, [w for j in jobs for w in q_words(j, lanes)]), (dut.k, k), (dut.v, v)]
    if kh_words is not None:
        feeds.append((dut.kh, kh_words))

    async def tb_out(ctx):
        for n in range(max_cycles):
            ready = not (backpressure and rng.random() < backpressure)
            ctx.set(dut.o.ready, int(ready))
            data, keep, last, valid = (await ctx.tick().sample(
                dut.o.payload.data, dut.o.payload.keep, dut.o.payload.last, dut.o.valid))[2:]
            if valid and ready:
                beats.append((data, keep, last))
                if last:
                    end_cycles.append(n + 1)
                    if len(end_cycles) == n_expected:
                        break
        for _ in range(4):
            await ctx.tick()
        for name in STATUS_FIELDS:
            status[name] = ctx.get(getattr(dut.status, name))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for s, words in feeds:
        sim.add_testbench(feeder(s, words), background=True)
    sim.add_testbench(tb_out)
    sim.run()
    words, ends = words_from_beats(beats, data_width)
    return EngineRun(words, ends, end_cycles, status, len(end_cycles) < n_expected)
