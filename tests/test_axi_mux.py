"""HP-port AXI multiplexer (mcf.hdl.mem.axi_mux, docs/node.md §4): an amaranth.sim test of the
arbitration and routing against a cycle model of clients and an AXI slave that interleaves R
beats of different IDs and answers B out of order across IDs, with random valid/ready on every
channel; and the runners of the cocotb + Verilator bench (sim/benches/axi_mux.py: DmaReaders and
DmaWriters on one AxiRam).

Rate (reported by ``pytest tests/test_axi_mux.py -k rate -s``).
"""

from __future__ import annotations

import json
import random

import pytest
from amaranth.sim import Simulator

from mcf.hdl.mem.axi_mux import AxiPortMux

BB = 16


def _word(client: int, burst: int, beat: int) -> int:
    return (client << 100) | (burst << 50) | beat


def _offer(ctx, c, ch: str, bursts, k: int, rng, p: float) -> None:
    """Client ``c`` offers burst ``k`` of ``bursts`` ((addr, beats) pairs) on its ``ch`` channel
    (``"ar"`` or ``"aw"``, ID ``k & 1``): an offer is held while valid, a new one is raised with
    probability ``1 - p``; valid is low once no burst is left."""
    valid = getattr(c, ch + "valid")
    if k < len(bursts):
        addr, n = bursts[k]
        if ctx.get(valid) or rng.random() >= p:
            ctx.set(valid, 1)
            ctx.set(getattr(c, ch + "addr"), addr)
            ctx.set(getattr(c, ch + "len"), n - 1)
            ctx.set(getattr(c, ch + "id"), k & 1)
    else:
        ctx.set(valid, 0)


def simulate(n_clients, readers, writers, *, seed=1, p=0.3, interleave=True, w_depth=8,
             idle_clients=(), max_cycles=40_000):
    """``readers``/``writers``: client index → list of ``(addr, beats)`` bursts. Every random
    valid/ready is drawn with probability ``1 - p``. Returns a dict of observations."""
    dut = AxiPortMux(n_clients, w_depth=w_depth)
    rng = random.Random(seed)
    cl = [getattr(dut, f"s{i}") for i in range(n_clients)]
    port = dut.m
    obs = {"r": {i: [] for i in readers}, "b": {i: 0 for i in writers},
           "w_order": [], "aw": [], "ar": [], "cycles": 0, "r_beats": 0}

    def mem(addr):
        return (addr * 2654435761) & ((1 << 128) - 1)

    async def bench(ctx):
        ar_next = {i: 0 for i in readers}           # next burst to request
        aw_next = {i: 0 for i in writers}
        w_burst = {i: 0 for i in writers}           # burst / beat whose W beat is next
        w_beat = {i: 0 for i in writers}
        rd_active: list[list] = []                  # slave: [rid, addr, beats, sent]
        wr_aws: list[tuple[int, int]] = []          # slave: (awid, beats) in AW order
        w_got = 0
        wlasts = b_resolved = 0
        b_pending: list[int] = []                   # slave: bids to answer
        r_cur = None                                # the R beat held on the port
        b_cur = None
        total_r = sum(n for bl in readers.values() for _, n in bl)
        total_b = sum(len(bl) for bl in writers.values())
        got_b = 0
        cycle = 0
        for i in idle_clients:
            assert i not in readers and i not in writers
        while obs["r_beats"] < total_r or got_b < total_b:
            assert cycle < max_cycles, "hang"
            # --- clients drive
            for i, c in enumerate(cl):
                _offer(ctx, c, "ar", readers.get(i, ()), ar_next.get(i, 0), rng, p)
                ctx.set(c.rready, int(rng.random() >= p / 2))
                _offer(ctx, c, "aw", writers.get(i, ()), aw_next.get(i, 0), rng, p)
                if i in writers and w_burst[i] < aw_next[i]:   # W only after its AW (DMA)
                    n = writers[i][w_burst[i]][1]
                    if ctx.get(c.wvalid) or rng.random() >= p:
                        ctx.set(c.wvalid, 1)
                        ctx.set(c.wdata, _word(i, w_burst[i], w_beat[i]))
                        ctx.set(c.wlast, int(w_beat[i] == n - 1))
                else:
                    ctx.set(c.wvalid, 0)
                ctx.set(c.bready, int(rng.random() >= p / 2))
            # --- slave drives
            ctx.set(port.arready, int(rng.random() >= p))
            ctx.set(port.awready, int(rng.random() >= p))
            ctx.set(port.wready, int(rng.random() >= p))
            if r_cur is None and rd_active and rng.random() >= p:
                heads = {}
                for b in rd_active:
                    heads.setdefault(b[0], b)       # in order per ID
                cands = list(heads.values())
                b = rng.choice(cands) if interleave else rd_active[0]
                r_cur = (b, b[3])
            if r_cur is not None:
                b, k = r_cur
                ctx.set(port.rvalid, 1)
                ctx.set(port.rid, b[0])
                ctx.set(port.rdata, mem(b[1] + BB * k))
                ctx.set(port.rlast, int(k == b[2] - 1))
            else:
                ctx.set(port.rvalid, 0)
            if b_cur is None and b_pending and rng.random() >= p:
                b_cur = b_pending.pop(rng.randrange(len(b_pending)))
            ctx.set(port.bvalid, int(b_cur is not None))
            ctx.set(port.bid, b_cur if b_cur is not None else 0)
            # --- handshakes (settled combinational values)
            for i, c in enumerate(cl):
                if ctx.get(c.arvalid) and ctx.get(c.arready):
                    ar_next[i] += 1
                if ctx.get(c.awvalid) and ctx.get(c.awready):
                    aw_next[i] += 1
                if ctx.get(c.wvalid) and ctx.get(c.wready):
                    if ctx.get(c.wlast):
                        w_burst[i] += 1
                        w_beat[i] = 0
                    else:
                        w_beat[i] += 1
                if ctx.get(c.rvalid) and ctx.get(c.rready):
                    obs["r"][i].append((ctx.get(c.rid), ctx.get(c.rdata), ctx.get(c.rlast)))
                    obs["r_beats"] += 1
                if ctx.get(c.bvalid) and ctx.get(c.bready):
                    obs["b"][i] += 1
                    got_b += 1
                for name in ("arvalid", "awvalid", "wvalid"):
                    if i in idle_clients:
                        assert not ctx.get(getattr(c, name.replace("valid", "ready"))) or \
                            not ctx.get(getattr(c, name))
            if ctx.get(port.arvalid) and ctx.get(port.arready):
                a = (ctx.get(port.arid), ctx.get(port.araddr), ctx.get(port.arlen) + 1, 0)
                rd_active.append(list(a))
                obs["ar"].append(a[:3])
            if ctx.get(port.awvalid) and ctx.get(port.awready):
                wr_aws.append((ctx.get(port.awid), ctx.get(port.awlen) + 1))
                obs["aw"].append((ctx.get(port.awid), ctx.get(port.awaddr)))
            if ctx.get(port.wvalid) and ctx.get(port.wready):
                obs["w_order"].append((ctx.get(port.wdata), ctx.get(port.wlast)))
                w_got += 1
                wlasts += ctx.get(port.wlast)
            if r_cur is not None and ctx.get(port.rready):
                b, k = r_cur
                b[3] += 1
                if b[3] == b[2]:
                    rd_active.remove(b)
                r_cur = None
            if b_cur is not None and ctx.get(port.bready):
                b_cur = None
            # the n-th wlast answers the n-th AW (W may reach the port before its AW)
            while b_resolved < wlasts and b_resolved < len(wr_aws):
                b_pending.append(wr_aws[b_resolved][0])
                b_resolved += 1
            await ctx.tick()
            cycle += 1
        obs["cycles"] = cycle

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return obs


def _bursts(rng, k, lo=1, hi=16):
    return [(rng.randrange(0, 1 << 20) * BB, rng.randint(lo, hi)) for _ in range(k)]


def _check(obs, readers, writers, n_clients):
    def mem(addr):
        return (addr * 2654435761) & ((1 << 128) - 1)
    ib = max(1, (n_clients - 1).bit_length())
    for i, bl in readers.items():
        want = [((k & 1), mem(a + BB * j), int(j == n - 1))
                for k, (a, n) in enumerate(bl) for j in range(n)]
        for cid in (0, 1):      # in order per ID (two IDs of one client may interleave)
            got = [r for r in obs["r"][i] if r[0] == cid]
            assert got == [r for r in want if r[0] == cid], \
                f"client {i} id {cid}: R beats wrong or out of order"
        assert len(obs["r"][i]) == len(want)
    for i, bl in writers.items():
        assert obs["b"][i] == len(bl)
    # the port's IDs: {index, client id}
    for arid, addr, n in obs["ar"]:
        i = arid >> 1
        assert (addr, n) in readers[i]
    # W on the port: whole bursts in AW order, each from the client its AW named
    beats = iter(obs["w_order"])
    for awid, _ in obs["aw"]:
        i = awid >> 1
        assert 0 <= i < 1 << ib
        burst = None
        while True:
            data, last = next(beats)
            client, b = data >> 100, (data >> 50) & ((1 << 50) - 1)
            assert client == i, "W beat of another client than its AW"
            burst = b if burst is None else burst
            assert b == burst, "W beats of two bursts mixed"
            if last:
                break


@pytest.mark.parametrize("seed,p,w_depth", [(1, 0.3, 8), (2, 0.5, 2), (3, 0.0, 1)])
def test_mux_routing(seed, p, w_depth):
    """Three readers, two writers, one idle client; R interleaved across IDs, B out of order,
    random valid/ready everywhere: every client gets its own beats in order, W follows AW."""
    rng = random.Random(seed)
    readers = {0: _bursts(rng, 12), 2: _bursts(rng, 12), 5: _bursts(rng, 6, 1, 3)}
    writers = {1: _bursts(rng, 10), 3: _bursts(rng, 10, 1, 4)}
    obs = simulate(6, readers, writers, seed=seed, p=p, w_depth=w_depth, idle_clients=(4,))
    _check(obs, readers, writers, 6)


def test_mux_mixed_client():
    """A client using both halves (a DmaLoader) and a single-client mux."""
    rng = random.Random(7)
    readers = {0: _bursts(rng, 8), 1: _bursts(rng, 8)}
    writers = {1: _bursts(rng, 8)}
    obs = simulate(2, readers, writers, seed=7)
    _check(obs, readers, writers, 2)
    obs = simulate(1, {0: readers[0]}, {0: writers[1]}, seed=8)
    _check(obs, {0: readers[0]}, {0: writers[1]}, 1)


def test_mux_back_to_back():
    """Ideal slave and clients (no pauses, no interleave): two readers of 16-beat bursts get
    one R beat per cycle combined, and AR grants alternate."""
    rng = random.Random(4)
    readers = {0: _bursts(rng, 20, 16, 16), 1: _bursts(rng, 20, 16, 16)}
    obs = simulate(2, readers, {}, seed=4, p=0.0, interleave=False)
    _check(obs, readers, {}, 2)
    beats = 2 * 20 * 16
    assert beats / obs["cycles"] >= 0.98, obs["cycles"]
    ids = [a[0] >> 1 for a in obs["ar"]]
    assert all(a != b for a, b in zip(ids[:20], ids[1:20]))      # round robin


# --- cocotb + Verilator bench ---------------------------------------------------------------

BENCH = "mcf.sim.benches.axi_mux"


def mux_built():
    from mcf.sim import build
    from mcf.sim.benches.axi_mux import harness
    return build(harness(), "axi_mux_dma", width_warnings=True)


@pytest.mark.parametrize("seed,pause,bp", [(1, 0.0, 0.0), (2, 0.3, 0.3), (3, 0.6, 0.5)])
def test_mux_bench(seed, pause, bp):
    from mcf.sim import run
    run(mux_built(), BENCH, params={"seed": seed, "n": 12, "pause": pause, "bp": bp,
                                    "tests": ["random_mix"]})


def test_mux_rate(tmp_path):
    """Two readers streaming 64 KiB each, AxiRam without pauses: combined R beats per cycle
    (printed with ``-s``; asserted >= 0.9)."""
    from mcf.sim import run
    out = tmp_path / "rate.json"
    run(mux_built(), BENCH, params={"seed": 5, "tests": ["rate"], "out": str(out)})
    r = json.loads(out.read_text())
    print("axi mux rate:", r)
    assert r["r_beats_per_cycle"] >= 0.9
