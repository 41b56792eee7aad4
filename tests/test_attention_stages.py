"""Stage components of the attention engine in amaranth.sim, each against the ABI / golden
arithmetic it implements: QK bank (ScorePipe), PV bank (PVPipe), merge (MergeUnit), o / l
(Normalizer), word packer (WordPacker)."""

from __future__ import annotations

import numpy as np
from amaranth.sim import Simulator

from mcf.abi.framing import beat_layout
from mcf.abi.kv import v_weight
from mcf.abi.softmax import M_EMPTY, exp2_neg, merge_state, normalize
from mcf.golden.attention import job_scores, random_blocks, random_query
from mcf.hdl.compute.attn_merge import MergeUnit
from mcf.hdl.compute.attn_out import Normalizer, WordPacker
from mcf.hdl.compute.attn_pv import PVPipe, acc_width
from mcf.hdl.compute.attn_score import ScorePipe
from mcf.sim.attention_jobs import words_from_beats

D, L, G, T = 16, 4, 3, 16
NB = D // L
MASK32 = (1 << 32) - 1


def _sim(dut, *testbenches):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for tb in testbenches:
        sim.add_testbench(tb)
    sim.run()


async def _run_once(ctx, dut):
    """Pulse ``dut.start`` for one cycle, wait for ``done``, then one more edge (the outputs
    are read after it)."""
    ctx.set(dut.start, 1)
    await ctx.tick()
    ctx.set(dut.start, 0)
    while not ctx.get(dut.done):
        await ctx.tick()
    await ctx.tick()


def _word(values, width):
    return sum((int(v) & ((1 << width) - 1)) << (width * i) for i, v in enumerate(values))


def _s32(x):
    x &= MASK32
    return x - (1 << 32) if x >> 31 else x


def test_score_pipe_matches_golden_scores():
    """Rows issued head-interleaved (as the engine does) and head-major, every score exact."""
    rng = np.random.default_rng(21)
    (blk,) = random_blocks(rng, [6], D)
    q, sq = random_query(rng, G, D, sigma=2.0)
    t_ref, _ = job_scores(q, sq, blk)
    dut = ScorePipe(D, L, G, T)
    got = {}

    async def tb(ctx):
        for h in range(G):
            for c in range(NB):
                ctx.set(dut.load, {"en": 1, "h": h, "c": c,
                                   "data": _word(q[h, c * L:(c + 1) * L], 8),
                                   "scale_m": int(sq[h, 0]), "scale_e": int(sq[h, 1]) & 0xff})
                await ctx.tick()
        ctx.set(dut.load.en, 0)
        issues = [(j, c, h) for j in range(len(blk)) for c in range(NB) for h in range(G)]
        for n in range(len(issues) + ScorePipe.LATENCY + 1):
            if n < len(issues):
                j, c, h = issues[n]
                ctx.set(dut.i, {"valid": 1, "h": h, "c": c, "j": j, "ok": 1, "kvalid": 1,
                                "sk": int(blk.sk[j]),
                                "k": _word(blk.k[j, c * L:(c + 1) * L], 4)})
            else:
                ctx.set(dut.i.valid, 0)
            if ctx.get(dut.o.valid):
                got[(ctx.get(dut.o.j), ctx.get(dut.o.h))] = ctx.get(dut.o.t)
            await ctx.tick()

    _sim(dut, tb)
    assert len(got) == len(blk) * G
    for (j, h), t in got.items():
        assert t == t_ref[h, j], (j, h)


def test_pv_pipe_probability_weight_and_products():
    """Per issue: ``p = exp2_neg(m − t)`` (0 when masked) into ``l``, ``w·v`` lanes added to the
    accumulator word read back, FIXED-mode violations flagged."""
    rng = np.random.default_rng(22)
    n = 40
    acc_w = acc_width(T)
    m_base = rng.integers(-3000, 3000, G)
    t = m_base[rng.integers(0, G, n)] - rng.integers(-200, 6000, n)
    t[rng.random(n) < 0.1] = M_EMPTY // 2
    sv = rng.integers(1, 1 << 16, n)
    kvalid = rng.random(n) < 0.8
    heads = rng.integers(0, G, n)
    chunks = rng.integers(0, NB, n)
    v = rng.integers(-8, 8, (n, L))
    acc0 = rng.integers(-(1 << 30), 1 << 30, (n, L))
    dut = PVPipe(D, L, G, T)
    writes, lsum, errs = [], [], []

    async def tb(ctx):
        ctx.set(dut.fixed, 1)
        for h in range(G):
            ctx.set(dut.m_base[h], int(m_base[h]))
        pending = None
        for k in range(n + PVPipe.LATENCY + 2):
            if k < n:
                ctx.set(dut.i, {"valid": 1, "h": int(heads[k]), "c": int(chunks[k]), "ok": 1,
                                "v": _word(v[k], 4)})
            else:
                ctx.set(dut.i.valid, 0)
            if 1 <= k <= n:          # memory read data of the previous issue
                ctx.set(dut.t, int(t[k - 1]))
                ctx.set(dut.sv, int(sv[k - 1]))
                ctx.set(dut.kvalid, int(kvalid[k - 1]))
            ctx.set(dut.acc_data, pending if pending is not None else 0)
            if ctx.get(dut.acc_wr_en):
                writes.append((ctx.get(dut.acc_wr_addr), ctx.get(dut.acc_wr_data)))
            if ctx.get(dut.l_en):
                lsum.append((ctx.get(dut.l_h), ctx.get(dut.l_p)))
            errs.append(ctx.get(dut.err_max))
            pending = None
            if ctx.get(dut.acc_rd):
                idx = len(writes)            # the read belongs to the next write
                pending = _word(acc0[idx], acc_w)
            await ctx.tick()

    _sim(dut, tb)
    d = m_base[heads] - t
    p = np.where(kvalid, exp2_neg(np.maximum(d, 0)), 0)
    w = v_weight(p, sv)
    assert [a for a, _ in writes] == list(heads * NB + chunks)
    for k, (_, data) in enumerate(writes):
        lanes = [((data >> (acc_w * i)) & ((1 << acc_w) - 1)) for i in range(L)]
        lanes = [x - (1 << acc_w) if x >> (acc_w - 1) else x for x in lanes]
        assert lanes == list(acc0[k] + w[k] * v[k]), k
    exp_l = [(int(heads[k]), int(p[k])) for k in range(n) if chunks[k] == 0]
    assert lsum == exp_l
    assert sum(errs) == int(((d < 0) & kvalid & (chunks == 0)).sum())


def test_merge_unit_matches_merge_state():
    rng = np.random.default_rng(23)
    acc_w = acc_width(T)
    cases = [(int(rng.integers(-5000, 5000)), int(rng.integers(-5000, 5000))) for _ in range(6)]
    cases += [(M_EMPTY, 100), (100, M_EMPTY), (M_EMPTY, M_EMPTY), (7, 7)]
    dut = MergeUnit(L, acc_w)
    results = []
    data = []
    for m_run, m_blk in cases:
        l_run, l_blk = (int(x) for x in rng.integers(0, 1 << 32, 2))
        o_run = rng.integers(-(1 << 31), 1 << 31, L)
        o_blk = rng.integers(-(1 << (acc_w - 1)), 1 << (acc_w - 1), L)  # saturated first
        data.append((m_run, m_blk, l_run, l_blk, o_run, o_blk))

    async def tb(ctx):
        for m_run, m_blk, l_run, l_blk, o_run, o_blk in data:
            ctx.set(dut.m_run, m_run)
            ctx.set(dut.m_blk, m_blk)
            ctx.set(dut.l_run, l_run)
            ctx.set(dut.l_blk, l_blk)
            ctx.set(dut.o_run, _word(o_run, 32))
            ctx.set(dut.o_blk, _word(o_blk, acc_w))
            await _run_once(ctx, dut)
            out = ctx.get(dut.o_out)
            results.append((ctx.get(dut.m_new), ctx.get(dut.l_out),
                            [_s32(out >> (32 * i)) for i in range(L)]))

    _sim(dut, tb)
    for (m_run, m_blk, l_run, l_blk, o_run, o_blk), (m_new, l_out, o_out) in zip(data, results):
        o_b = np.clip(o_blk, -(1 << 31), (1 << 31) - 1)
        m_ref, l_ref, o_ref = merge_state((m_run, l_run, o_run), (m_blk, l_blk, o_b))
        assert (m_new, l_out, o_out) == (int(m_ref), int(l_ref), [int(x) for x in o_ref])


def test_normalizer_matches_abi_normalize():
    rng = np.random.default_rng(24)
    ls = [0, 1, 2, 3, 65535, 65536, 1 << 31, MASK32] + [int(x) for x in
                                                        rng.integers(1, 1 << 32, 12)]
    xs = rng.integers(-(1 << 31), 1 << 31, 8)
    dut = Normalizer()
    got = []

    async def tb(ctx):
        for lv in ls:
            ctx.set(dut.l, lv)
            await _run_once(ctx, dut)
            row = []
            for x in xs:
                ctx.set(dut.x, int(x))
                await ctx.tick()
                row.append(_s32(ctx.get(dut.y)))
            got.append(row)

    _sim(dut, tb)
    for lv, row in zip(ls, got):
        assert row == [int(v) for v in normalize(lv, xs)], lv


def test_word_packer_beats_with_backpressure():
    rng = np.random.default_rng(25)
    dw = 64
    lengths = [1, 2, 3, 5, 8, 1, 1, 4]
    words, lasts = [], []
    for n in lengths:
        for i in range(n):
            words.append(int(rng.integers(0, 1 << 32)))
            lasts.append(int(i == n - 1))
    dut = WordPacker(dw, 8)
    beats = []

    async def producer(ctx):
        for w, last in zip(words, lasts):
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.payload, {"word": w, "last": last})
            await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        while sum(b[2] for b in beats) < len(lengths):
            ready = rng.random() < 0.6
            ctx.set(dut.o.ready, int(ready))
            _, _, valid, data, keep, last = await ctx.tick().sample(
                dut.o.valid, dut.o.payload.data, dut.o.payload.keep, dut.o.payload.last)
            if valid and ready:
                beats.append((data, keep, last))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer, background=True)
    sim.add_testbench(consumer)
    sim.run()
    got, ends = words_from_beats(beats, dw)
    assert got == words
    assert ends == list(np.cumsum(lengths))
    assert beat_layout(dw).size == len(dut.o.payload.as_value())


def test_merge_stage_merges_every_head_word_by_word():
    """MergeStage against merge_state, with the running o and the block accumulator held in
    testbench memories (read data one cycle after the address, writes applied at once)."""
    from mcf.hdl.compute.attn_merge import MergeStage

    rng = np.random.default_rng(26)
    acc_w = acc_width(T)
    heads, ml = 3, 2
    m_run = [int(x) for x in rng.integers(-4000, 4000, heads)]
    m_blk = [int(x) for x in rng.integers(-4000, 4000, heads)]
    m_run[1] = M_EMPTY                                  # first block of a job
    l_run = [int(x) for x in rng.integers(0, 1 << 31, heads)]
    l_blk = [int(x) for x in rng.integers(0, 1 << 31, heads)]
    o_run = rng.integers(-(1 << 31), 1 << 31, (heads, D))
    o_blk = rng.integers(-(1 << (acc_w - 1)), 1 << (acc_w - 1), (heads, D))
    orun = {h * NB + c: _word(o_run[h, c * L:(c + 1) * L], 32) for h in range(heads)
            for c in range(NB)}
    oacc = {h * NB + c: _word(o_blk[h, c * L:(c + 1) * L], acc_w) for h in range(heads)
            for c in range(NB)}
    state = {"m": list(m_run), "l": list(l_run), "lb": list(l_blk)}
    dut = MergeStage(D, L, G, ml, acc_w)

    async def tb(ctx):
        ctx.set(dut.heads, heads)
        for h in range(heads):
            ctx.set(dut.m_blk[h], m_blk[h])
        ctx.set(dut.go, 1)
        await ctx.tick()
        ctx.set(dut.go, 0)
        addr = 0
        for _ in range(2000):
            h = ctx.get(dut.h)
            ctx.set(dut.m_run, state["m"][h])
            ctx.set(dut.l_run, state["l"][h])
            ctx.set(dut.l_blk, state["lb"][h])
            ctx.set(dut.o_run_data, orun.get(addr, 0))
            ctx.set(dut.acc_data, oacc.get(addr, 0))
            if ctx.get(dut.wr):
                orun[ctx.get(dut.addr)] = ctx.get(dut.wr_data)
                oacc[ctx.get(dut.addr)] = 0
            if ctx.get(dut.set_run):
                state["m"][h] = ctx.get(dut.m_new)
                state["l"][h] = ctx.get(dut.l_new)
                state["lb"][h] = 0
            addr = ctx.get(dut.addr)
            await ctx.tick()
            if not ctx.get(dut.busy):
                break

    _sim(dut, tb)
    for h in range(heads):
        o_b = np.clip(o_blk[h], -(1 << 31), (1 << 31) - 1)
        m_ref, l_ref, o_ref = merge_state((m_run[h], l_run[h], o_run[h]),
                                          (m_blk[h], l_blk[h], o_b))
        got = [_s32(orun[h * NB + c] >> (32 * i)) for c in range(NB) for i in range(L)]
        assert (state["m"][h], state["l"][h], got) == (int(m_ref), int(l_ref),
                                                       [int(x) for x in o_ref]), h
        assert state["lb"][h] == 0 and all(oacc[h * NB + c] == 0 for c in range(NB))
