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
block) pairs max(rows × row_block_cycles, keys × key_cycles)`` (rows: ``tokens × heads`` query
rows; a pair: the tile's rows against one block): the per-(row, block) stages (score rows,
softmax, merge, one row at a time per block) or the KV reader's beats of the block
(``attn_head_dim / attn_lanes`` per key, re-read per query tile), whichever is longer. The four
parameters are measured on four records (``fit``): the slope of 4 more 8-key blocks under 64
rows (row-bound) gives ``row_block_cycles``, of 3 more 32-key blocks under 2 rows (KV-bound)
``key_cycles``, and the single-block records of 64 and 2 rows ``row_cycles`` and
``record_cycles``; the other records (``check``) are predicted by the formula and
``max_abs_error`` is the largest relative difference.

Resources: :func:`mcf.sim.synth.resources` of the engine (per-token and per-channel K) and of the
K/V quantiser in both formats (estimates; no fmax is claimed).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from . import BenchRefused, refuse_unplanned, resource_table

__all__ = ["collect", "render", "cases", "PARAMS", "tiled", "tiled_records", "tiled_cycles",
           "TILED_FIT", "TILED_CHECK"]

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
             ("rows2_blocks1", [32], 1), ("rows2_blocks4", [32, 32, 32, 32], 1))
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

    import numpy as np
    from amaranth.sim import Simulator

    from mcf.abi.attend import (
        ATT_ENTRY_BYTES,
        ATTEND_STATUS,
        ATTEND_TILE_ROWS,
        AttendArg,
        AttendBlock,
        AttendHeader,
        AttendMode,
        AttendSoftmax,
        attend_list_bytes,
        prefill_out_bytes,
        prefill_query_address,
    )
    from mcf.abi.kv import pack_kv_block
    from mcf.abi.node_config import AXI_WIDTH, SIM
    from mcf.abi.query import pack_query
    from mcf.golden.attend_unit import attend_model
    from mcf.golden.attention import random_blocks, random_query
    from mcf.sim.amsim import run_records
    from mcf.sim.axi_slave import read_slave, write_slave
    from mcf.sim.tile_top import tile_top

    cfg = SIM
    d, g, mb, bb = cfg.attn_head_dim, cfg.attn_heads, cfg.attn_block, AXI_WIDTH // 8
    rng = np.random.default_rng(seed)
    mem = bytearray(1 << 20)
    top = [0x1000]

    def alloc(n):
        a = -(-top[0] // 64) * 64
        top[0] = a + n
        return a

    lists, args = [], []
    for lens, n in records:
        ents = []
        for blk in random_blocks(rng, lens, d):
            raw = pack_kv_block(blk.k, blk.sk, blk.v, blk.sv)
            a = alloc(len(raw))
            mem[a:a + len(raw)] = raw
            ents.append(AttendBlock(a, len(blk), int(blk.pos[0])))
        q, sq = random_query(rng, n * g, d, sigma=1.5)
        q_addr = alloc(prefill_query_address(0, n, g, d))
        for i in range(n):
            raw = pack_query(q[i * g:(i + 1) * g], sq[i * g:(i + 1) * g], sum(lens) - n + i, 0)
            a = prefill_query_address(q_addr, i, g, d)
            mem[a:a + len(raw)] = raw
        stride = prefill_out_bytes(g, d)
        lists.append((attend_list_bytes(AttendHeader(q_addr, alloc(n * stride), n, stride),
                                        ents), len(ents)))
    list_base = alloc(sum(len(raw) for raw, _ in lists))
    at = 0
    for raw, nb in lists:
        mem[list_base + at:list_base + at + len(raw)] = raw
        args.append(AttendArg(at // ATT_ENTRY_BYTES, nb, AttendMode.PREFILL_TILE.value, g,
                              AttendSoftmax.SINGLE).pack())
        at += len(raw)
    assert top[0] <= len(mem)
    golden = {}
    for a in args:
        res = attend_model(a, list_base, lambda x, k: bytes(mem[x:x + k]), d, g, mb,
                           cfg.attn_max_list, max_chunk=cfg.tile_max_chunk)
        if res.bad:
            raise BenchRefused(f"attention tiled: the golden model refuses a record ({res.bad})")
        for addr, raw in res.writes:
            golden.update({addr + i: v for i, v in enumerate(raw)})

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
            + sum(max(r * params["row_block_cycles"], k * params["key_cycles"])
                  for r, k in pairs))


def _tile_pairs(lens, rows):
    from mcf.abi.attend import ATTEND_TILE_ROWS
    return [(min(ATTEND_TILE_ROWS, rows - lo), k) for lo in range(0, rows, ATTEND_TILE_ROWS)
            for k in lens]


def tiled(small: bool = False) -> dict:
    """The tiled prefill's measured rate (module docstring): the four parameters, every
    record's cycles and the formula's prediction of the ``check`` records."""
    from mcf.abi.attend import ATTEND_TILE_ROWS
    from mcf.abi.node_config import SIM

    g = SIM.attn_heads
    check = TILED_CHECK[:2] if small else TILED_CHECK
    measured = tiled_records([(lens, n) for _, lens, n in TILED_FIT + check])
    c = dict(zip([name for name, _, _ in TILED_FIT + check], measured))
    (_, l0, n0), (_, l1, _), (_, l2, n2), (_, l3, _) = TILED_FIT
    r0, r2 = n0 * g, n2 * g
    rb = (c["rows64_blocks5"] - c["rows64_blocks1"]) / (r0 * (len(l1) - len(l0)))
    kc = (c["rows2_blocks4"] - c["rows2_blocks1"]) / (sum(l3) - sum(l2))
    p0, p2 = max(r0 * rb, sum(l0) * kc), max(r2 * rb, sum(l2) * kc)
    row = ((c["rows64_blocks1"] - p0) - (c["rows2_blocks1"] - p2)) / (r0 - r2)
    params = {"record_cycles": round(c["rows64_blocks1"] - p0 - r0 * row, 3),
              "row_cycles": round(row, 3), "row_block_cycles": round(rb, 3),
              "key_cycles": round(kc, 3)}
    recs, fit = {}, {name for name, _, _ in TILED_FIT}
    for name, lens, n in TILED_FIT + check:
        pred = tiled_cycles(params, n * g, _tile_pairs(lens, n * g))
        recs[name] = {"blocks": list(lens), "tokens": n, "rows": n * g, "cycles": c[name],
                      "predicted": round(pred), "error": round((pred - c[name]) / c[name], 4),
                      "role": "fit" if name in fit else "check"}
    return {**params,
            "max_abs_error": max(abs(r["error"]) for r in recs.values()),
            "records": recs,
            "shape": {"config": SIM.name, "head_dim": SIM.attn_head_dim, "heads": g,
                      "tile_keys": SIM.tile_keys, "tile_lanes": SIM.tile_lanes,
                      "kv_lanes": SIM.attn_lanes, "max_block": SIM.attn_block,
                      "tile_rows": ATTEND_TILE_ROWS, "max_chunk": SIM.tile_max_chunk}}


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
    t = result.get("tiled")
    if t:
        recs = t["records"].values()
        check = [r for r in recs if r["role"] == "check"]
        lines.append(f"tiled prefill ({t['shape']['config']} node: TileUnit + KvReader + "
                     "TilePrefill, amaranth.sim, rows bit-exact): cycles per PREFILL_TILE "
                     f"record = {t['record_cycles']:.0f} + {t['row_cycles']:.2f} x rows + sum "
                     f"over (tile, block) max({t['row_block_cycles']:.2f} x rows, "
                     f"{t['key_cycles']:.2f} x keys)")
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
