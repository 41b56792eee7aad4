"""amaranth.sim tests of the tile softmax stage (issue #33 step 2, mcf.hdl.compute.tile_softmax):
every emitted ``w8``, ``m_b``, ``l_b`` and ``s`` against the golden model
(:func:`mcf.golden.attention_tiled.tile_block_state`, the ``mcf.abi`` rules) bit for bit, under
random valid/ready, and the stage's rate and latency measured in cycles."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from amaranth.sim import Simulator

from mcf.abi.attn_tile import (
    P8,
    P8_SHIFT_MAX,
    W_MAX,
    p8_beat_layout,
    p8_row_shift,
    pv_p8_out,
    qk_acc_bits,
    qk_pack_shift,
    quantize_p8,
    score_beat_layout,
)
from mcf.abi.fixed import saturate
from mcf.abi.kv import KV_SCALE, q_multiplier, score, score_shift, v_weight
from mcf.abi.kv_channel import fold_query
from mcf.abi.quant import ACT, SCALE_EXP_BITS, SCALE_MANT_BITS
from mcf.abi.softmax import M_EMPTY, STATE_O, exp2_neg
from mcf.golden.attention import KVBlock, KVChannelCache, random_blocks, random_query
from mcf.golden.attention_tiled import packed_matmul, tile_block_state, tile_scores
from mcf.hdl.compute.tile_softmax import TileSoftmax
from mcf.sim.amsim import send

D = 128                      # head_dim: the accumulator width and the score constant


@dataclass
class Row:
    """One (query row, KV block) as the arrays deliver it, per key: ``acc``, ``sk``, ``sv``,
    ``masked``, the query scale ``(sm, se)``; ``v`` for the P·V check; ``t`` when the golden
    scored a real block (else ``score`` of the ABI)."""
    acc: np.ndarray
    sk: np.ndarray
    sv: np.ndarray
    masked: np.ndarray
    sm: np.ndarray
    se: np.ndarray
    v: np.ndarray
    t: np.ndarray | None = None


def beats(row: Row, keys: int) -> list[int]:
    """The row's input beats (padded with masked keys to whole beats), as payload bits."""
    lay = score_beat_layout(keys, D)
    n = len(row.acc)
    nb = max(1, -(-n // keys))
    out = []
    for b in range(nb):
        ks = range(b * keys, (b + 1) * keys)
        real = [j for j in ks if j < n]
        sm = {int(row.sm[j]) for j in real} or {0}
        se = {int(row.se[j]) for j in real} or {0}
        assert len(sm) == 1 and len(se) == 1, "a beat's keys share the query scale"
        out.append(lay.const({
            "keys": [{"acc": int(row.acc[j]), "sk": int(row.sk[j]), "sv": int(row.sv[j]),
                      "masked": int(row.masked[j])} if j < n else
                     {"acc": 0, "sk": 0, "sv": 0, "masked": 1} for j in ks],
            "scale_m": sm.pop(), "scale_e": se.pop(), "last": int(b == nb - 1),
        }).as_bits())
    return out


def expect(row: Row):
    """``(m, l, s, w8, o)`` of a row: the golden block state with P8, and the ABI's rules."""
    t = row.t if row.t is not None else score(row.acc, row.sk, q_multiplier(row.sm, D),
                                              score_shift(row.se))
    valid = ~row.masked.astype(bool)
    blk = KVBlock(np.zeros_like(row.v), row.sk, row.v, row.sv, np.arange(len(row.acc)))
    st = tile_block_state(t[None], valid[None], blk, p_format=P8)
    p = np.where(valid, exp2_neg(np.where(valid, st.m[0] - t, 0)), 0)
    w = v_weight(p, row.sv)
    s = int(p8_row_shift(w.max(initial=0)))
    return int(st.m[0]), int(st.l[0]), s, quantize_p8(w, s), st.o[0]


def run(rows: list[Row], keys: int, max_block: int, slots: int = 4, idle: float = 0.0,
        stall: float = 0.0, seed: int = 0, extra_beats=None):
    """Drive the rows through a :class:`TileSoftmax`; returns the output rows
    ``[(m, l, s, w8[beats·keys])]``, the status counters and the per-cycle trace."""
    dut = TileSoftmax(keys=keys, head_dim=D, max_block=max_block, slots=slots)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    rng = np.random.default_rng(seed)
    stim = [beats(r, keys) for r in rows] if extra_beats is None else extra_beats
    olay = p8_beat_layout(keys)
    got, cur = [], []
    trace = {"take": [], "last_out": [], "ready_low": 0}

    async def producer(ctx):
        await send(ctx, dut.i, (bits for rb in stim for bits in rb), rng, idle)

    async def consumer(ctx):
        cyc = 0
        while len(got) < len(stim):
            ctx.set(dut.o.ready, int(not stall or rng.random() >= stall))
            _, _, iv, ir, ov, ordy, op = await ctx.tick().sample(
                dut.i.valid, dut.i.ready, dut.o.valid, dut.o.ready, dut.o.payload.as_value())
            if iv and ir:
                trace["take"].append(cyc)
            elif iv:
                trace["ready_low"] += 1
            if ov and ordy:
                b = olay.from_bits(op)
                cur.append((int(b.m), int(b.l), int(b.s), [int(b.w8[k]) for k in range(keys)]))
                if b.last:
                    got.append(list(cur))
                    cur.clear()
                    trace["last_out"].append(cyc)
            cyc += 1
        await ctx.tick()
        trace["rows"], trace["err_long"], trace["busy"] = (
            ctx.get(dut.rows), ctx.get(dut.err_long), ctx.get(dut.busy))

    sim.add_testbench(producer, background=True)
    sim.add_testbench(consumer)
    sim.run()
    return got, trace


def check(rows, got, keys):
    assert len(got) == len(rows)
    for r, (row, out) in enumerate(zip(rows, got)):
        m, l_sum, s, w8, o = expect(row)
        n = len(row.acc)
        assert len(out) == max(1, -(-n // keys)), f"row {r}: beats"
        for b in out:                           # the record is equal on every beat
            assert b[:3] == (m, l_sum, s), f"row {r}: (m, l, s) {b[:3]} != {(m, l_sum, s)}"
        hw = np.array([x for b in out for x in b[3]], dtype=np.int64)
        np.testing.assert_array_equal(hw[:n], w8, err_msg=f"row {r}: w8")
        assert not hw[n:].any(), f"row {r}: padding keys not 0"
        # the emitted P8 row and shift give the golden block's o_b through P·V
        o_hw = saturate(pv_p8_out(hw[:n] @ row.v, s), STATE_O.width, STATE_O.signed)
        np.testing.assert_array_equal(o_hw, o, err_msg=f"row {r}: o_b")


def random_rows(rng, count, n_keys, full_range=False):
    """Rows of random accumulators and scales (``full_range``: the layout's whole range, which
    saturates many scores), random masks, some all-masked rows."""
    amax = 1 << (qk_acc_bits(D) - 1)
    out = []
    for i in range(count):
        n = int(rng.integers(1, n_keys + 1)) if i % 3 else n_keys
        if full_range:
            acc = rng.integers(-amax, amax, n)
            sm = rng.integers(0, 1 << SCALE_MANT_BITS)
            se = rng.integers(-(1 << (SCALE_EXP_BITS - 1)), 1 << (SCALE_EXP_BITS - 1))
        else:
            acc = rng.integers(-20000, 20000, n)
            sm = rng.integers(1 << 14, 1 << 16)
            se = rng.integers(-22, -12)
        masked = rng.random(n) < (1.0 if i % 7 == 5 else 0.3)
        out.append(Row(acc, rng.integers(1, 1 << KV_SCALE.width, n),
                       rng.integers(1, 1 << KV_SCALE.width, n), masked,
                       np.full(n, sm), np.full(n, se), rng.integers(-8, 8, (n, D))))
    return out


def extreme_rows(keys):
    """Hand-made rows at the formats' edges."""
    amax = 1 << (qk_acc_bits(D) - 1)
    smax, skmax = (1 << SCALE_MANT_BITS) - 1, KV_SCALE.max_int
    v = np.ones((8, D), dtype=np.int64) * -8
    one = np.ones(8, dtype=np.int64)
    rows = [
        # t saturates at both ends (sh = 1), masked keys at +max
        Row(np.array([amax - 1, -amax, amax - 1, 5, -amax, 0, amax - 1, -1]), one * skmax,
            np.array([skmax, 1, 7, 9, 100, 3, 4, 5]), np.array([0, 0, 1, 0, 0, 0, 1, 0]),
            one * smax, one * 11, v),
        # the one unmasked key at t = −2^31 = M_EMPTY: still a probability of 1
        Row(np.array([-amax, amax - 1, 3, 4, 5, 6, 7, 8]), one * skmax, one * 2000,
            np.array([0, 1, 1, 1, 1, 1, 1, 1]), one * smax, one * 11, v),
        # sh = 62 (e = −128): every score 0, all ties, p = 1 everywhere
        Row(np.arange(8) * 1000 - 3000, one * skmax, one * 4096, np.zeros(8, dtype=bool),
            one * smax, one * -128, v),
        # sv = max at the maximum: w = W_MAX, the largest shift
        Row(np.array([100, 90, 80, 0, -50, 60, 70, 99]), one * 4096,
            np.array([skmax, 1, 2, 3, skmax, 5, 6, 7]), np.zeros(8, dtype=bool),
            one * 40000, one * -14, v),
        # w_max = 16·511 = 8176: s = 5 and the maximum rounds to 256 → saturates at 255
        Row(np.array([0, -2000, -4000, -8000, -16000, -1, -2, -3]), one * 4096,
            np.array([511, 600, 700, 65000, 9000, 10, 20, 30]), np.zeros(8, dtype=bool),
            one * 40000, one * -14, v),
        # tiny sv: w_max < 256, s = 0 (w passes unchanged)
        Row(np.array([10, 5, 0, -5, 3, 2, 1, 0]), one * 4096, np.array([1, 3, 9, 15, 2, 4, 6, 8]),
            np.zeros(8, dtype=bool), one * 40000, one * -14, v),
        # scale_m = 0: qm = 0, every t = 0
        Row(np.array([amax - 1] * 8), one * skmax, one * 77, np.zeros(8, dtype=bool),
            one * 0, one * 11, v),
        # every key masked
        Row(np.arange(8), one, one, np.ones(8, dtype=bool), one * 5, one * 0, v),
    ]
    assert int(v_weight(np.int64(1 << 16), skmax)) == W_MAX
    return rows


def real_rows(rng, block, per_channel=False, n_q=None):
    """Rows of a causal prefill chunk against one real KV block (the diagonal tile and the tile
    before it), S through the packed-array model (``packed_matmul``), expected scores from the
    golden ``tile_scores``. Per-channel K: the query folded per group header (per beat)."""
    if per_channel:
        cache = KVChannelCache(D)
        cache.append(ACT.quantize(rng.normal(0, 1, (2 * block, D)) + rng.normal(0, 1, D)),
                     ACT.quantize(rng.normal(0, 1, (2 * block, D))))
        blocks = cache.blocks(max_block=block)
    else:
        blocks = random_blocks(rng, [block, block], D)
    q, sq = random_query(rng, n_q or 2 * block // 3, D, sigma=2.0)
    # the diagonal tile is block 1; the two rows before it see block 1 wholly masked
    q_pos = np.sort(np.concatenate([[block - 2, block - 1],
                                    rng.integers(block, 2 * block, len(q) - 2)]))
    rows = []
    for blk in blocks:
        t_all = tile_scores(q, sq, blk)
        runs = blk.engine_view() if per_channel else [(None, blk)]
        acc, sm, se = [], [], []
        for hdr, run_ in runs:
            qf, sf = (q, sq) if hdr is None else fold_query(q, sq, hdr)
            acc.append(packed_matmul(qf, run_.k, qk_pack_shift(D), D))
            sm.append(np.repeat(sf[:, :1], len(run_), axis=1))
            se.append(np.repeat(sf[:, 1:], len(run_), axis=1))
        acc, sm, se = (np.concatenate(x, axis=1) for x in (acc, sm, se))
        for r in range(len(q)):
            masked = np.asarray(blk.pos) > q_pos[r]
            rows.append(Row(acc[r], np.asarray(blk.sk), np.asarray(blk.sv), masked, sm[r],
                            se[r], np.asarray(blk.v), t_all[r]))
    return rows


@pytest.mark.parametrize("keys,block", [(1, 8), (2, 16), (4, 24), (4, 32), (8, 32)])
def test_random_rows_backpressure(keys, block):
    rng = np.random.default_rng(10 + keys)
    rows = random_rows(rng, 24, block) + random_rows(rng, 12, block, full_range=True)
    got, tr = run(rows, keys, block, idle=0.3, stall=0.4, seed=keys)
    check(rows, got, keys)
    assert (tr["rows"], tr["err_long"], tr["busy"]) == (len(rows), 0, 0)


def shift_rows():
    """Rows whose maximum weight ``16·sv`` has every bit length 5..20 at both ends of its range
    (every row shift 0..P8_SHIFT_MAX), one row of ``sv = 0``, and rows whose maximum comes from
    a key below the row maximum."""
    v = np.arange(8 * D).reshape(8, D) % 16 - 8
    one = np.ones(8, dtype=np.int64)
    acc = np.array([0, -100, -200, -300, -400, -500, -600, -700])
    rows = []
    for b in range(5, W_MAX.bit_length() + 1):
        for sv0 in (1 << (b - 5), min((1 << (b - 4)) - 1, KV_SCALE.max_int)):
            sv = np.array([sv0, 3, 5, 7, 11, 13, 17, 19])
            rows.append(Row(acc, one * 4096, sv, np.zeros(8, dtype=bool), one * 40000,
                            one * -14, v))
    rows.append(Row(acc, one * 4096, one * 0, np.zeros(8, dtype=bool), one * 40000, one * -14, v))
    rows.append(Row(acc, one * 4096, np.array([1, 9000, 2, 65000, 3, 4, 5, 6]),
                    np.zeros(8, dtype=bool), one * 40000, one * -14, v))
    return rows


def test_every_row_shift():
    rows = shift_rows()
    assert sorted({expect(r)[2] for r in rows}) == list(range(P8_SHIFT_MAX + 1))
    got, _ = run(rows, 4, 8, stall=0.3, seed=4)
    check(rows, got, 4)


def test_extremes():
    rows = extreme_rows(4)
    got, _ = run(rows, 4, 16, idle=0.2, stall=0.3, seed=3)
    check(rows, got, 4)
    m, l_sum, s, w8, _ = expect(rows[1])
    assert m == M_EMPTY and l_sum == 1 << 16          # an unmasked key at the bottom of SCORE
    assert expect(rows[3])[2] == W_MAX.bit_length() - P8.width
    assert expect(rows[4])[2] == 5 and expect(rows[4])[3].max() == P8.max_int
    assert expect(rows[5])[2] == 0
    assert expect(rows[7])[:3] == (M_EMPTY, 0, 0)


@pytest.mark.parametrize("per_channel", [False, True])
def test_real_blocks_diagonal_tile(per_channel):
    """Rows of a causal chunk against two real blocks of 64 keys, per-token K and per-channel K
    (two 32-key groups per block: the folded query scale changes within a row)."""
    rng = np.random.default_rng(20 + per_channel)
    rows = real_rows(rng, 64, per_channel, n_q=24)
    assert any(r.masked.all() for r in rows) and any(r.masked.any() and not r.masked.all()
                                                     for r in rows)
    assert per_channel == any(len(set(r.se)) > 1 or len(set(r.sm)) > 1 for r in rows)
    got, _ = run(rows, 4, 64, idle=0.2, stall=0.3, seed=5)
    check(rows, got, 4)


def test_long_row_counted_and_dropped():
    rng = np.random.default_rng(30)
    keys, block = 2, 8
    rows = random_rows(rng, 3, block)
    long_row = random_rows(rng, 1, 2 * block)[0]
    stim = [beats(rows[0], keys), beats(long_row, keys), beats(rows[1], keys)]
    got, tr = run(rows, keys, block, extra_beats=stim, stall=0.3, seed=1)
    trunc = Row(*(getattr(long_row, f)[:block] for f in
                  ("acc", "sk", "sv", "masked", "sm", "se", "v")))
    check([rows[0], trunc, rows[1]], got, keys)
    assert tr["err_long"] == 1 and tr["rows"] == 3


@pytest.mark.parametrize("keys,block,slots", [(4, 32, 5), (2, 16, 8), (4, 256, 4)])
def test_rate_and_latency(keys, block, slots):
    """A burst of full rows at full rate (``slots · N ≥ 3N + HOLD``; 5 slots is the fewest at
    N = 8): ``i.ready`` never low, one row per ``N`` cycles, and the last output beat
    ``LATENCY + 2N`` cycles after the last input beat."""
    rng = np.random.default_rng(40)
    n_rows = 12 if block < 256 else 3
    rows = [r for r in random_rows(rng, 3 * n_rows, block) if len(r.acc) == block][:n_rows]
    assert len(rows) == n_rows
    got, tr = run(rows, keys, block, slots=slots)
    check(rows, got, keys)
    nbeat = block // keys
    assert slots * nbeat >= 3 * nbeat + TileSoftmax.HOLD
    take = tr["take"]
    assert tr["ready_low"] == 0 and take == list(range(take[0], take[0] + n_rows * nbeat))
    lat = [o - take[(r + 1) * nbeat - 1] for r, o in enumerate(tr["last_out"])]
    assert lat == [TileSoftmax.LATENCY + 2 * nbeat] * n_rows
    assert np.all(np.diff(tr["last_out"]) == nbeat)


@pytest.mark.parametrize("keys,block,slots", [(4, 16, 3), (4, 32, 4)])
def test_rate_with_few_slots(keys, block, slots):
    """Fewer slots than the full rate needs: ``slots`` rows per ``3N + HOLD`` cycles."""
    rng = np.random.default_rng(41)
    rows = [r for r in random_rows(rng, 60, block) if len(r.acc) == block][:12]
    got, tr = run(rows, keys, block, slots=slots)
    check(rows, got, keys)
    nbeat = block // keys
    assert slots * nbeat < 3 * nbeat + TileSoftmax.HOLD
    out = np.array(tr["last_out"])
    np.testing.assert_array_equal(out[slots:] - out[:-slots], 3 * nbeat + TileSoftmax.HOLD)


def test_kr260_block_backpressure():
    """The kr260 shape: 4 keys per beat, blocks of 256 keys, 4 slots; real rows (the diagonal
    tile) and full-range rows under random valid/ready."""
    rng = np.random.default_rng(50)
    rows = real_rows(rng, 256, n_q=6) + random_rows(rng, 4, 256, full_range=True)
    got, tr = run(rows, 4, 256, idle=0.2, stall=0.3, seed=6)
    check(rows, got, 4)
    assert (tr["rows"], tr["err_long"], tr["busy"]) == (len(rows), 0, 0)
