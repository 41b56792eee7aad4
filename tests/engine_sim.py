"""amaranth.sim pieces the compute-engine tests share (tests/test_gemm_engine.py,
tests/test_vector_unit.py, tests/test_tp_node_ops.py): a blob cut into beats, the output sink
that ends by reading the status counters and a whole GEMM engine run."""

from __future__ import annotations

import numpy as np
from amaranth.hdl import Value
from amaranth.sim import Simulator

from mcf.abi.compute import GEMM_STATUS


def beats(blob: bytes, nbytes: int) -> list[int]:
    """``blob`` as little-endian ``nbytes``-byte beats."""
    assert len(blob) % nbytes == 0
    return [int.from_bytes(blob[i:i + nbytes], "little") for i in range(0, len(blob), nbytes)]


def data_last(p) -> tuple[int, int]:
    """A ``beat_layout`` payload as ``(data, last)``."""
    return int(p.data), int(p.last)


def sink(dut, out: list, count: int, rng, stall: bool, status: dict, layout, *, tail: int,
         beat=int):
    """A testbench taking ``count`` beats of ``dut.o`` into ``out`` (``beat(payload)`` each;
    with ``stall``, ``ready`` with probability 0.6 from ``rng``), then after ``tail`` cycles
    ``dut.status`` into ``status`` (the fields of ``layout``)."""
    async def tb(ctx):
        while len(out) < count:
            ctx.set(dut.o.ready, 1 if not stall else int(rng.random() < 0.6))
            _, _, v, r, p = await ctx.tick().sample(dut.o.valid, dut.o.ready, dut.o.payload)
            if v and r:
                out.append(beat(p))
        await ctx.tick().repeat(tail)
        got = ctx.get(dut.status)
        status.update({n: int(got[n]) for n, _ in layout})
    return tb


def run_gemm_engine(dut, jobs: list[int], xb: list[int], wb: list[int], n_out: list[int], *,
             cycles: int, seed: int = 0, stall: bool = False):
    """Run a :class:`~mcf.hdl.compute.gemm.GemmEngine` ``dut`` for ``cycles`` cycles: the packed
    ``jobs`` onto ``job``, the beats ``xb`` onto ``x_in`` and ``wb`` onto ``w_in`` (each from
    cycle 2; with ``stall``, an idle cycle after a transfer with probability 0.2 and ``o``
    ready with probability 0.6, from ``np.random.default_rng(seed)``); ``sum(n_out)`` output
    beats expected. Returns the output as signed 32-bit words (int64) and the status counters
    (read 8 cycles after the last beat)."""
    bb = dut.beat // 8
    out, status = [], {}
    rng = np.random.default_rng(seed)
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    def feeder(port, items):
        async def tb(ctx):
            await ctx.tick().repeat(2)
            for it in items:
                ctx.set(Value.cast(port.payload), it)
                ctx.set(port.valid, 1)
                await ctx.tick().until(port.ready)
                ctx.set(port.valid, 0)
                if stall and rng.random() < 0.2:
                    await ctx.tick()
        return tb

    sim.add_testbench(feeder(dut.job, jobs))
    sim.add_testbench(feeder(dut.x_in, xb))
    sim.add_testbench(feeder(dut.w_in, wb))
    sim.add_testbench(sink(dut, out, sum(n_out), rng, stall, status, GEMM_STATUS, tail=8))
    sim.run_until(1e-8 * cycles)
    assert len(out) == sum(n_out), f"got {len(out)} of {sum(n_out)} beats"
    raw = b"".join(v.to_bytes(bb, "little") for v in out)
    return np.frombuffer(raw, dtype="<i4").astype(np.int64), status
