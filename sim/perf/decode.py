"""Decode at the DDR roofline (issue #34; docs/node.md §4; paper §5, Fig. 2: the memory frontend):
the weight stream of an M = 1 GEMM sequence read from all four HP ports in lockstep.

:func:`weight_stream` runs :class:`mcf.hdl.mem.stripe.StripeReader` (kr260: four 128-bit ports,
a 512-bit ``w_in``) in ``amaranth.sim`` on a Qwen2.5-1.5B-shaped layer: the Q, K, V, O, gate,
up and down matrices (hidden 1,536, KV 256, MLP 8,960), each laid out by the host
(:func:`mcf.quant.gemm_stripe_image`) in a DDR model and queued as one job, back to back. Every
word leaving the reader is checked against the GEMM's weight stream
(:func:`mcf.abi.compute.gemm_w_stream`); a mismatch, a missing word, a rejected job or an error
beat refuses the figure (:class:`~mcf.sim.perf.BenchRefused`).

The DDR model (:class:`DdrPort`, one per port): an AXI4 read slave answering each burst
``latency`` cycles after its AR (:data:`DDR_LATENCY` = 100 cycles, 333 ns at the assumed 300 MHz,
as the compute bench's DMA read), bursts pipelined and in order, one R beat per cycle per port:
four ports = 64 B/cycle = the DDR4-2400 peak (19.2 GB/s at 300 MHz). ``ddr_efficiency`` < 1 makes
each port's R channel idle at random in that share of cycles (refresh, page misses and
read/write turnarounds of a real controller: **assumed**, not measured); 1.0 is the ideal port.
The consumer (the GEMM's ``w_in``) takes a word every cycle.

Figures: ``weight_bytes_per_cycle`` = weight-stream bytes delivered / cycles from the first job
to the last word; ``weight_port_efficiency`` = that / 64 B; ``busy_cycles`` the reader's own
count (:data:`mcf.abi.compute.STRIPE_STATUS`).

    python -c "from mcf.sim.perf.decode import weight_stream; print(weight_stream())"

:func:`tp_runs` measures tensor-parallel decode in RTL (issue #34 item 3): the tiny model through
``mcf run``'s simulation (:func:`mcf.commands.run.simulate`, ``sim`` node tops, one Verilator
build) with ``--decode tp`` and with the replicated root (``--decode root``) on the same prompt.
``tp.n2.bit_exact``: the TP run's tokens and logits equal its golden's (which the TP golden
asserts equal to the root's) and, in the full run, the root run's bit for bit; the cycles per
decode token of both. N = 4 is reported as not run, with the reason ``RunSpec`` refuses it.
The small (CI) path runs TP alone, on a one-chunk prompt with one decode token.
"""

from __future__ import annotations

import collections
import random

import numpy as np

from mcf.abi.compute import STRIPE_STATUS, WEIGHT_STRIPES, gemm_w_stream
from mcf.abi.quant import GROUP_SIZE
from mcf.sim.perf import BenchRefused, checked_run, refuse_unplanned

__all__ = ["DECODE_SHAPES", "DDR_LATENCY", "DdrPort", "packer", "simulate", "layer_image",
           "weight_stream", "TP_NODES", "tp_runs", "collect", "render"]

ROWS, LANES = 16, 16
BEAT_BYTES = 16                      # one HP port (AXI_WIDTH)
WORD_BYTES = WEIGHT_STRIPES * BEAT_BYTES
HIDDEN, KV, INTER = 1536, 256, 8960
DECODE_SHAPES = (("q", HIDDEN, HIDDEN), ("k", KV, HIDDEN), ("v", KV, HIDDEN),
                 ("o", HIDDEN, HIDDEN), ("gate", INTER, HIDDEN), ("up", INTER, HIDDEN),
                 ("down", HIDDEN, INTER))
"""``(name, N, K)`` of one Qwen2.5-1.5B layer's matrices, in the order decode runs them."""
DDR_LATENCY = 100
"""Cycles from a burst's AR handshake to its first R beat (as ``mcf.sim.perf.compute``)."""
SMALL_DIV = 32
"""``small``: every N divided by this (rounded to whole tiles)."""


class DdrPort:
    """AXI4 read slave of one HP port for ``amaranth.sim``: bursts in order per ID, each
    answered no earlier than ``latency`` + random(0..``jitter``) cycles after its AR (pipelined),
    then one R beat per cycle except random idle cycles (probability ``r_idle``); ``arready``
    low at random (``ar_idle``). Data from ``mem`` (a byte buffer); beats whose address is in
    ``bad`` answer SLVERR (with the memory's data, so only the response shows it). Checks the
    master's protocol: full-size INCR bursts of at most 256 beats not crossing 4 KiB, and
    ``rready`` high whenever ``rvalid`` (the reader never blocks the R channel).
    ``interleave``: R beats of different IDs interleave at random."""

    def __init__(self, bus, mem, rng: random.Random, *, latency: int = DDR_LATENCY,
                 jitter: int = 0, ar_idle: float = 0.0, r_idle: float = 0.0,
                 bad: frozenset[int] = frozenset(), interleave: bool = False):
        self.bus, self.mem, self.rng = bus, mem, rng
        self.latency, self.jitter = latency, jitter
        self.ar_idle, self.r_idle, self.bad, self.interleave = ar_idle, r_idle, bad, interleave
        self.bb = len(bus.rdata) // 8
        self.bursts: collections.deque = collections.deque()   # [due, id, addr, beats, sent]
        self.cur = None                 # the burst whose beat is on R
        self.beats = 0
        self.ar_log: list[tuple[int, int, int]] = []           # (id, addr, beats)

    @property
    def inputs(self) -> list:
        """The slave's signals (the master's inputs), in the order of :meth:`values`."""
        b = self.bus
        return [b.arready, b.rvalid, b.rid, b.rdata, b.rresp, b.rlast]

    def values(self, cycle: int) -> list[int]:
        """What the slave drives in ``cycle`` (call once per cycle, before :meth:`observe`)."""
        ready = int(self.rng.random() >= self.ar_idle)
        if self.cur is None and self.bursts and self.rng.random() >= self.r_idle:
            due = [x for x in self._heads() if x[0] <= cycle]
            if due:
                self.cur = self.rng.choice(due) if self.interleave else due[0]
        if self.cur is None:
            return [ready, 0, 0, 0, 0, 0]
        _, rid, addr, n, k = self.cur
        a = addr + k * self.bb
        return [ready, 1, rid, int.from_bytes(self.mem[a:a + self.bb], "little"),
                2 if a in self.bad else 0, int(k == n - 1)]

    def drive(self, ctx, cycle: int) -> None:
        """Set :meth:`values` on the bus (one settle)."""
        cat, pack = packer(self.inputs)
        ctx.set(cat, pack(self.values(cycle)))

    def _heads(self):
        if not self.interleave:
            return [self.bursts[0]]
        heads = {}
        for x in self.bursts:
            heads.setdefault(x[1], x)
        return list(heads.values())

    def observe(self, ctx, cycle: int) -> None:
        b = self.bus
        if ctx.get(b.arvalid) and ctx.get(b.arready):
            addr, n = ctx.get(b.araddr), ctx.get(b.arlen) + 1
            rid = ctx.get(b.arid)
            assert ctx.get(b.arsize) == self.bb.bit_length() - 1 and ctx.get(b.arburst) == 1
            assert addr % self.bb == 0, f"unaligned araddr {addr:#x}"
            assert addr // 4096 == (addr + n * self.bb - 1) // 4096, f"{addr:#x}+{n} crosses 4 KiB"
            self.bursts.append([cycle + self.latency + self.rng.randint(0, self.jitter),
                                rid, addr, n, 0])
            self.ar_log.append((rid, addr, n))
        if self.cur is not None:
            assert ctx.get(b.rready), "R channel blocked (rready low with rvalid high)"
            self.cur[4] += 1
            self.beats += 1
            if self.cur[4] == self.cur[3]:
                self.bursts.remove(self.cur)
            self.cur = None


def packer(signals):
    """``(Cat(signals), pack)``: ``pack(values)`` is the integer that sets every signal to its
    value with one ``ctx.set`` (each ``set`` settles the whole design: one per cycle, not one
    per signal, is what keeps a four-port run fast)."""
    from amaranth import Cat
    from amaranth.hdl import Value

    sigs = [Value.cast(s) for s in signals]
    offs, at = [], 0
    for v in sigs:
        offs.append((at, (1 << len(v)) - 1))
        at += len(v)

    def pack(values) -> int:
        word = 0
        for (off, mask), val in zip(offs, values):
            word |= (val & mask) << off
        return word
    return Cat(*sigs), pack


def simulate(dut, ports: list[DdrPort], jobs: list[int], stream: bytes, *, bp: float = 0.0,
             job_idle: float = 0.0, seed: int = 0, max_cycles: int | None = None,
             extra=(), top=None) -> dict:
    """Run ``dut`` (a :class:`~mcf.hdl.mem.stripe.StripeReader`, or anything with its ``job``,
    ``o`` and ``status`` members) against ``ports``: push the packed ``jobs``, take ``o`` with
    random backpressure ``bp`` and check every word against ``stream`` (the concatenated
    expected words). ``extra``: ``(reader, descs, expected_bytes)`` of other DMA readers on the
    same ports (each ``DmaReader`` with its ``desc``/``o``), fed and checked alike. ``top``: the
    elaboratable to simulate (default ``dut``). Returns cycles (to the last word), words,
    mismatches, the cycle of the first word, ``job_done`` pulses, ``busy`` after the end and
    the reader's status."""
    from amaranth.sim import Simulator

    rng = random.Random(seed)
    wb = len(dut.o.payload) // 8
    n_words = len(stream) // wb
    max_cycles = max_cycles or 4 * n_words + 4000
    res = {"cycles": 0, "words": 0, "mismatches": 0, "first_word": None, "extra_ok": True,
           "job_done": 0}

    async def bench(ctx):
        cycle = 0
        ji = 0
        pos = 0
        xs = [{"rd": r, "descs": list(d), "want": bytes(w), "got": bytearray()}
              for r, d, w in extra]
        drv = [dut.job.valid, dut.job.payload, dut.o.ready]
        for x in xs:
            drv += [x["rd"].desc.valid, x["rd"].desc.payload, x["rd"].o.ready]
        for p in ports:
            drv += p.inputs
        cat, pack = packer(drv)
        job_valid = 0
        while pos < n_words or any(len(x["got"]) < len(x["want"]) for x in xs):
            if cycle >= max_cycles:
                break
            job_valid = int(ji < len(jobs) and (job_valid or rng.random() >= job_idle))
            vals = [job_valid, jobs[ji] if job_valid else 0, int(rng.random() >= bp)]
            for x in xs:
                vals += [int(bool(x["descs"])), x["descs"][0] if x["descs"] else 0, 1]
            for p in ports:
                vals += p.values(cycle)
            ctx.set(cat, pack(vals))      # one settle per cycle: every set settles the design
            # handshakes on the settled values
            if job_valid and ctx.get(dut.job.ready):
                ji += 1
                job_valid = 0
            if vals[2] and ctx.get(dut.o.valid):
                got = ctx.get(dut.o.payload)
                if got != int.from_bytes(stream[pos * wb:(pos + 1) * wb], "little"):
                    res["mismatches"] += 1
                if res["first_word"] is None:
                    res["first_word"] = cycle
                pos += 1
            for x in xs:
                rd = x["rd"]
                if x["descs"] and ctx.get(rd.desc.ready):
                    x["descs"].pop(0)
                if ctx.get(rd.o.valid):
                    p = rd.o.payload
                    keep = ctx.get(p.keep)
                    nb = bin(keep).count("1")
                    x["got"] += ctx.get(p.data).to_bytes(len(p.data) // 8, "little")[:nb]
            for p in ports:
                p.observe(ctx, cycle)
            res["job_done"] += ctx.get(dut.job_done)
            await ctx.tick()
            cycle += 1
        res["cycles"] = cycle
        res["words"] = pos
        res["extra_ok"] = all(x["got"] == x["want"] for x in xs)
        ctx.set(cat, 0)                   # every input idle
        for _ in range(3):
            res["job_done"] += ctx.get(dut.job_done)
            await ctx.tick()
        res["busy"] = ctx.get(dut.busy)
        raw = ctx.get(dut.status)
        res["status"] = {n: int(raw[n]) for n, _ in STRIPE_STATUS}

    sim = Simulator(top if top is not None else dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return res


def _rand_weight(rng: np.random.Generator, n: int, k: int):
    from mcf.quant import QuantWeight
    q = rng.integers(-8, 8, (n, k), dtype=np.int8)
    m = rng.integers(0, 1 << 16, (n, k // GROUP_SIZE))
    return QuantWeight(q, m, -20, GROUP_SIZE), rng.integers(-(1 << 20), 1 << 20, n)


def layer_image(shapes, seed: int = 0, base: int = 0x10000):
    """Random INT4 matrices of ``shapes`` (``(name, N, K)``) laid out as the driver does
    (:func:`mcf.quant.gemm_stripe_image`, 4 KiB-aligned, one after the other from ``base``).
    Returns ``(mem, jobs, stream)``: the DDR bytes, the :class:`StripeJob` of each matrix and
    the expected ``w_in`` words of all of them (their :func:`gemm_w_stream`, concatenated)."""
    from mcf.quant import gemm_stripe_image, gemm_tile_blob

    rng = np.random.default_rng(seed)
    mem = bytearray(base)
    jobs, stream = [], bytearray()
    for _, n, k in shapes:
        qw, bias = _rand_weight(rng, n, k)
        image, job = gemm_stripe_image(qw, ROWS, LANES, bias, base=len(mem),
                                       ports=WEIGHT_STRIPES, beat_bytes=BEAT_BYTES)
        mem += image + bytes((-len(image)) % 4096)
        jobs.append(job)
        stream += gemm_w_stream(gemm_tile_blob(qw, ROWS, LANES, bias), k // LANES, n // ROWS,
                                ROWS, LANES, WORD_BYTES, GROUP_SIZE)
    return mem, jobs, bytes(stream)


def small_shapes(div: int = SMALL_DIV):
    """:data:`DECODE_SHAPES` with every N divided by ``div`` (whole tiles, at least one)."""
    return tuple((name, max(ROWS, n // div // ROWS * ROWS), k) for name, n, k in DECODE_SHAPES)


def weight_stream(small: bool = False, *, latency: int = DDR_LATENCY,
                  ddr_efficiency: float = 1.0, shapes=None, seed: int = 34,
                  fifo_depth: int = 512, sabotage: str | None = None) -> dict:
    """Weight bytes per cycle into ``w_in`` for the M = 1 sequence of :data:`DECODE_SHAPES`
    (``small``: :func:`small_shapes`; ``shapes`` overrides both) on the kr260's
    :class:`~mcf.hdl.mem.stripe.StripeReader` (``fifo_depth`` beats per port) against four
    :class:`DdrPort` models. Refuses
    (:class:`BenchRefused`) unless every word is right and every job completes without a
    reject or error. ``sabotage`` (tests of the refusal): ``"error"`` makes one beat answer
    SLVERR, ``"corrupt"`` flips a byte of the DDR image after the stream was computed."""
    from mcf.hdl.mem.stripe import StripeReader

    shapes = shapes or (small_shapes() if small else DECODE_SHAPES)
    mem, jobs, stream = layer_image(shapes, seed)
    bad = frozenset()
    if sabotage == "error":
        bad = frozenset({jobs[0].addr + jobs[0].pitch + 2 * BEAT_BYTES})
    elif sabotage == "corrupt":
        mem[jobs[-1].addr + 3 * jobs[-1].pitch + 5] ^= 0x40
    elif sabotage is not None:
        raise ValueError(f"unknown sabotage {sabotage!r}")
    dut = StripeReader(WEIGHT_STRIPES, BEAT_BYTES * 8, fifo_depth=fifo_depth)
    rng = random.Random(seed)
    ports = [DdrPort(getattr(dut, f"bus{p}"), mem, rng, latency=latency,
                     r_idle=1.0 - ddr_efficiency, bad=bad) for p in range(WEIGHT_STRIPES)]
    r = simulate(dut, ports, [j.pack() for j in jobs], stream, seed=seed)
    what = "decode weight stream"
    if r["words"] != len(stream) // WORD_BYTES:
        raise BenchRefused(f"{what}: {r['words']} of {len(stream) // WORD_BYTES} words in "
                           f"{r['cycles']} cycles (hang)")
    if r["mismatches"]:
        raise BenchRefused(f"{what}: {r['mismatches']} words differ from the weight stream")
    st = r["status"]
    refuse_unplanned(what, {k: st[k] for k in ("jobs", "jobs_done", "rejects", "errors")},
                     {"jobs": len(jobs), "jobs_done": len(jobs)})
    rate = len(stream) / r["cycles"]
    return {
        "shapes": [list(s) for s in shapes],
        "jobs": len(jobs),
        "weight_bytes": len(stream),
        "cycles": r["cycles"],
        "first_word": r["first_word"],
        "busy_cycles": st["busy_cycles"],
        "weight_bytes_per_cycle": round(rate, 3),
        "weight_port_efficiency": round(rate / WORD_BYTES, 4),
        "ddr_latency": latency,
        "ddr_efficiency": ddr_efficiency,
        "port_bytes_per_cycle": BEAT_BYTES,
        "ports": WEIGHT_STRIPES,
        "fifo_depth": fifo_depth,
    }


TP_NODES = (2, 4)
"""The node counts of the TP decode runs (issue #34: N = 2 and 4)."""


def _decode_run(spec) -> dict:
    """One RTL run of ``spec`` (tiny model); refuses on a failed check."""
    from mcf.commands.run import ddr_model_bytes
    from mcf.model import model_from_spec

    cfg, _ = model_from_spec(spec.model, seed=spec.seed)
    mem = ddr_model_bytes(cfg, spec) * (2 if spec.decode == "tp" else 1)
    return checked_run(spec, f"decode {spec.decode} N={spec.nodes}", mem=mem)


def tp_runs(small: bool = False) -> dict:
    """Tensor-parallel decode against the replicated root on the tiny model (module docstring):
    per N in :data:`TP_NODES`, ``bit_exact`` and the cycles per decode token of each run, or
    ``{"run": False, "reason": ...}`` for an N the runtime refuses."""
    from dataclasses import replace

    from mcf.cluster import RunError, RunSpec

    out = {}
    for n in TP_NODES:
        try:
            tp = RunSpec(nodes=n, decode="tp", decode_tokens=1 if small else 2)
        except RunError as exc:
            out[f"n{n}"] = {"run": False, "reason": str(exc)}
            continue
        if small:                       # CI: one prefill step (a chunk), one decode token
            tp = replace(tp, prompt_tokens=tp.chunk)
        got = _decode_run(tp)
        rec = {"run": True, "bit_exact": all(got["checks"].values()),
               "tp_decode_cycles_per_token": got["decode_cycles"]}
        if not small:
            root = _decode_run(replace(tp, decode="root"))
            same = got["tokens"] == root["tokens"] and got["logits"] == root["logits"]
            if not same:
                raise BenchRefused(f"decode tp N={n}: tokens or logits differ from the root's")
            rec.update(bit_exact=rec["bit_exact"] and same,
                       root_decode_cycles_per_token=root["decode_cycles"])
        out[f"n{n}"] = rec
    return out


def collect(small: bool = False, synth: bool = True) -> dict:
    """The bench contract (:mod:`mcf.sim.perf`): the weight stream (ideal DDR ports and ports
    at an assumed 90 % efficiency), tensor-parallel decode against the root (:func:`tp_runs`)
    and, with ``synth``, the reader's resources."""
    out = {"weights": weight_stream(small),
           "weights_ddr90": weight_stream(small, ddr_efficiency=0.9),
           "tp": tp_runs(small)}
    if synth:
        from mcf.hdl.mem.stripe import StripeReader
        from mcf.sim.synth import resources
        out["resources"] = {"stripe_reader": resources(StripeReader(), "stripe_reader")}
    return out


def render(result: dict) -> str:
    lines = ["Decode weight stream (StripeReader, 4 × 128-bit HP ports → 512-bit w_in; "
             "amaranth.sim)"]
    for key in ("weights", "weights_ddr90"):
        r = result.get(key)
        if r is None:
            continue
        lines.append(f"  {key}: {r['weight_bytes']:,} B in {r['cycles']:,} cycles = "
                     f"{r['weight_bytes_per_cycle']} B/cycle, efficiency "
                     f"{r['weight_port_efficiency']:.4f} of 64 B/cycle (DDR latency "
                     f"{r['ddr_latency']} cycles, port efficiency {r['ddr_efficiency']})")
    for key, r in result.get("tp", {}).items():
        if not r["run"]:
            lines.append(f"  tp {key}: not run ({r['reason']})")
            continue
        root = r.get("root_decode_cycles_per_token")
        lines.append(f"  tp {key} (tiny, RTL): bit-exact {r['bit_exact']}, cycles per decode "
                     f"token tp {', '.join(f'{c:,}' for c in r['tp_decode_cycles_per_token'])}"
                     + (f", root {', '.join(f'{c:,}' for c in root)}" if root else ""))
    if "resources" in result:
        from mcf.sim.perf import resource_table
        lines += resource_table(result["resources"], "Resources")
    return "\n".join(lines)
