"""AXI4 slaves for ``amaranth.sim`` testbenches (the unit tests' DDR; the cocotb benches use
cocotbext-axi's ``AxiRam``, :mod:`mcf.sim.ddr`). One write slave and one read slave
instead of a copy per test file.

Both are plain async testbench functions for ``Simulator.add_process``; their random draws
come from the ``rng`` the caller passes, in a fixed order per cycle, so a test's seed fixes
their timing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from mcf.abi.axi import AxiResp

__all__ = ["write_slave", "read_slave"]


def write_slave(bus, rng, mem: dict, aws: list, bad_beats=(), wpause=0.0, b_latency=(1, 6),
                beat_bytes: int = 16):
    """A write slave: stores strobed bytes in ``mem`` (address → byte), records
    ``(address, beats)`` of each AW in ``aws``, W pauses with probability ``wpause``, B after
    ``b_latency`` cycles, SLVERR for a burst containing a beat in ``bad_beats``; asserts that
    ``wlast`` ends each burst."""

    async def slave(ctx):
        ctx.set(bus.awready, 1)
        bursts: deque = deque()      # (addr, beats)
        bq: deque = deque()          # (due cycle, resp)
        cycle = 0
        beat_i = 0
        err = False
        while True:
            ctx.set(bus.wready, int(rng.random() >= wpause))
            if bq and bq[0][0] <= cycle:
                ctx.set(bus.bvalid, 1)
                ctx.set(bus.bresp, bq[0][1])
            else:
                ctx.set(bus.bvalid, 0)
            (_, _, awv, awa, awl, wv, wr, wd, ws, wl, bv, br) = await ctx.tick().sample(
                bus.awvalid, bus.awaddr, bus.awlen, bus.wvalid, bus.wready, bus.wdata,
                bus.wstrb, bus.wlast, bus.bvalid, bus.bready)
            cycle += 1
            if awv:
                bursts.append((awa, awl + 1))
                aws.append((awa, awl + 1))
            if wv and wr:
                addr, n = bursts[0]
                a = addr + beat_bytes * beat_i
                if a in bad_beats:
                    err = True
                else:
                    for b in range(beat_bytes):
                        if ws >> b & 1:
                            mem[a + b] = (wd >> (8 * b)) & 0xFF
                beat_i += 1
                assert bool(wl) == (beat_i == n), "wlast misplaced"
                if wl:
                    bursts.popleft()
                    bq.append((cycle + rng.randint(*b_latency),
                               AxiResp.SLVERR.value if err else AxiResp.OKAY.value))
                    beat_i, err = 0, False
            if bv and br:
                bq.popleft()

    return slave


def read_slave(bus, rng, read: Callable[[int], bytes], *, latency=(2, 12), r_pause=0.0,
               is_error: Callable[[int], bool] = lambda addr: False,
               on_ar: Callable[[int, int], None] | None = None, beat_bytes: int = 16):
    """A read slave: ``arready`` high with probability 0.8, each burst's first R beat
    ``latency`` cycles after its AR, R pauses with probability ``r_pause``; beat data
    ``read(addr)`` (``beat_bytes`` bytes), SLVERR where ``is_error(addr)``; ``on_ar(addr,
    beats)`` sees every accepted AR (a test's burst checks)."""

    async def slave(ctx):
        ars: deque = deque()
        cur, beat, cycle = None, None, 0
        while True:
            ctx.set(bus.arready, rng.random() >= 0.2)
            if beat is None:
                if cur is None and ars and ars[0][0] <= cycle:
                    _, a, n = ars.popleft()
                    cur = [a, n]
                if cur is not None and rng.random() >= r_pause:
                    a = cur[0]
                    word = int.from_bytes(read(a), "little")
                    beat = (word, AxiResp.SLVERR.value if is_error(a) else AxiResp.OKAY.value,
                            cur[1] == 1)
                    cur = None if cur[1] == 1 else [a + beat_bytes, cur[1] - 1]
            if beat is not None:
                ctx.set(bus.rvalid, 1)
                ctx.set(bus.rdata, beat[0])
                ctx.set(bus.rresp, beat[1])
                ctx.set(bus.rlast, beat[2])
            else:
                ctx.set(bus.rvalid, 0)
            _, _, arv, arr, ara, arl, rready = await ctx.tick().sample(
                bus.arvalid, bus.arready, bus.araddr, bus.arlen, bus.rready)
            if arv and arr:
                if on_ar is not None:
                    on_ar(ara, arl + 1)
                ars.append((cycle + rng.randint(*latency), ara, arl + 1))
            if beat is not None and rready:
                beat = None
            cycle += 1

    return slave
