"""amaranth.sim tests of the GEMM engine (job queue, ping-pong activations and tiles, epilogue):
bit-exact against :func:`mcf.golden.gemm.gemm` for every job of a back-to-back sequence,
including rounding ties and saturation of the epilogue and rejected job descriptors."""

from __future__ import annotations

import numpy as np
import pytest
from engine_sim import beats, run_gemm_engine

from mcf.abi.compute import (
    GemmJob,
    gemm_w_stream,
    gemm_w_stripes,
    gemm_x_stream,
)
from mcf.abi.quant import ACT, ACT_FRAC
from mcf.golden.gemm import gemm
from mcf.hdl.compute.gemm import GemmEngine
from mcf.hdl.compute.gemm_shared import SharedGemm
from mcf.quant import QuantWeight, gemm_tile_blob, gemm_x_blob

ROWS, LANES, GROUP = 4, 4, 8


def run_jobs(cases, k_max, m_max, seed=0, stall=False, bad=(), rows=ROWS, lanes=LANES,
             group=GROUP, arrays=1, w_width=None, chain=1, dsp="fabric", shared=False,
             tile_ram="block"):
    """Run ``cases`` (``(xq, x_m, x_e, qw, bias)``) as back-to-back jobs; ``bad`` job
    descriptors are pushed first (they must be rejected). Returns per-case results, status.
    ``shared``: the engine on arrays outside, behind an ArrayShare (:class:`SharedGemm`)."""
    kw = dict(rows=rows, lanes=lanes, group=group, k_max=k_max, m_max=m_max, arrays=arrays,
              w_width=w_width, chain=chain, dsp=dsp, tile_ram=tile_ram)
    dut = SharedGemm(**kw) if shared else GemmEngine(**kw)
    jobs, xb, wb, n_out = job_streams(dut, cases, bad)
    budget = sum(c[0].shape[0] * (c[0].shape[1] // lanes + 30) * (c[3].q.shape[0] // rows)
                 for c in cases)
    vals, status = run_gemm_engine(dut, jobs, xb, wb, n_out, seed=seed, stall=stall,
                            cycles=(len(xb) + len(wb)) * 3 + budget * 3 + 600)
    return job_results(dut, cases, vals, n_out), status


def job_streams(dut, cases, bad=()):
    """The job descriptors (``bad`` first), ``x_in`` and ``w_in`` beats of ``cases`` for the
    engine ``dut``, and each job's count of output beats."""
    rows, lanes, group = dut.rows, dut.lanes, dut.group
    bb = dut.beat // 8
    wbb = dut.w_width // 8
    jobs, xb, wb, n_out = list(bad), [], [], []
    for xq, x_m, x_e, qw, bias in cases:
        m_tok, k = xq.shape
        n = qw.q.shape[0]
        jobs.append(GemmJob.for_shape(m_tok, n, k, qw.e, rows, lanes).pack())
        xb += beats(gemm_x_stream(gemm_x_blob(xq, x_m, x_e, bb), m_tok, k, bb), bb)
        wb += beats(gemm_w_stream(gemm_tile_blob(qw, rows, lanes, bias), k // lanes,
                                  n // rows, rows, lanes, wbb, group), wbb)
        n_out.append(m_tok * n * 4 // bb)
    return jobs, xb, wb, n_out


def job_results(dut, cases, vals, n_out):
    """Each case's ``Y[M, N]`` from the engine's output words ``vals`` (signed 32-bit)."""
    bb, rows = dut.beat // 8, dut.rows
    ys, pos = [], 0
    for (xq, _, _, qw, _), cnt in zip(cases, n_out):
        m_tok, n = xq.shape[0], qw.q.shape[0]
        v = vals[pos:pos + cnt * bb // 4]
        pos += cnt * bb // 4
        # tile-major, token-major inside a tile
        ys.append(v.reshape(n // rows, m_tok, rows).transpose(1, 0, 2).reshape(m_tok, n))
    return ys


def random_case(rng, m_tok, n, k, group=GROUP):
    xq = rng.integers(-128, 128, (m_tok, k))
    x_m = rng.integers(1 << 15, 1 << 16, m_tok)
    x_e = rng.integers(-24, -18, m_tok)
    q = rng.integers(-8, 8, (n, k)).astype(np.int8)
    wm = rng.integers(0, 1 << 16, (n, k // group))
    qw = QuantWeight(q, wm, int(rng.integers(-23, -20)), group)
    bias = rng.integers(-(1 << 20), 1 << 20, n)
    return xq, x_m, x_e, qw, bias


def golden(case, group=GROUP):
    xq, x_m, x_e, qw, bias = case
    return gemm(xq, x_m, x_e, qw.q, qw.m, qw.e, bias, group)


@pytest.mark.parametrize("stall", [False, True])
def test_engine_random(stall):
    rng = np.random.default_rng(11)
    case = random_case(rng, 3, 12, 24)
    (y,), _ = run_jobs([case], k_max=32, m_max=4, seed=5, stall=stall)
    np.testing.assert_array_equal(y, golden(case))


@pytest.mark.parametrize("stall", [False, True])
def test_jobs_back_to_back(stall):
    """Jobs of different M, K, N and weight exponents queue up and run back to back; each is
    bit-exact (activation banks and tile banks alternate across job boundaries)."""
    rng = np.random.default_rng(21)
    shapes = [(3, 8, 24), (4, 12, 32), (1, 4, 8), (2, 16, 16), (4, 8, 32)]
    cases = [random_case(rng, *s) for s in shapes]
    ys, st = run_jobs(cases, k_max=32, m_max=4, seed=7, stall=stall)
    for case, y in zip(cases, ys):
        np.testing.assert_array_equal(y, golden(case))
    assert st["jobs_done"] == len(cases) and st["bad_jobs"] == 0
    assert st["tiles_done"] == sum(c[3].q.shape[0] // ROWS for c in cases)
    assert st["steps"] == sum(c[0].shape[0] * c[0].shape[1] // LANES * c[3].q.shape[0] // ROWS
                              for c in cases)


@pytest.mark.parametrize("tile_ram", ["block", "ultra"])
def test_tile_ram(tile_ram):
    """The tile banks as one memory or as URAM columns and a remainder (``tile_ram``: 4 × 8
    arrays, 128-bit weight words = 72 + 56 bits): jobs back to back, bit-exact either way."""
    rng = np.random.default_rng(23)
    cases = [random_case(rng, *s) for s in [(3, 16, 8), (2, 32, 16), (4, 8, 24)]]
    ys, st = run_jobs(cases, k_max=32, m_max=4, seed=9, stall=True, lanes=8,
                      tile_ram=tile_ram)
    for case, y in zip(cases, ys):
        np.testing.assert_array_equal(y, golden(case))
    assert st["jobs_done"] == len(cases) and st["bad_jobs"] == 0


def test_epilogue_ties_and_saturation():
    """Rounding ties at the epilogue shift (half to even) and ±2^31 saturation, with bias."""
    k = 8
    # x_e chosen so the shift is 1: acc·x_m / 2 — odd products give exact ties
    w_e = -ACT_FRAC
    x_e = np.array([-1, -1, -1 + 0, 20])
    xq = np.zeros((4, k), dtype=np.int64)
    xq[0, 0], xq[1, 0], xq[2, 0], xq[3, :] = 1, 3, -1, 127
    x_m = np.array([1, 1, 3, 0xFFFF])
    q = np.zeros((4, k), dtype=np.int8)
    q[:, 0] = [1, -1, 7, -8]
    q[:, 1:] = 7
    wm = np.array([[1], [1], [1], [0xFFFF]])
    qw = QuantWeight(q, wm, w_e, GROUP)
    bias = np.array([0, 1, ACT.max_int, ACT.min_int])
    case = (xq, x_m, x_e, qw, bias)
    (y,), _ = run_jobs([case], k_max=16, m_max=4)
    want = golden(case)
    np.testing.assert_array_equal(y, want)
    assert ACT.max_int in want and ACT.min_int in want  # saturation exercised both ways


def test_bad_jobs_rejected():
    """Zero or out-of-range job fields are rejected (counted) and the next good job runs."""
    rng = np.random.default_rng(12)
    case = random_case(rng, 2, 4, 16)
    bad = [GemmJob(0, 4, 1, 0).pack(), GemmJob(3, 4, 1, 0).pack(),     # M = 0, M > m_max
           GemmJob(2, 6, 1, 0).pack(), GemmJob(2, 4, 0, 0).pack(),     # K % G, N = 0
           GemmJob(2, 8, 1, 0).pack()]                                 # K > k_max
    (y,), st = run_jobs([case], k_max=16, m_max=2, bad=bad)
    np.testing.assert_array_equal(y, golden(case))
    assert st["bad_jobs"] == len(bad) and st["jobs"] == st["jobs_done"] == 1


SHAPES4 = [(5, 8, 24), (1, 12, 32), (4, 4, 8), (7, 16, 16), (3, 8, 32), (8, 4, 24)]


@pytest.mark.parametrize("arrays,w_width,stall,chain,shared", [
    (4, None, False, 1, False), (4, None, True, 1, False), (4, 2 * LANES * 8, True, 1, False),
    (2, None, True, 1, False), (4, None, True, LANES, False), (4, None, True, 1, True),
    (2, 2 * LANES * 8, True, LANES, True), (1, None, True, 1, True)])
def test_token_parallel_arrays(arrays, w_width, stall, chain, shared):
    """``arrays`` token-parallel arrays sharing the weight word (token t on array t mod
    arrays): bit-exact for M not a multiple of the arrays, M = 1 (decode) and M = m_max, back to
    back, with random source idle cycles and sink backpressure; a wide ``w_in`` (two beats per
    word, scales and bias padded to a whole word) gives the same results; so do the kr260's
    arrays (lane sums in modelled DSP48E2 cascades, ``chain = lanes``). Each array's steps are
    counted (``steps`` = M · k_steps · n_tiles). ``shared``: the same on arrays outside the
    engine, behind an ArrayShare (every array takes every step; the results of tokens past M
    are dropped)."""
    rng = np.random.default_rng(31 + arrays)
    cases = [random_case(rng, *s) for s in SHAPES4]
    ys, st = run_jobs(cases, k_max=32, m_max=8, seed=9, stall=stall, arrays=arrays,
                      w_width=w_width, chain=chain, dsp="fabric" if chain == 1 else "model",
                      shared=shared)
    for case, y in zip(cases, ys):
        np.testing.assert_array_equal(y, golden(case))
    assert st["jobs_done"] == len(cases) and st["bad_jobs"] == 0
    assert st["steps"] == sum(c[0].shape[0] * c[0].shape[1] // LANES * c[3].q.shape[0] // ROWS
                              for c in cases)


def test_token_parallel_rate():
    """Four arrays run a 8-token tile in a quarter of the issue cycles of one array: the same
    job finishes sooner (fed without stalls), with the same results — and in the same cycles
    on arrays shared through an ArrayShare (the client switch costs none)."""
    rng = np.random.default_rng(41)
    case = random_case(rng, 8, 8, 32)
    cycles = {}
    for arrays, shared in ((1, False), (4, False), (4, True)):
        (y,), st = run_jobs([case], k_max=32, m_max=8, arrays=arrays, shared=shared)
        np.testing.assert_array_equal(y, golden(case))
        cycles[arrays, shared] = st["active_cycles"]
    assert cycles[4, False] < cycles[1, False]
    assert cycles[4, True] == cycles[4, False]


@pytest.mark.parametrize("rows,lanes,w_width,stall", [(4, 8, 128, False), (4, 8, 128, True),
                                                      (8, 4, 64, True)])
def test_wide_w_in_padding(rows, lanes, w_width, stall):
    """Two-beat ``w_in`` words. 4 × 8: a word holds two groups' scale words, so an odd number
    of groups leaves the scales half a word short — the padding is dropped and the bias and the
    next tile are still read from the start of a word. 8 × 4: a scale word spans two words,
    the bias four."""
    rng = np.random.default_rng(51)
    group = 2 * lanes
    cases = [random_case(rng, m, n, k, group=group)
             for m, n, k in ((3, 8, group), (5, 16, 3 * group), (1, 8, 2 * group),
                             (6, 8, group))]
    ys, st = run_jobs(cases, k_max=8 * lanes, m_max=8, seed=3, stall=stall, rows=rows,
                      lanes=lanes, group=group, arrays=4, w_width=w_width)
    for case, y in zip(cases, ys):
        np.testing.assert_array_equal(y, golden(case, group=group))
    assert st["jobs_done"] == len(cases)


def test_w_stream_padding_and_stripes():
    """``gemm_w_stream`` pads a tile's scales and bias to whole words only where needed;
    ``gemm_w_stripes`` interleaves back to the stream beat by beat."""
    rng = np.random.default_rng(61)
    for groups, padded in ((2, False), (1, True)):
        case = random_case(rng, 1, 32, 128 * groups, group=128)
        qw, bias = case[3], case[4]
        blob = gemm_tile_blob(qw, 16, 16, bias)
        ws = gemm_w_stream(blob, 8 * groups, 2, 16, 16, 64, 128)
        assert (ws != blob) == padded and len(ws) % 64 == 0
        stripes = gemm_w_stripes(ws, 4, 16)
        again = b"".join(stripes[p][i:i + 16] for i in range(0, len(stripes[0]), 16)
                         for p in range(4))
        assert again == ws
