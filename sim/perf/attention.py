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

Resources: :func:`mcf.sim.synth.resources` of the engine (per-token and per-channel K) and of the
K/V quantiser in both formats (estimates; no fmax is claimed).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from . import BenchRefused, refuse_unplanned, resource_table

__all__ = ["collect", "render", "cases", "PARAMS"]

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
    result.update(kv_accuracy(seeds=(0,) if small else ACCURACY_SEEDS))
    if synth:
        from mcf.abi.kv import KVFormat
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


def kv_accuracy(seeds=ACCURACY_SEEDS) -> dict:
    """Attention-output error of both KV formats against float64, worst over ``seeds``."""
    from mcf.abi.kv import KVFormat
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
    lines.append(f"KV formats, attention output vs float64 (worst of seeds "
                 f"{result['kv_accuracy_seeds']}):")
    lines += [f"  {name:<26} rel. L2 {r['rel_l2']:.3f}  cosine {r['cosine']:.3f}"
              for name, r in result["kv_accuracy"].items()]
    if result.get("resources"):
        lines += resource_table(result["resources"], "resources")
    return "\n".join(lines)
