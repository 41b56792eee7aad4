"""The system model's tiled prefill (``mcf.sysmodel``; docs/system-model.md): the PREFILL_TILE
work a step's records do (against the golden tile schedule and the node program's read sets),
the tiled executor's measured rate (``attention.json`` ``tiled``) priced per record by hand, the
``sim`` node's prefill ATTEND tiled and its decode and the kr260 node's unchanged, and the
refusals of a missing or mismatched measurement."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace

import numpy as np
import pytest

from mcf.abi.attend import ATTEND_TILE_ROWS
from mcf.abi.kv import kv_token_bytes
from mcf.abi.node_config import KR260, KR260_ENGINE, SIM
from mcf.golden.attention_tiled import tile_schedule
from mcf.mars import get_model
from mcf.mars.plan import tiny_plan
from mcf.node.layer import read_set, slice_positions
from mcf.sim.perf.attention import tiled_cycles
from mcf.sysmodel.calibration import CalibrationError, load_figures, results_dirs
from mcf.sysmodel.rates import NodeRates
from mcf.sysmodel.system import SystemSpec, simulate_plan
from mcf.sysmodel.work import NodeWork, key_pieces, node_work, tile_pairs

DOCS = results_dirs()[1]


@pytest.fixture(scope="module")
def fig():
    return load_figures()


@pytest.fixture(scope="module")
def tiny():
    return get_model("tiny")


@dataclass
class _Block:
    pos: np.ndarray

    def __len__(self):
        return len(self.pos)


def test_tile_pairs_follow_the_golden_tile_schedule():
    """tile_pairs = the (rows, keys) of tile_schedule's pairs (the order TileUnit issues), for
    chunks whose rows fill several query tiles and skip blocks, at GQA 1, 2, 6."""
    rng = np.random.default_rng(7)
    for _ in range(40):
        lens = [int(x) for x in rng.integers(1, 33, size=int(rng.integers(1, 7)))]
        starts = np.cumsum([0] + lens[:-1])
        heads = int(rng.choice([1, 2, 6]))
        keys = sum(lens)
        n = int(rng.integers(1, min(keys, 32) + 1))
        p0 = keys - n
        pieces = [(int(a), ln) for a, ln in zip(starts, lens)]
        blocks = [_Block(np.arange(a, a + ln)) for a, ln in pieces if a <= keys - 1]
        q_pos = np.repeat(np.arange(p0, p0 + n), heads)
        want = tuple((len(r), len(blocks[b]))
                     for _, b, r, _ in tile_schedule(q_pos, blocks, ATTEND_TILE_ROWS))
        assert tile_pairs(p0, n, heads, pieces) == want


def test_node_work_counts_one_tile_record_per_slice_and_kv_head(tiny):
    """The node program at N = 4, chunk 32 (8-token slices, one PREFILL_TILE record per KV
    head): records, rows and one pair per block of its read set; without ``tile_chunk`` none."""
    p = tiny_plan(4, 64, 32)
    g = tiny.q_heads // tiny.kv_heads
    for c in (1, 2):
        for n in range(4):
            w = node_work(tiny, p, c, n, "node-program", tile_chunk=SIM.tile_max_chunk)
            p0, m = slice_positions(p, c, n)
            reads = read_set(p, c, n)
            assert (w.tile_records, w.tile_rows) == (tiny.kv_heads, tiny.kv_heads * m * g)
            assert w.tile_pairs == tuple((m * g, slice_positions(p, b, s)[1])
                                         for b, s in reads) * tiny.kv_heads
            assert len(key_pieces(p, c, "node-program")) == 4 * c
            base = node_work(tiny, p, c, n, "node-program")
            assert base.tile_records == 0 and base.tile_pairs == ()
            assert replace(w, tile_records=0, tile_rows=0, tile_pairs=()) == base
    # records of at most tile_chunk tokens: an 8-token slice in records of 4 tokens
    w = node_work(tiny, p, 2, 1, "node-program", tile_chunk=4)
    assert w.tile_records == 2 * tiny.kv_heads


def test_tiled_rate_by_hand(fig, tiny):
    """The sim node's rates carry attention.json's tiled figures measured at its shape; a
    record is priced record + rows + Σ max(rows x per (row, block), keys x per key, rows x
    keys x per (row, key)), a block longer than attn_block as blocks of it (the ``plan``
    layout)."""
    (t,) = [e for e in fig.attention_tiled if e["entry"] == "tiled"]
    assert t["shape"]["config"] == "sim"
    r = NodeRates.calibrated(fig, "sim", tiny)
    assert r.tile_chunk == SIM.tile_max_chunk and r.tile_block == SIM.attn_block
    assert (r.tile_record_cycles, r.tile_row_cycles, r.tile_row_block_cycles,
            r.tile_key_cycles, r.tile_row_key_cycles) == (
        t["record_cycles"], t["row_cycles"], t["row_block_cycles"], t["key_cycles"],
        t["row_key_cycles"])
    w = NodeWork(8, 0, 0, 0, 0, 2, 0, 0, 0, tile_records=2, tile_rows=32,
                 tile_pairs=((16, 8), (16, 32), (16, 40)))
    rb, kc, rk = t["row_block_cycles"], t["key_cycles"], t["row_key_cycles"]
    pair = [max(16 * rb, k * kc, 16 * k * rk) for k in (8, 32, 32, 8)]
    want = 2 * t["record_cycles"] + 32 * t["row_cycles"] + sum(pair)
    assert r.attend(w) == pytest.approx(want)
    # the bench's own formula, on a record it measured, is the same pricing
    rec = t["records"]["t8_b8x4"]
    one = NodeWork(8, 0, 0, 0, 0, 2, 0, 0, 0, tile_records=1, tile_rows=rec["rows"],
                   tile_pairs=tuple((rec["rows"], k) for k in rec["blocks"]))
    assert r.attend(one) == pytest.approx(tiled_cycles(t, rec["rows"], one.tile_pairs))
    assert abs(r.attend(one) - rec["cycles"]) / rec["cycles"] <= t["max_abs_error"] < 0.15


def test_prefill_tiled_decode_not(fig, tiny):
    """The sim node's prefill steps are priced tiled (JOBs and EMIT unchanged, ATTEND lower
    than per-token records); ``tile_chunk=0`` gives the per-token pricing back; a decode
    token's ATTEND (no tile work) is the per-token engine's either way; kr260's records are
    up to its ``tile_max_chunk``, the vector-engine node it replaced has none."""
    p = tiny_plan(4, 64, 32)
    spec = SystemSpec(layout="node-program", ethernet=False)
    tiled = simulate_plan(p, fig, spec)
    flat = simulate_plan(p, fig, replace(spec, tile_chunk=0))
    assert tiled.rates.tile_chunk == SIM.tile_max_chunk and flat.rates.tile_chunk == 0
    for st, sf in zip(tiled.steps, flat.steps):
        for ot, of in zip(st.ops, sf.ops):
            assert (ot[0], ot[1], ot[3]) == (of[0], of[1], of[3]) and 0 < ot[2] < of[2]
    dec = NodeWork(1, 0, 0, 0, 0, tiny.kv_heads, 64 * tiny.q_heads,
                   64 * tiny.kv_heads * kv_token_bytes(tiny.head_dim), 0)
    assert tiled.rates.attend(dec) == flat.rates.attend(dec) > 0
    qwen = get_model("qwen2.5-1.5b")
    k = NodeRates.calibrated(fig, "kr260", qwen)
    assert KR260.tiled and k.tile_chunk == KR260.tile_max_chunk
    with pytest.raises(ValueError, match="no PREFILL_TILE"):
        NodeRates.calibrated(fig, "kr260", qwen, tile_chunk=2 * KR260.tile_max_chunk)
    engine = KR260_ENGINE
    assert NodeRates.calibrated(fig, engine, qwen).tile_chunk == 0
    with pytest.raises(ValueError, match="no PREFILL_TILE"):
        NodeRates.calibrated(fig, engine, qwen, tile_chunk=32)


def test_a_missing_or_mismatched_tiled_rate_is_refused(tmp_path, tiny):
    d = tmp_path / "results"
    shutil.copytree(DOCS, d)
    att = json.loads((d / "attention.json").read_text())
    t = att.pop("tiled")
    for key in [k for k in att if k.startswith("tiled_")]:
        del att[key]
    (d / "attention.json").write_text(json.dumps(att))
    fig = load_figures([d])
    assert fig.attention_tiled == ()
    with pytest.raises(CalibrationError, match="no tiled prefill rate"):
        NodeRates.calibrated(fig, "sim", tiny)
    assert NodeRates.calibrated(fig, "sim", tiny, tile_chunk=0).tile_chunk == 0
    qwen = get_model("qwen2.5-1.5b")
    with pytest.raises(CalibrationError, match="no tiled prefill rate"):
        NodeRates.calibrated(fig, "kr260", qwen)
    assert NodeRates.calibrated(fig, "kr260", qwen, tile_chunk=0).tile_chunk == 0
    att["tiled"] = t | {"shape": t["shape"] | {"tile_lanes": 16}}
    (d / "attention.json").write_text(json.dumps(att))
    with pytest.raises(CalibrationError, match="measured at"):
        NodeRates.calibrated(load_figures([d]), "sim", tiny)
