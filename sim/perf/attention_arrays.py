"""The attention engine on the GEMM's arrays (issue #33; paper §5 compute engine; docs/attention.md
"The engine on the arrays"): cycles per (query, key, head) of
:class:`~mcf.hdl.compute.array_engine.ArrayEngine` — every non-tiled ATTEND (DECODE, PREFILL,
MAX, FIXED) of a node with ``NodeConfig.attn_on_arrays`` — at a node configuration's shape, for
the system model (:mod:`mcf.sysmodel.rates`), which prices such a node's ATTEND pairs with these
figures instead of the vector engine's (:mod:`.attention`).

The engine is built as the node builds it (:class:`mcf.hdl.node.compute.ComputeUnit`,
:class:`~mcf.hdl.compute.tile_prefill.TilePrefill` ``engine_width``): ``head_dim`` =
``attn_head_dim``, K/V and query beats of ``attn_lanes`` channels, up to ``attn_heads`` query
heads per KV head, blocks of up to ``attn_block`` keys, ``tile_keys`` keys per score beat of
``tile_lanes`` channels, on ``gemm_arrays`` arrays of ``gemm_rows`` rows with the GEMM's lane
chains (``gemm_chain``; DSP48E2 slices as their register-for-register model, ``dsp="model"``,
when the node instantiates the primitive), payload words of
:data:`~mcf.abi.node_config.PACKET_WIDTH` bits. Unlike the node it has arrays of its own (no
GEMM work to take turns with) and its chain's tiles are ``attn_heads`` rows (the node's chain is
TilePrefill's, tiles of :data:`~mcf.abi.attend.ATTEND_TILE_ROWS` rows); the rate is the chain's
either way, one query tile (the job's heads) at a time.

It runs in amaranth.sim (:func:`mcf.sim.attention_drive.drive_engine`), jobs back to back at full
rate (no idle, no backpressure), each case its own run:

* ``decode_g6`` / ``decode_g2`` — ``jobs`` decode jobs (one query token × G heads, state output)
  back to back, each over its own ``blocks`` blocks of ``attn_block`` keys;
* ``prefill_g6`` / ``prefill_g2`` — query tokens at 1/4, 1/2 and the end of the last block
  (causal, ``o/l`` output) over ``blocks`` blocks; work counted per *causally visible* pair.

``small`` (CI): the first group's two cases, one measured job over one block of
``attn_block / 8`` keys each (a sanity run of the same path; its figures are not the
steady state of full blocks).

**Steady state** (the headline figures), as :mod:`.attention` measures the vector engine: each
case's jobs are framed by a warm-up and a cool-down decode job over ``blocks`` blocks; cycles run
from the warm-up job's last output beat to the last measured job's last output beat, so both ends
of the window see the same full pipeline. ``decode_cycles_per_qk`` / ``prefill_cycles_per_qk``
are the first group's steady cycles per visible pair (GQA 6:1; a configuration with fewer query
heads per KV head: its own). **Whole run** (``whole_*``): from the first cycle to the cool-down
job's last beat. ``macs_per_cycle`` counts QKᵀ and P·V multiply-accumulates (``head_dim`` each
per visible pair) per steady cycle; ``array_utilization`` is that over the arrays' peak
(``arrays × rows × lanes``).

Every output word is checked against the golden model
(:func:`~mcf.sim.attention_jobs.expected_words`); a mismatch, a payload boundary
elsewhere, a run that does not finish, a job not completed or a non-zero error counter
(``err_rows``, ``err_max``, ``err_job``) raises :class:`~mcf.sim.perf.BenchRefused`.

    python -m mcf.sim.perf.attention_arrays [--small] [--config kr260] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mcf.abi.node_config import PACKET_WIDTH, NodeConfig

from . import BenchRefused, refuse_unplanned

__all__ = ["collect", "render", "cases", "shape", "engine", "case_jobs", "CaseRun",
           "SHAPE_FIELDS"]

SHAPE_FIELDS = {"head_dim": "attn_head_dim", "lanes": "attn_lanes", "max_heads": "attn_heads",
                "max_block": "attn_block", "keys": "tile_keys", "arr_lanes": "tile_lanes",
                "arrays": "gemm_arrays", "array_rows": "gemm_rows", "chain": "gemm_chain"}
"""The measured shape's keys (ArrayEngine's parameters) and the NodeConfig fields they are."""

SEED = 33


def shape(cfg: NodeConfig) -> dict:
    """The ArrayEngine parameters of ``cfg``'s node (:data:`SHAPE_FIELDS`), its DSP flavour in
    simulation, its output width and the configuration's name."""
    if not cfg.attn_on_arrays:
        raise ValueError(f"{cfg.name}: no attention on the arrays (attn_on_arrays)")
    out = {k: getattr(cfg, f) for k, f in SHAPE_FIELDS.items()}
    dsp = "model" if cfg.gemm_dsp == "primitive" else cfg.gemm_dsp
    if cfg.gemm_chain == 1:
        dsp = "fabric"
    return {"config": cfg.name, **out, "dsp": dsp, "data_width": PACKET_WIDTH}


def engine(cfg: NodeConfig):
    """The :class:`~mcf.hdl.compute.array_engine.ArrayEngine` measured for ``cfg``."""
    from mcf.hdl.compute.array_engine import ArrayEngine

    s = shape(cfg)
    return ArrayEngine(head_dim=s["head_dim"], lanes=s["lanes"], max_heads=s["max_heads"],
                       max_block=s["max_block"], data_width=s["data_width"], keys=s["keys"],
                       arr_lanes=s["arr_lanes"], arrays=s["arrays"],
                       array_rows=s["array_rows"], chain=s["chain"], dsp=s["dsp"])


GROUPS = (6, 2)
"""The GQA groups measured (those up to the configuration's ``attn_heads``), the first one the
headline (``decode_cycles_per_qk`` / ``prefill_cycles_per_qk``)."""


def cases(small: bool, max_block: int = 256, max_heads: int = 6) -> list[dict]:
    """The measured cases at blocks of ``max_block`` keys, GQA groups of :data:`GROUPS` up to
    ``max_heads``. ``small`` (the CI sizes, the same code path): the first group only, one job
    of one block of ``max_block / 8`` keys (``block_keys``; a short block, as the tail of a
    context), the last query token of it."""
    blocks, jobs, t = (1, 1, max(1, max_block // 8)) if small else (4, 4, max_block)
    offsets = [t // 4, t // 2, t - 1]
    groups = [g for g in GROUPS if g <= max_heads] or [max_heads]
    out = []
    for heads in groups[:1] if small else groups:
        out += [{"name": f"decode_g{heads}", "kind": "decode", "heads": heads,
                 "blocks": blocks, "block_keys": t, "jobs": jobs},
                {"name": f"prefill_g{heads}", "kind": "prefill", "heads": heads,
                 "blocks": blocks, "block_keys": t,
                 "q_offsets": offsets[2:] if small else offsets}]
    return out


def case_jobs(case: dict, head_dim: int, max_block: int, rng) -> tuple[list, dict]:
    """A case's jobs — a warm-up decode job, the measured jobs, a cool-down decode job — each
    over ``blocks`` blocks of ``block_keys`` keys (default ``max_block``), and their work:
    visible (query, key, head) pairs of all jobs and of the measured ones."""
    from mcf.abi.kv import AttnMode
    from mcf.golden.attention import random_blocks, random_query
    from mcf.sim.attention_jobs import Job

    d, t = head_dim, case.get("block_keys", max_block)
    if not 1 <= t <= max_block:
        raise ValueError(f"blocks of {t} keys: the engine takes 1..{max_block}")
    heads, n_blocks = case["heads"], case["blocks"]

    def decode():
        blocks = random_blocks(rng, [t] * n_blocks, d)
        q, sq = random_query(rng, heads, d)
        return Job(AttnMode.SINGLE, q, sq, blocks)

    frame_pairs = 2 * t * n_blocks * heads
    if case["kind"] == "decode":
        measured = [decode() for _ in range(case["jobs"])]
        pairs = len(measured) * t * n_blocks * heads
    elif case["kind"] == "prefill":
        blocks = random_blocks(rng, [t] * n_blocks, d)
        first = int(blocks[-1].pos[0])
        measured, pairs = [], 0
        for off in case["q_offsets"]:
            q, sq = random_query(rng, heads, d)
            measured.append(Job(AttnMode.SINGLE, q, sq, blocks, normalize=True, causal=True,
                                q_pos=first + off))
            pairs += (first + off + 1) * heads             # causally visible pairs
    else:
        raise ValueError(f"unknown case kind {case['kind']!r}")
    jobs = [decode(), *measured, decode()]
    return jobs, {"pairs": frame_pairs + pairs, "steady_pairs": pairs,
                  "warm_jobs": 1, "measured_jobs": len(measured)}


@dataclass(frozen=True)
class CaseRun:
    """One case's run: every job's last output cycle and the checks' results."""
    done: tuple[int, ...]          # cycle of each job's last output beat
    status: dict                   # the engine's status counters after the run


def run_case(cfg: NodeConfig, case: dict, jobs: list, *, fault: str | None = None) -> CaseRun:
    """``jobs`` through :func:`engine` of ``cfg``; refuses (:class:`BenchRefused`) unless every
    word and payload boundary is the golden model's, every job completed and no error counter
    moved. ``fault="expected"`` corrupts the expectation of the first word (a test of the
    refusal)."""
    from mcf.sim.attention_drive import drive_engine
    from mcf.sim.attention_jobs import expected_ends, expected_words

    s = shape(cfg)
    name = case["name"]
    expected, ends, job_end = [], [], []
    for j in jobs:
        words = expected_words(j)
        ends += [len(expected) + e for e in expected_ends(j)]
        expected += words
        job_end.append(len(ends))
    if fault == "expected":
        expected[0] ^= 1
    elif fault is not None:
        raise ValueError(f"unknown fault {fault!r}")
    # the vector engine's rate (head_dim/lanes cycles per (key, head)) twice, plus slack
    limit = sum(2 * len(j.blocks) * s["max_block"] * s["head_dim"] // s["lanes"] * j.heads
                + 4000 for j in jobs)
    run = drive_engine(engine(cfg), jobs, max_heads=s["max_heads"], lanes=s["lanes"],
                       data_width=s["data_width"], max_cycles=limit)
    if run.timed_out:
        raise BenchRefused(f"attention on the arrays {name}: {len(run.end_cycles)} of "
                           f"{len(ends)} payloads within {limit} cycles (engine stalled)")
    if run.words != expected or run.ends != ends:
        bad = sum(a != b for a, b in zip(run.words, expected)) + abs(len(run.words)
                                                                    - len(expected))
        raise BenchRefused(f"attention on the arrays {name}: {bad} word(s) differ from the "
                           "golden model" + ("" if bad else " (payload boundaries differ)"))
    st = run.status
    refuse_unplanned(f"attention on the arrays {name}",
                     {k: st[k] for k in ("err_rows", "err_max", "err_job", "busy")})
    if st["jobs"] != len(jobs):
        raise BenchRefused(f"attention on the arrays {name}: {st['jobs']} of {len(jobs)} jobs "
                           "completed")
    return CaseRun(tuple(run.end_cycles[e - 1] for e in job_end), dict(st))


def measure_case(cfg: NodeConfig, case: dict, seed: int) -> dict:
    """One case's row of :func:`collect`'s ``cases``."""
    s = shape(cfg)
    d = s["head_dim"]
    jobs, work = case_jobs(case, d, s["max_block"], np.random.default_rng(seed))
    run = run_case(cfg, case, jobs)
    w, n = work["warm_jobs"], work["measured_jobs"]
    steady = run.done[w + n - 1] - run.done[w - 1]
    whole = run.done[-1]
    peak = s["arrays"] * s["array_rows"] * s["arr_lanes"]
    sp, wp = work["steady_pairs"], work["pairs"]
    return {
        "kind": case["kind"], "heads": case["heads"], "blocks": case["blocks"], "jobs": n,
        "steady_cycles": steady, "qk_pairs": sp, "pv_pairs": sp,
        "cycles_per_qk": round(steady / sp, 3),
        "macs_per_cycle": round(2 * sp * d / steady, 2),
        "array_utilization": round(2 * sp * d / (peak * steady), 4),
        "whole_cycles": whole, "whole_cycles_per_qk": round(whole / wp, 3),
        "whole_array_utilization": round(2 * wp * d / (peak * whole), 4),
    }


def collect(cfg: NodeConfig | None = None, small: bool = False, synth: bool = True,
            workers: int = 2) -> dict:
    """Measure ArrayEngine at ``cfg``'s shape (default: the kr260 node); returns the JSON
    object described in the module docstring. ``workers`` > 1 runs the cases in that many
    processes (the same runs, seeds and figures). ``synth`` is the bench contract's
    (:mod:`mcf.sim.perf`); no resources are reported here (the engine's are the node's,
    ``mcf bench node``)."""
    if cfg is None:
        from mcf.abi.node_config import KR260 as cfg
    s = shape(cfg)
    todo = [(c, SEED + i) for i, c in enumerate(cases(small, s["max_block"], s["max_heads"]))]
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(workers, len(todo))) as pool:
            got = list(pool.map(measure_case, [cfg] * len(todo), *zip(*todo)))
    else:
        got = [measure_case(cfg, c, seed) for c, seed in todo]
    rows = {c["name"]: r for (c, _), r in zip(todo, got)}
    head = todo[0][0]["heads"]
    dec, pre = f"decode_g{head}", f"prefill_g{head}"
    return {
        "decode_cycles_per_qk": rows[dec]["cycles_per_qk"],
        "prefill_cycles_per_qk": rows[pre]["cycles_per_qk"],
        "array_utilization": min(rows[n]["array_utilization"] for n in (dec, pre)),
        "cases": rows,
        "shape": s,
        "engine": "ArrayEngine (mcf.hdl.compute.array_engine), amaranth.sim",
        "small": small,
    }


def render(result: dict) -> str:
    s = result["shape"]
    lines = [f"attention on the arrays ({result['engine']}; {s['config']} shape: head_dim "
             f"{s['head_dim']}, {s['lanes']} lanes in, up to {s['max_heads']} heads, blocks of "
             f"{s['max_block']}, {s['keys']} keys x {s['arr_lanes']} lanes per score beat, "
             f"{s['arrays']} arrays of {s['array_rows']} x {s['arr_lanes']}, chain "
             f"{s['chain']} ({s['dsp']}); outputs bit-exact with the golden model)",
             "steady state (warm-up / cool-down jobs around the window) | whole run",
             f"{'case':<12} {'jobs':>4} {'blocks':>6} {'cycles':>8} {'cyc/(q,k,h)':>11} "
             f"{'MAC/cyc':>8} {'arrays':>7} | {'cycles':>8} {'cyc/(q,k,h)':>11} {'arrays':>7}"]
    for name, r in result["cases"].items():
        lines.append(f"{name:<12} {r['jobs']:>4} {r['blocks']:>6} {r['steady_cycles']:>8} "
                     f"{r['cycles_per_qk']:>11.3f} {r['macs_per_cycle']:>8.1f} "
                     f"{r['array_utilization']:>7.1%} | {r['whole_cycles']:>8} "
                     f"{r['whole_cycles_per_qk']:>11.3f} {r['whole_array_utilization']:>7.1%}")
    lines.append(f"steady state: decode {result['decode_cycles_per_qk']:.3f}, prefill "
                 f"{result['prefill_cycles_per_qk']:.3f} cycles per (query, key, head)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="the reduced CI sizes")
    ap.add_argument("--config", default="kr260",
                    help="a NODE_CONFIGS name with attn_on_arrays")
    ap.add_argument("--out", type=Path, help="write the JSON here")
    ap.add_argument("--workers", type=int, default=1, help="cases run in parallel processes")
    args = ap.parse_args(argv)
    from mcf.abi.node_config import NODE_CONFIGS

    if args.config not in NODE_CONFIGS:
        ap.error(f"unknown configuration {args.config!r}")
    cfg = NODE_CONFIGS[args.config]
    try:
        result = collect(cfg, args.small, workers=args.workers)
    except (BenchRefused, ValueError) as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    print(render(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
