"""The node top's GEMM weight path (docs/node.md §4, issue #34 item 1): the template walker's
STRIPE entries (:data:`mcf.abi.jobs.STRIPE_KIND`) → ``MatrixEngine(w_ports=4)``'s stripe readers
→ the GEMM's 512-bit ``w_in``, as :class:`mcf.hdl.node.compute.NodeCompute` builds it in both
node configurations. amaranth.sim with one AXI slave model per master (:mod:`mcf.sim.axi_slave`)
on one DDR image: templates written by :class:`mcf.abi.jobs.TemplateBuilder` from the host
layout (:func:`mcf.quant.gemm_stripe_image`), results bit-exact against
:func:`mcf.golden.gemm.gemm`; port 1 reads no weights; the STRIPE entry's ABI (pitch in
:data:`mcf.abi.compute.STRIPE_ALIGN` units, refused when it does not fit) and the walker's
golden model (:func:`mcf.abi.jobs.walk`) with and without stripe readers.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from amaranth import Module
from amaranth.sim import Simulator

from mcf.abi.compute import STRIPE_ALIGN, STRIPE_STATUS, WEIGHT_STRIPES, GemmLimits, StripeJob
from mcf.abi.jobs import (
    JOB_ARG,
    JOBS_STATUS,
    STRIPE_KIND,
    STRIPE_PITCH_BITS,
    Entry,
    TemplateBuilder,
    template_image,
    walk,
)
from mcf.abi.node import CMD
from mcf.abi.node_config import NODE_CONFIGS
from mcf.golden.gemm import gemm
from mcf.hdl.compute.gemm_top import MatrixEngine
from mcf.hdl.node.compute import COMPUTE_BUSES, WEIGHT_BUSES
from mcf.hdl.node.jobs import JobWalker, connect_engine
from mcf.hdl.node.top import HP_CLIENTS
from mcf.quant import QuantWeight, gemm_stripe_image, gemm_x_blob
from mcf.sim.amsim import send

BB = 16
LIMITS = GemmLimits(m_max=8, k_max=256)
TABLE = 0x400


def _case(rng, m, n, k, group=128):
    xq = rng.integers(-128, 128, (m, k))
    x_m = rng.integers(1 << 15, 1 << 16, m)
    x_e = rng.integers(-24, -18, m)
    qw = QuantWeight(rng.integers(-8, 8, (n, k)).astype(np.int8),
                     rng.integers(0, 1 << 16, (n, k // group)), int(rng.integers(-23, -20)),
                     group)
    return xq, x_m, x_e, qw, rng.integers(-(1 << 20), 1 << 20, n)


def _layout(cases):
    """DDR image and template: per case its activation blob, stripe image and output rows."""
    mem = bytearray(0x1000)

    def put(raw: bytes, align: int = 64) -> int:
        mem.extend(bytes((-len(mem)) % align))
        at = len(mem)
        mem.extend(raw)
        return at

    tb = TemplateBuilder(0)
    jobs, outs = [], []
    for xq, x_m, x_e, qw, bias in cases:
        m, k = xq.shape
        n = qw.q.shape[0]
        xa = put(gemm_x_blob(xq, x_m, x_e, BB))
        image, job = gemm_stripe_image(qw, 16, 16, bias)
        wa = put(image, STRIPE_ALIGN)
        out = put(bytes(m * n * 4))
        jobs.append((xa, m, k, dataclasses.replace(job, addr=wa), qw, out))
        outs.append(out)
    tb.gemms(jobs)
    table = put(bytes(0), 64)
    raw, n_tpl = template_image([tb.entries], table)
    put(raw)
    mem.extend(bytes(0x100))
    return mem, tb.entries, table, n_tpl, [j[3] for j in jobs], outs


def _run(cases, seed=1):
    from mcf.sim.axi_slave import read_slave, write_slave
    mem, entries, table, n_tpl, sjobs, outs = _layout(cases)
    top = Module()
    top.submodules.walker = w = JobWalker(LIMITS, vec_n_max=256, stripes=True)
    top.submodules.engine = x = MatrixEngine(k_max=LIMITS.k_max, m_max=LIMITS.m_max,
                                             vec_n_max=256, w_ports=WEIGHT_STRIPES)
    connect_engine(top, w, x)
    rng = random.Random(seed)
    wmem: dict[int, int] = {}
    aws: list = []
    port1: list = []

    def reader(a):
        return bytes(mem[a:a + BB]).ljust(BB, b"\0")

    sim = Simulator(top)
    sim.add_clock(1e-8)
    slaves = [read_slave(w.m_axi, rng, reader), read_slave(x.m_axi0, rng, reader),
              read_slave(x.m_axi1, rng, reader, on_ar=lambda a, n: port1.append(a)),
              write_slave(x.m_axi0, rng, wmem, aws),
              *(read_slave(getattr(x, f"m_axi_w{p}"), rng, reader, latency=(20, 40),
                           r_pause=0.1) for p in range(WEIGHT_STRIPES))]
    for s in slaves:
        sim.add_testbench(s, background=True)
    state = {}

    async def host(ctx):
        ctx.set(w.table_base, table)
        ctx.set(w.table_len, n_tpl)
        job = JOB_ARG.const({"template": 0}).as_bits()
        await send(ctx, w.rec, [CMD.const({"arg": job}).as_bits()])
        cycles = 0
        while not ctx.get(w.done):
            await ctx.tick()
            cycles += 1
            assert cycles < 40_000, "the JOB never retired"
        state["cycles"] = cycles
        state["jobs"] = {n: ctx.get(w.status[n]) for n, _ in JOBS_STATUS}
        state["stripe"] = {n: ctx.get(x.stripe_status[n]) for n, _ in STRIPE_STATUS}
        state["gemm_bad"] = ctx.get(x.gemm_status.bad_jobs)

    sim.add_testbench(host)
    sim.run()
    return mem, wmem, entries, table, n_tpl, sjobs, outs, port1, state


def test_template_gemms_through_stripe_readers():
    """A decode job (M = 1, an odd number of groups: scales padded to a 64-byte word), a 3-token
    job and a 2-tile decode job back to back from one template: every result row bit-exact, the
    weights read only by the stripe readers (one job and its words per GEMM job), port 1 idle."""
    rng = np.random.default_rng(34)
    cases = [_case(rng, 1, 32, 128), _case(rng, 3, 16, 256), _case(rng, 1, 32, 256)]
    mem, wmem, entries, table, n_tpl, sjobs, outs, port1, st = _run(cases)
    for (xq, x_m, x_e, qw, bias), out in zip(cases, outs, strict=True):
        m, n = xq.shape[0], qw.q.shape[0]
        raw = bytes(wmem.get(out + i, 0xEE) for i in range(m * n * 4))
        got = np.frombuffer(raw, "<i4").astype(np.int64).reshape(m, n)
        np.testing.assert_array_equal(got, gemm(xq, x_m, x_e, qw.q, qw.m, qw.e, bias, 128))
    assert port1 == []
    assert st["gemm_bad"] == 0
    assert st["jobs"]["bad_entries"] == 0 and st["jobs"]["entries"] == len(entries)
    s = st["stripe"]
    assert s["jobs"] == s["jobs_done"] == len(cases) and s["rejects"] == s["errors"] == 0
    assert s["words"] == sum(j.words(BB) for j in sjobs)
    # the walker's golden model issues the same stripe jobs
    actions, counts = walk(lambda a, k: bytes(mem[a:a + k]), table, n_tpl, 0, LIMITS)
    assert [v for _, t, v in actions if t == "w_job"] == [j.pack() for j in sjobs]
    assert not [t for _, t, _ in actions if t == "rd_desc1"]
    assert counts["entries"] == len(entries)


def test_stripe_entry_abi():
    """A STRIPE entry carries stripe 0's transfer and the pitch in 4 KiB units; a pitch that is
    not a whole number of units or too large is refused on the host; a walker without stripe
    readers counts the entry as a bad one (golden model)."""
    job = StripeJob(0x12_3456_7000, 2240, 3 * STRIPE_ALIGN, 0, 1)
    e = Entry(STRIPE_KIND, job)
    tb = TemplateBuilder(0)
    qw = QuantWeight(np.zeros((16, 128), np.int8), np.ones((16, 1), np.int64), 0, 128)
    tb.gemm(0x1000, 1, 128, job, qw, 0x2000)
    assert [x for x in tb.entries if x.kind == STRIPE_KIND] == [e]
    image, n = template_image([tb.entries], 0)

    def read(a, k):
        return image[a:a + k]

    actions, _ = walk(read, 0, n, 0, LIMITS)
    assert [v for _, t, v in actions if t == "w_job"] == [job.pack()]
    _, counts = walk(read, 0, n, 0, LIMITS, stripes=False)
    assert counts["bad_entries"] == 1
    for pitch in (STRIPE_ALIGN + 16, STRIPE_ALIGN << STRIPE_PITCH_BITS):
        with pytest.raises(ValueError):
            Entry(STRIPE_KIND, dataclasses.replace(job, pitch=pitch)).pack()


@pytest.mark.parametrize("name", sorted(NODE_CONFIGS))
def test_every_configuration_stripes_weights(name):
    """Both node configurations read weights through the stripe readers, one stripe per HP
    port (``w<p>`` a client of HP port ``p``), so the host lays weights out as stripe images."""
    cfg = NODE_CONFIGS[name]
    assert cfg.hp_ports == WEIGHT_STRIPES
    assert set(WEIGHT_BUSES) <= set(COMPUTE_BUSES)
    for p in range(cfg.hp_ports):
        assert f"w{p}" in HP_CLIENTS[p]
