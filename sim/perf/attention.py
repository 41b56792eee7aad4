"""Attention engine benchmark (paper §5 compute engine): cycles per (query, key, head), the
utilisation of the two multiplier banks, resources.

Cycles come from the cocotb + Verilator simulation of the engine top (head_dim 128, 16 lanes,
up to 6 query heads per KV head, blocks of 256 rows, 64-bit output) through
:mod:`mcf.sim.benches.attention_perf`: per case, jobs back to back at full rate, every output
checked against the golden model, status counters read after each case.

* ``decode_g6`` / ``decode_g2`` — ``jobs`` decode jobs (one query token × G heads, e.g. one per
  KV head and layer) back to back, each over its own ``blocks`` blocks of 256 keys (state output);
* ``prefill_g6`` / ``prefill_g2`` — three query tokens of the last 256-token chunk (at 1/4, 1/2
  and the end of it; causal, ``o/l`` output) over ``blocks`` blocks; work counted per *causally
  visible* pair (masked keys pass at one beat per cycle);
* ``two_phase_g6`` — a MAX (phase 1) and a FIXED (phase 2) job over the same blocks.

**Steady state** (the headline figures): each case's jobs are framed by warm-up and cool-down
jobs (a decode job; a MAX + FIXED pair for ``two_phase``); cycles run from the last warm-up
job's last output beat to the last measured job's last output beat, so that the pipeline is in
the same state at both ends of the window (the QK bank scoring ahead of the PV bank), as in a
stream of jobs. **Whole run** (``whole_*``):
cycles from the first submission to the last output beat over all jobs including warm-up and
cool-down — with the pipeline fill (the first block's scores precede any PV work) and drain.

``qk_bank_utilization`` / ``pv_bank_utilization`` = multiply-accumulates the bank did / (lanes ×
cycles); the QK bank does ``head_dim`` per visible (query, key, head) pair (MAX jobs included),
the PV bank likewise (MAX jobs excluded). Top level: steady state, the lower of the decode and
prefill cases at GQA 6:1; ``decode_cycles_per_qk`` / ``prefill_cycles_per_qk`` are those cases'
steady-state cycles per visible pair. A mismatch, a time-out, a job not completed or a non-zero
error counter (``err_rows``, ``err_max``, ``err_job``) raises
:class:`~mcf.sim.perf.BenchRefused`.

Accuracy of the KV formats (:func:`mcf.golden.kv_accuracy.kv_format_error`, the golden path the
engine matches bit for bit): relative L2 error and cosine of the attention output against float64
attention on unquantised Q/K/V, per-token and per-channel K, on plain keys and on keys with
Qwen2-like outlier channels (a per-channel K bias, 4 of 128 channels × 8);
``kv_rel_error_outliers`` is the per-channel format's error with outliers (three seeds, the
worst).

**Tiled prefill** (``tiled``; the ``sim`` node's PREFILL_TILE path, :mod:`mcf.abi.node_config`
``SIM``: TilePrefill at ``tile_keys`` keys × ``tile_lanes`` channels, ``attn_head_dim``,
``attn_heads`` query heads per KV head, blocks of up to ``attn_block`` keys, query tiles of
:data:`~mcf.abi.attend.ATTEND_TILE_ROWS` rows): the node's executor as the node builds it —
:class:`~mcf.hdl.node.tile_unit.TileUnit` + :class:`~mcf.hdl.node.kv_reader.KvReader` +
:class:`~mcf.hdl.compute.tile_prefill.TilePrefill` — in amaranth.sim on AXI slaves of fixed
latency (:func:`tiled_records`), PREFILL_TILE records back to back, each a chunk of ``tokens``
query tokens ending at its last key, every row written checked against
:func:`mcf.golden.attend_unit.attend_model` byte for byte (a mismatch refuses). Cycles per record
(record taken to ``done``) follow ``record_cycles + row_cycles × rows + Σ over (query tile,
block) pairs max(rows × row_block_cycles, keys × key_cycles, rows × keys × row_key_cycles)``
(rows: ``tokens × heads`` query rows; a pair: the tile's rows against one block): the
per-(row, block) stages (score rows, softmax, merge, one row at a time per block), the KV
reader's beats of the block (``attn_head_dim / attn_lanes`` per key, re-read per query tile)
or the S and P·V products of the tile against the whole block (on the GEMM's arrays:
``2 · head_dim`` MACs per pair, masked pairs of the diagonal block included), whichever is
longest. The five parameters are measured on five records (``fit``): the slope of 4 more
8-key blocks under 64 rows (row-bound) gives ``row_block_cycles``, of 3 more 32-key blocks
under 2 rows (KV-bound) ``key_cycles``, of 3 more 32-key blocks under 64 rows (bound by the
products where they bind, else by the rows: the term then binds only where the row term
does) ``row_key_cycles``, and the single-block records of 64 and 2 rows ``row_cycles`` and
``record_cycles``; the other records (``check``) are predicted by the formula and
``max_abs_error`` is the largest relative difference. ``tiled(cfg=...)`` measures the same
records scaled to another configuration's shape (:func:`tiled_plan`) on its whole
:class:`~mcf.hdl.node.compute.NodeCompute` in Verilator (:func:`tiled_records_rtl`), so that a
node's tiled rate is measured at its own shape (the system model refuses another):
``collect`` adds ``tiled_kr260`` so when the kr260 configuration has the tiled path (full size
only).

**Prefill attention on the arrays** (:func:`prefill_attention`, issue #33; not part of
``collect``: the first run builds the configuration's NodeCompute in Verilator, tens of minutes;
``scripts/measure_prefill_attention.py``): one causal PREFILL_TILE step of a node configuration
(:func:`prefill_shape`: ``tile_max_chunk`` tokens against 4 blocks, the last the diagonal one)
on its NodeCompute in Verilator — with ``tile_on_gemm`` S and P·V on the GEMM's own arrays —,
the DDR three cocotbext-axi RAMs at full rate (:mod:`mcf.sim.tile_records`, the bench
``mcf.sim.benches.tile_prefill_perf``); ``prefill_attention_macs_per_cycle`` = the causally
visible QKᵀ + P·V multiply-accumulates over the record's cycles, against the GEMM's peak
``macs_per_cycle``; every row byte for byte against the golden model.

Resources: :func:`mcf.sim.synth.resources` of the engine (per-token and per-channel K) and of the
K/V quantiser in both formats (estimates; no fmax is claimed).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from . import BenchRefused, refuse_unplanned, resource_table

if TYPE_CHECKING:
    from mcf.abi.node_config import NodeConfig

__all__ = ["collect", "render", "cases", "PARAMS", "tiled", "tiled_records", "tiled_cycles",
           "TILED_FIT", "TILED_CHECK", "tiled_plan", "tiled_records_rtl", "prefill_attention",
           "prefill_shape"]

PARAMS = {"head_dim": 128, "lanes": 16, "max_heads": 6, "max_block": 256, "data_width": 64}
Q_OFFSETS = [PARAMS["max_block"] // 4, PARAMS["max_block"] // 2, PARAMS["max_block"] - 1]


def cases(small: bool) -> list[dict]:
    """The measured cases (``small``: fewer jobs and blocks, same code path)."""
    blocks, jobs = (2, 2) if small else (4, 4)
    out = []
    for heads in (6,) if small else (6, 2):
        out += [
            {"name": f"decode_g{heads}", "kind": "decode", "heads": heads, "blocks": blocks,
             "jobs": jobs},
            {"name": f"prefill_g{heads}", "kind": "prefill", "heads": heads, "blocks": blocks,
             "q_offsets": Q_OFFSETS[1:] if small else Q_OFFSETS},
        ]
    out.append({"name": "two_phase_g6", "kind": "two_phase", "heads": 6, "blocks": blocks})
    return out


def _simulate(case_list: list[dict]) -> dict:
    from mcf.hdl.compute.attention_top import AXIS_NAMES, AttentionTop
    from mcf.hdl.flat import FlatTop
    from mcf.sim import build, run

    built = build(FlatTop(AttentionTop(**PARAMS), AXIS_NAMES), "attention_top", params=PARAMS)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "perf.json"
        try:
            run(built, "mcf.sim.benches.attention_perf", testcase="perf",
                params={**PARAMS, "out": str(out), "cases": case_list})
        except AssertionError as exc:
            raise BenchRefused(f"attention: the measurement did not complete: {exc}") from None
        return json.loads(out.read_text())


def collect(small: bool = False, synth: bool = True) -> dict:
    case_list = cases(small)
    raw = _simulate(case_list)
    lanes, d = PARAMS["lanes"], PARAMS["head_dim"]
    rows = {}
    for case in case_list:
        name = case["name"]
        r = raw.get(name)
        if r is None or r["timed_out"]:
            raise BenchRefused(f"attention {name}: no result (engine stalled)")
        if r["mismatched_jobs"]:
            raise BenchRefused(f"attention {name}: {r['mismatched_jobs']} job(s) differ from "
                               "the golden model")
        refuse_unplanned(f"attention {name}", r["counters"])
        expected_jobs = r["jobs"]
        if r["completed"] != expected_jobs:
            raise BenchRefused(f"attention {name}: {r['completed']} of {expected_jobs} jobs "
                               "completed")
        cycles, steady = r["cycles"], r["steady_cycles"]
        rows[name] = {
            "kind": case["kind"], "heads": case["heads"], "blocks": case["blocks"],
            "jobs": r["measured_jobs"], "steady_cycles": steady,
            "qk_pairs": r["steady_qk_pairs"], "pv_pairs": r["steady_pv_pairs"],
            "cycles_per_qk": round(steady / r["steady_qk_pairs"], 3),
            "qk_bank_utilization": round(r["steady_qk_pairs"] * d / (lanes * steady), 4),
            "pv_bank_utilization": round(r["steady_pv_pairs"] * d / (lanes * steady), 4),
            "whole_cycles": cycles,
            "whole_cycles_per_qk": round(cycles / r["qk_pairs"], 3),
            "whole_qk_bank_utilization": round(r["qk_pairs"] * d / (lanes * cycles), 4),
            "whole_pv_bank_utilization": round(r["pv_pairs"] * d / (lanes * cycles), 4),
        }
    head = ("decode_g6", "prefill_g6")
    result = {
        "decode_cycles_per_qk": rows["decode_g6"]["cycles_per_qk"],
        "prefill_cycles_per_qk": rows["prefill_g6"]["cycles_per_qk"],
        "qk_bank_utilization": min(rows[n]["qk_bank_utilization"] for n in head),
        "pv_bank_utilization": min(rows[n]["pv_bank_utilization"] for n in head),
        "cases": rows,
        "params": PARAMS,
    }
    result["tiled"] = tiled(small)
    from mcf.abi.node_config import NODE_CONFIGS
    kr260 = NODE_CONFIGS["kr260"]
    if kr260.tiled and not small:       # its NodeCompute's Verilator build: ~12 min, not at CI size
        result[f"tiled_{kr260.name}"] = tiled(cfg=kr260)
    result.update(kv_accuracy(seeds=(0,) if small else ACCURACY_SEEDS))
    if synth:
        from mcf.abi.kv_channel import KVFormat
        from mcf.hdl.compute.attention import AttentionEngine
        from mcf.hdl.compute.attention_kvq import KVQuantizer
        from mcf.sim.synth import resources
        per_channel = {"kv_format": KVFormat.PER_CHANNEL_K}
        d, dw = PARAMS["head_dim"], PARAMS["data_width"]
        result["resources"] = {
            "attention_engine": resources(AttentionEngine(**PARAMS), "mcf_attention"),
            "attention_engine_per_channel": resources(
                AttentionEngine(**PARAMS, **per_channel), "mcf_attention_pc"),
            "kv_quantizer": resources(KVQuantizer(d, dw), "mcf_kvq"),
            "kv_quantizer_per_channel": resources(KVQuantizer(d, dw, **per_channel),
                                                  "mcf_kvq_pc"),
        }
    return result


ACCURACY_SEEDS = (0, 1, 2)

TILED_FIT = (("rows64_blocks1", [32], 32), ("rows64_blocks5", [8, 8, 8, 8, 32], 32),
             ("rows2_blocks1", [32], 1), ("rows2_blocks4", [32, 32, 32, 32], 1),
             ("rows64_blocks4", [32, 32, 32, 32], 32))
"""The records the tiled rate is measured on: (name, block sizes in keys, chunk tokens)."""
TILED_CHECK = (("t8_b8", [8], 8), ("t8_b8x4", [8] * 4, 8), ("t16_b32_16", [32, 16], 16),
               ("t8_b32x3_8", [32, 32, 32, 8], 8), ("t16_b16x4", [16] * 4, 16),
               ("t8_b8x8", [8] * 8, 8), ("t32_b32x3", [32] * 3, 32),
               ("t8_b16_16_8_8", [16, 16, 8, 8], 8))
"""Records predicted by the measured formula (``small``: the first two)."""


def tiled_records(records, seed: int = 0) -> list[int]:
    """PREFILL_TILE records on the ``sim`` node's executor (TileUnit + KvReader + TilePrefill at
    :data:`mcf.abi.node_config.SIM`'s sizes) in amaranth.sim: ``records`` = ``(block sizes,
    tokens)``, each a chunk of ``tokens`` query tokens (``attn_heads`` heads) ending at the last
    of its blocks' keys; AXI slaves answer after 4 cycles (B after 2). Returns each record's
    cycles from taken to ``done``; raises :class:`BenchRefused` when a byte written differs
    from :func:`mcf.golden.attend_unit.attend_model`'s rows or a counter from its results."""
    import random

    from amaranth.sim import Simulator

    from mcf.abi.attend import ATTEND_STATUS, ATTEND_TILE_ROWS
    from mcf.abi.node_config import AXI_WIDTH, SIM
    from mcf.sim.amsim import run_records
    from mcf.sim.axi_slave import read_slave, write_slave
    from mcf.sim.tile_records import place_records
    from mcf.sim.tile_top import tile_top

    cfg = SIM
    d, g, mb, bb = cfg.attn_head_dim, cfg.attn_heads, cfg.attn_block, AXI_WIDTH // 8
    try:
        recs = place_records(cfg, records, seed)
    except ValueError as exc:
        raise BenchRefused(f"attention tiled: {exc}") from None
    mem, list_base, args, golden = recs.mem, recs.list_base, recs.args, recs.golden

    ex = tile_top(head_dim=d, max_heads=g, max_block=mb, max_list=cfg.attn_max_list,
                  max_chunk=cfg.tile_max_chunk, rows=ATTEND_TILE_ROWS, keys=cfg.tile_keys,
                  lanes=cfg.tile_lanes, in_lanes=cfg.attn_lanes, kv_format=cfg.kv_format)
    u, kvr = ex.unit, ex.reader
    prng = random.Random(seed)
    wmem: dict[int, int] = {}

    def reader(a):
        return bytes(mem[a:a + bb]).ljust(bb, b"\0")

    sim = Simulator(ex.m)
    sim.add_clock(1e-8)
    for s in (read_slave(u.rd_bus, prng, reader, latency=(4, 4)),
              read_slave(kvr.bus, prng, reader, latency=(4, 4)),
              write_slave(u.wr_bus, prng, wmem, [], b_latency=(2, 2))):
        sim.add_testbench(s, background=True)
    cycles: list[int] = []
    status: dict = {}
    limit = 200_000

    async def host(ctx):
        ctx.set(u.list_base, list_base)
        cycles.extend(await run_records(ctx, u.rec, u.done, args, limit))
        status.update({n: ctx.get(u.status[n]) for n, _ in ATTEND_STATUS})

    sim.add_testbench(host)
    sim.run()
    if max(cycles) >= limit:
        raise BenchRefused("attention tiled: a record never finished")
    if sorted(wmem) != sorted(golden) or any(wmem[a] != v for a, v in golden.items()):
        raise BenchRefused("attention tiled: rows differ from the golden model")
    if status["records"] != len(records) or any(status[k] for k in ("bad_record", "bad_list",
                                                                     "write_errors")):
        raise BenchRefused(f"attention tiled: unplanned counter values {status}")
    return cycles


def tiled_cycles(params: dict, rows: int, pairs) -> float:
    """A PREFILL_TILE record's cycles by the measured formula: ``rows`` query rows, ``pairs`` its
    (query tile, block) pairs as ``(rows of the tile, keys of the block)``."""
    return (params["record_cycles"] + params["row_cycles"] * rows
            + sum(max(r * params["row_block_cycles"], k * params["key_cycles"],
                      r * k * params["row_key_cycles"])
                  for r, k in pairs))


def _tile_pairs(lens, rows):
    from mcf.abi.attend import ATTEND_TILE_ROWS
    return [(min(ATTEND_TILE_ROWS, rows - lo), k) for lo in range(0, rows, ATTEND_TILE_ROWS)
            for k in lens]


def tiled_plan(cfg: NodeConfig, small: bool = False) -> list[tuple[str, list[int], int, str]]:
    """The tiled rate's records at ``cfg``'s shape, ``(name, block sizes, tokens, role)``:
    :data:`TILED_FIT` and :data:`TILED_CHECK` (``small``: its first two), written for the
    ``sim`` node, with their keys scaled by ``cfg.attn_block`` over the sim's and their tokens
    by ``cfg``'s tokens per query tile over the sim's (a tile's tokens: ``ATTEND_TILE_ROWS //
    attn_heads``, at most ``tile_max_chunk``; at least 1 token and 1 key) — at the sim's shape
    the records themselves, under their names; not ``small``: one more ``check`` record, the
    causal prefill step of :func:`prefill_shape` (a whole chunk of ``tile_max_chunk`` tokens,
    many query tiles against 4 blocks: the formula's error where the system model uses it)."""
    from fractions import Fraction

    from mcf.abi.node_config import SIM

    ks = Fraction(cfg.attn_block, SIM.attn_block)
    ts = Fraction(_tile_tokens(cfg), _tile_tokens(SIM))
    same = ks == ts == 1
    out = []
    for recs, role in ((TILED_FIT, "fit"), (TILED_CHECK[:2] if small else TILED_CHECK, "check")):
        for name, lens, n in recs:
            lens2 = [max(1, int(k * ks)) for k in lens]
            n2 = max(1, round(n * ts))
            if not same:
                name = (f"rows{n2 * cfg.attn_heads}_blocks{len(lens2)}" if role == "fit" else
                        f"t{n2}_b{_runs(lens2)}")
            out.append((name, lens2, n2, role))
    if not small:
        lens, n = prefill_shape(cfg)
        out.append((f"step_t{n}_b{_runs(lens)}", lens, n, "check"))
    return out


def _tile_tokens(cfg: NodeConfig) -> int:
    """Tokens whose rows fill a query tile (at most a record's)."""
    from mcf.abi.attend import ATTEND_TILE_ROWS

    return min(ATTEND_TILE_ROWS // cfg.attn_heads, cfg.tile_max_chunk)


def _runs(lens) -> str:
    """Block sizes as runs: ``[256, 256, 64]`` → ``256x2_64``."""
    from itertools import groupby

    return "_".join(f"{k}x{n}" if n > 1 else str(k)
                    for k, n in ((k, len(list(grp))) for k, grp in groupby(lens)))


def tiled(small: bool = False, cfg: NodeConfig | None = None) -> dict:
    """The tiled prefill's measured rate (module docstring): the four parameters, every
    record's cycles and the formula's prediction of the ``check`` records. ``cfg`` ``None``:
    the ``sim`` node's executor in amaranth.sim (:func:`tiled_records`); a configuration with
    the tiled path: its whole NodeCompute in Verilator (:func:`tiled_records_rtl`), the records
    of :func:`tiled_plan` at its shape."""
    from mcf.abi.attend import ATTEND_TILE_ROWS
    from mcf.abi.node_config import SIM

    shape = SIM if cfg is None else cfg
    g = shape.attn_heads
    plan = tiled_plan(shape, small)
    todo = [(lens, n) for _, lens, n, _ in plan]
    c = tiled_records(todo) if cfg is None else tiled_records_rtl(cfg, todo)
    (l0, n0), (l1, _), (l2, n2), (l3, _), (l4, _) = todo[:5]
    r0, r2 = n0 * g, n2 * g
    rb = (c[1] - c[0]) / (r0 * (len(l1) - len(l0)))
    kc = (c[3] - c[2]) / (sum(l3) - sum(l2))
    rk = (c[4] - c[0]) / (r0 * (sum(l4) - sum(l0)))
    p0 = max(r0 * rb, sum(l0) * kc, r0 * sum(l0) * rk)
    p2 = max(r2 * rb, sum(l2) * kc, r2 * sum(l2) * rk)
    row = ((c[0] - p0) - (c[2] - p2)) / (r0 - r2)
    params = {"record_cycles": round(c[0] - p0 - r0 * row, 3),
              "row_cycles": round(row, 3), "row_block_cycles": round(rb, 3),
              "key_cycles": round(kc, 3), "row_key_cycles": round(rk, 5)}
    recs = {}
    for (name, lens, n, role), cyc in zip(plan, c):
        pred = tiled_cycles(params, n * g, _tile_pairs(lens, n * g))
        recs[name] = {"blocks": list(lens), "tokens": n, "rows": n * g, "cycles": cyc,
                      "predicted": round(pred), "error": round((pred - cyc) / cyc, 4),
                      "role": role}
    out = {**params,
           "max_abs_error": max(abs(r["error"]) for r in recs.values()),
           "records": recs,
           "shape": {"config": shape.name, "head_dim": shape.attn_head_dim, "heads": g,
                     "tile_keys": shape.tile_keys, "tile_lanes": shape.tile_lanes,
                     "kv_lanes": shape.attn_lanes, "max_block": shape.attn_block,
                     "tile_rows": ATTEND_TILE_ROWS, "max_chunk": shape.tile_max_chunk}}
    if cfg is not None:
        out["simulator"] = "verilator: NodeCompute"
    return out


def _rtl_records(cfg: NodeConfig, recs, what: str) -> list[dict]:
    """``recs`` (:class:`mcf.sim.tile_records.TileRecords`) on ``cfg``'s NodeCompute in
    Verilator; each record's ``{"cycles", "busy", "timed_out"}``, refused
    (:class:`BenchRefused`) unless every record finished, the bytes written are the golden rows
    exactly, the bench's cycle count agrees with the node's ``cmp_attend_cycles`` counter
    (within a cycle) and the counters show no reject, bad record or error."""
    from mcf.sim.tile_records import rtl_run

    try:
        out = rtl_run(cfg, recs)
    except AssertionError as exc:
        raise BenchRefused(f"{what}: the simulation failed: {str(exc).splitlines()[0]}") from None
    done = out["records"]
    if len(done) != len(recs.args) or any(r["timed_out"] for r in done):
        raise BenchRefused(f"{what}: a record never finished ({len(done)} of "
                           f"{len(recs.args)} run)")
    if out["mismatch"]:
        raise BenchRefused(f"{what}: rows differ from the golden model: {out['mismatch']}")
    for r in done:
        if abs(r["busy"] - r["cycles"]) > 1:
            raise BenchRefused(f"{what}: {r['cycles']} cycles counted, the node's attend_cycles "
                               f"counter says {r['busy']}")
    refuse_unplanned(f"{what} att_status", out["att_status"],
                     {"records": len(recs.args), "blocks": recs.blocks})
    kvr = out["kvr_status"]
    refuse_unplanned(f"{what} kvr_status", {k: kvr[k] for k in ("blocks", "rejects",
                                                                "bus_errors")},
                     {"blocks": recs.blocks})
    return done


def tiled_records_rtl(cfg: NodeConfig, records, seed: int = 0) -> list[int]:
    """:func:`tiled_records` on ``cfg``'s whole compute half (NodeCompute, Verilator; the DDR
    a cocotbext-axi RAM at full rate): each record's cycles from taken to ``done``, every row
    checked byte for byte (:func:`_rtl_records`)."""
    from mcf.sim.tile_records import place_records

    try:
        recs = place_records(cfg, records, seed)
    except ValueError as exc:
        raise BenchRefused(f"attention tiled ({cfg.name}): {exc}") from None
    return [r["cycles"] for r in _rtl_records(cfg, recs, f"attention tiled ({cfg.name})")]


def prefill_shape(cfg: NodeConfig, small: bool = False) -> tuple[list[int], int]:
    """The causal prefill step :func:`prefill_attention` measures, ``(block sizes, tokens)``: a
    chunk of ``tile_max_chunk`` tokens (one PREFILL_TILE record's most) against 4 whole blocks
    (at the kr260 shape 256 tokens against 1,024 keys); ``small``: 16 tokens (at most
    ``tile_max_chunk``) against 2 blocks. The chunk ends at the last key: the last block is the
    diagonal one."""
    if small:
        return [cfg.attn_block] * 2, min(16, cfg.tile_max_chunk)
    return [cfg.attn_block] * 4, cfg.tile_max_chunk


def prefill_attention(cfg: NodeConfig, small: bool = False, *, seed: int = 0) -> dict:
    """Prefill attention on ``cfg``'s tiled path, measured in RTL: one ATTEND PREFILL_TILE
    record of :func:`prefill_shape` (``attn_heads`` query heads of one KV head, the chunk's
    rows against every block, softmax, merges, block switches and the rows' writes) on the
    Verilator build of ``cfg``'s whole NodeCompute — with ``tile_on_gemm`` its S and P·V on
    the GEMM's own arrays through their share.

    ``prefill_attention_macs_per_cycle`` = ``macs`` / ``cycles``: ``macs`` the QKᵀ + P·V
    multiply-accumulates of the causally visible (row, key) pairs (``2 · head_dim`` each; the
    masked ones of the diagonal block not counted), counted from the causal mask
    (:func:`mcf.sim.tile_records.causal_macs`) and checked against the golden tiled schedule's
    count; ``cycles`` from the edge the record is taken to ``attend_done`` (the node's own
    ``cmp_attend_cycles`` agrees). ``macs_per_cycle_peak`` = ``cfg.macs_per_cycle`` (the
    GEMM's arrays), ``utilization`` their ratio; ``scheduled_macs`` counts every pair of the
    (query tile, block) pairs run, masked ones included. Every row is checked byte for byte
    against :func:`mcf.golden.attend_unit.attend_model` (a difference, a record not done or an
    unplanned counter refuses: :class:`BenchRefused`). ``build_seconds`` / ``run_seconds``: the
    host's wall time (the build's cache check or build, the run), not figures."""
    import time

    from mcf.abi.attend import ATTEND_TILE_ROWS
    from mcf.sim.tile_records import causal_macs, place_records, rtl_build, schedule_macs

    what = f"prefill attention ({cfg.name})"
    lens, tokens = prefill_shape(cfg, small)
    g, d = cfg.attn_heads, cfg.attn_head_dim
    try:
        recs = place_records(cfg, [(lens, tokens)], seed)
    except ValueError as exc:
        raise BenchRefused(f"{what}: {exc}") from None
    macs = causal_macs(lens, tokens, g, d)
    if macs != schedule_macs(lens, tokens, g, d, ATTEND_TILE_ROWS):
        raise BenchRefused(f"{what}: the causal MAC count differs from the tiled schedule's")
    t0 = time.monotonic()
    rtl_build(cfg)                              # cached; timed apart from the run
    t1 = time.monotonic()
    rec = _rtl_records(cfg, recs, what)[0]
    cycles = rec["cycles"]
    peak = cfg.macs_per_cycle
    return {"prefill_attention_macs_per_cycle": round(macs / cycles, 3),
            "macs_per_cycle_peak": peak, "utilization": round(macs / cycles / peak, 4),
            "cycles": cycles, "macs": macs,
            "scheduled_macs": _scheduled_pairs(lens, tokens, g) * 2 * d,
            "rows": tokens * g, "tokens": tokens, "keys": sum(lens),
            "blocks_requested": recs.blocks, "build_seconds": round(t1 - t0, 1),
            "run_seconds": round(time.monotonic() - t1, 1),
            "shape": {"config": cfg.name, "head_dim": d, "heads": g, "blocks": lens,
                      "tile_keys": cfg.tile_keys, "tile_lanes": cfg.tile_lanes,
                      "kv_lanes": cfg.attn_lanes, "max_block": cfg.attn_block,
                      "tile_rows": ATTEND_TILE_ROWS, "max_chunk": cfg.tile_max_chunk,
                      "query_words": cfg.tile_query_words, "tile_on_gemm": cfg.tile_on_gemm,
                      "attn_on_arrays": cfg.attn_on_arrays, "gemm_arrays": cfg.gemm_arrays,
                      "gemm_rows": cfg.gemm_rows, "gemm_lanes": cfg.gemm_lanes}}


def _scheduled_pairs(lens, tokens: int, heads: int) -> int:
    """(row, key) pairs of the (query tile, block) pairs the tiled schedule runs, masked ones
    included."""
    import numpy as np

    from mcf.abi.attend import ATTEND_TILE_ROWS
    from mcf.golden.attention_tiled import tile_schedule
    from mcf.sim.tile_records import block_positions

    keys = sum(lens)
    q_pos = np.repeat(np.arange(keys - tokens, keys), heads)
    return sum(v.size for *_, v in tile_schedule(q_pos, block_positions(lens), ATTEND_TILE_ROWS))


def kv_accuracy(seeds=ACCURACY_SEEDS) -> dict:
    """Attention-output error of both KV formats against float64, worst over ``seeds``."""
    from mcf.abi.kv_channel import KVFormat
    from mcf.golden.kv_accuracy import kv_format_error

    table = {}
    for fmt in KVFormat:
        for outliers in (False, True):
            runs = [kv_format_error(fmt, outliers, seed) for seed in seeds]
            table[f"{fmt.name.lower()}/{'outliers' if outliers else 'plain'}"] = {
                "rel_l2": round(max(r["rel_l2"] for r in runs), 4),
                "cosine": round(min(r["cosine"] for r in runs), 4)}
    return {"kv_accuracy": table, "kv_accuracy_seeds": list(seeds),
            "kv_rel_error_outliers": table["per_channel_k/outliers"]["rel_l2"],
            "kv_rel_error_outliers_per_token": table["per_token/outliers"]["rel_l2"]}


def render(result: dict) -> str:
    lines = [f"attention engine {result['params']} (cocotb + Verilator cycles, full rate, "
             "outputs bit-exact with the golden model)",
             "steady state (warm-up / cool-down jobs around the window) | whole run",
             f"{'case':<14} {'jobs':>4} {'blocks':>6} {'cycles':>9} {'cyc/(q,k,h)':>11} "
             f"{'QK bank':>8} {'PV bank':>8} | {'cycles':>9} {'cyc/(q,k,h)':>11} "
             f"{'QK bank':>8} {'PV bank':>8}"]
    for name, r in result["cases"].items():
        lines.append(f"{name:<14} {r['jobs']:>4} {r['blocks']:>6} {r['steady_cycles']:>9} "
                     f"{r['cycles_per_qk']:>11.2f} {r['qk_bank_utilization']:>8.1%} "
                     f"{r['pv_bank_utilization']:>8.1%} | {r['whole_cycles']:>9} "
                     f"{r['whole_cycles_per_qk']:>11.2f} {r['whole_qk_bank_utilization']:>8.1%} "
                     f"{r['whole_pv_bank_utilization']:>8.1%}")
    lines.append(f"steady state: decode {result['decode_cycles_per_qk']:.2f}, prefill "
                 f"{result['prefill_cycles_per_qk']:.2f} cycles per (query, key, head); bank "
                 f"utilisation QK {result['qk_bank_utilization']:.1%}, PV "
                 f"{result['pv_bank_utilization']:.1%}")
    for key in [k for k in result if k == "tiled" or k.startswith("tiled_")]:
        t = result[key]
        recs = t["records"].values()
        check = [r for r in recs if r["role"] == "check"]
        where = t.get("simulator", "TileUnit + KvReader + TilePrefill, amaranth.sim")
        lines.append(f"tiled prefill ({t['shape']['config']} node: {where}, rows bit-exact): "
                     f"cycles per PREFILL_TILE "
                     f"record = {t['record_cycles']:.0f} + {t['row_cycles']:.2f} x rows + sum "
                     f"over (tile, block) max({t['row_block_cycles']:.2f} x rows, "
                     f"{t['key_cycles']:.2f} x keys, {t['row_key_cycles']:.4f} x rows x keys)")
        lines.append(f"  fitted on {len(recs) - len(check)} records; {len(check)} more "
                     f"({min(r['cycles'] for r in check)}..{max(r['cycles'] for r in check)} "
                     f"cycles) predicted within {t['max_abs_error']:.1%}")
    lines.append(f"KV formats, attention output vs float64 (worst of seeds "
                 f"{result['kv_accuracy_seeds']}):")
    lines += [f"  {name:<26} rel. L2 {r['rel_l2']:.3f}  cosine {r['cosine']:.3f}"
              for name, r in result["kv_accuracy"].items()]
    if result.get("resources"):
        lines += resource_table(result["resources"], "resources")
    return "\n".join(lines)
