"""``mcf demo``: the system working as one, in a few minutes (issue #15 §5, issue #17 §5).

1. **The cluster answers.** The trained ``retrieval`` model poses a passkey prompt to a ring of
   simulated KR260 node tops (Verilator, ``sim`` configuration, one node per MPI rank: the
   single-process run's cycles, one small build for every run) under MARS, ring and zigzag
   prefill, each followed by KV-stationary decode; every run is checked bit for bit against its
   integer golden model, its KV read back from the nodes' directories (owner-only) and its peak
   KV against the budget. The answers are printed beside the expected ones.
2. **The comparison, measured in RTL.** TTFT in ``aclk`` cycles and the exposed communication
   of the three schedules on that same prompt.
3. **The same answer on any N.** The MARS run again with the two-phase softmax
   (``--softmax two_phase``, 16-token chunks: one ``sim`` node's GEMM takes 16 rows) on 1, 2
   and 4 nodes (``--invariance-nodes``): ``n_invariant`` holds when each is bit-exact against
   its golden model and all give the same tokens and the same logits, bit for bit, at every
   step.
4. **The system model.** The calibrated event model (:mod:`mcf.sysmodel`) predicts the same
   runs (its error against the RTL is reported) and evaluates Qwen2.5-1.5B at 16K on N = 2..16
   at the paper's setting: PNGs, ``summary.md``, ``summary.json`` and ``evaluation.json`` in
   ``--out``.

Exit status 0 when every check passed, 1 when one failed, 2 for bad arguments.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..cli import UsageError

__all__ = ["register", "demo", "DemoSpec", "CHECKS", "INVARIANCE_NODES", "n_invariant",
           "summary_model"]

CHECKS = ("bit_exact", "logits_bit_exact", "owner_only", "memory_within_budget", "n_invariant")
"""The checks ``summary.json`` reports (issue #15 §5), each over every RTL run."""

INVARIANCE_NODES = (1, 2, 4)
"""The ring sizes of ``n_invariant``'s two-phase runs (``--invariance-nodes``' default)."""


@dataclass(frozen=True)
class DemoSpec:
    """What the demo runs: ``nodes`` simulated boards, a passkey prompt of ``prompt_tokens``
    (chunk ``chunk``, prompt seed ``seed``) under each of ``policies`` with ``decode_tokens``
    after the first, ``parallel`` simulations at once; ``n_invariant``'s two-phase runs on
    each ring size of ``invariance_nodes``; the system model's grid (``quick``: the small
    one); the report in ``out``."""
    nodes: int = 4
    prompt_tokens: int = 64
    chunk: int = 32
    decode_tokens: int = 1
    seed: int = 0
    policies: tuple[str, ...] = ("mars", "ring", "zigzag")
    parallel: int = 2
    quick: bool = False
    invariance_nodes: tuple[int, ...] = INVARIANCE_NODES
    out: Path = Path("build/report")

    def runs(self):
        from ..cluster import RunSpec
        return [RunSpec(model="retrieval", task="passkey", nodes=self.nodes,
                        prompt_tokens=self.prompt_tokens, chunk=self.chunk, policy=p,
                        decode_tokens=self.decode_tokens, seed=self.seed)
                for p in self.policies]

    def invariance_runs(self):
        """The first run with the two-phase softmax on each of ``invariance_nodes``, at
        the largest chunk one node's GEMM takes (two-phase bits do not depend on the chunk)."""
        from ..abi.node_config import NODE_CONFIGS

        first = self.runs()[0]
        chunk = min(first.chunk, NODE_CONFIGS[first.config].gemm_m_max)
        return [replace(first, nodes=n, chunk=chunk, softmax="two_phase")
                for n in self.invariance_nodes]


def n_invariant(results: dict[int, dict]) -> tuple[bool, str]:
    """``n_invariant`` over the two-phase runs ``{nodes: mcf run's result}``: every run passed
    its own checks, and all give the same tokens and logits bit for bit. Returns ``(passed,
    why)``."""
    failed = {n: g["failed"] for n, g in results.items() if "failed" in g}
    if failed:
        return False, "; ".join(f"N = {n}: {why}" for n, why in failed.items())
    bad = [n for n, g in results.items() if not all(g["checks"].values())]
    if bad:
        return False, f"a check failed at N = {bad}"
    (n0, ref), *rest = sorted(results.items())
    for n, g in rest:
        if g["tokens"] != ref["tokens"] or g["logits"] != ref["logits"]:
            return False, f"N = {n} differs from N = {n0}"
    return True, f"the same {len(ref['tokens'])} tokens and logits at N = " + \
        ", ".join(str(n) for n in sorted(results))


def _eval_spec(quick: bool):
    """The system model's grid: Table 1 at 16K on N = 2..16 (the summary's ``_n16`` figures),
    Table 2's decode row on 4 nodes, and small Fig. 3-5 and crossover grids (``mcf model
    --evaluate`` makes the full ones)."""
    from ..mars.setting import paper_setting
    from ..sysmodel.evaluation import EvalSpec

    paper = paper_setting()
    spec = EvalSpec(alpha=paper.alpha, kv_budget_mib=paper.kv_budget_mib, setting=paper.name)
    if quick:
        return spec.quick()
    return replace(spec, memory_nodes=(16,), seq_lens=(1024, 4096), seq_nodes=4,
                   chunks=(1024, 2048), chunk_nodes=4, map_nodes=4, compute_scales=(1, 256),
                   link_gbps=(1, 10), decode_contexts=(16384,))


def summary_model(ev, predicted: dict, measured: dict) -> dict:
    """``summary.json``'s ``model`` part: MARS against the fair baselines at the largest N of
    Table 1 (whole model), its traffic against ring's, its gap to full replication, decode
    tokens/s on 4 nodes (replicated weights as built, tensor-parallel) and the model's error
    on the demo's own RTL runs (``predicted`` / ``measured``: TTFT cycles per policy)."""
    from ..sysmodel.evaluation import AS_BUILT

    n = max(ev.spec.nodes)
    sp = next(s for s in ev.speedups() if s["scope"] == "model" and s["nodes"] == n)
    by = {r.scheme: r for r in ev.table_runs if r.scope == "model" and r.nodes == n}
    dec = {d.mode: d for d in ev.decode if d.context == max(ev.spec.decode_contexts)
           and d.weight_path == AS_BUILT}
    err = max(abs(predicted[p] - measured[p]) / measured[p] for p in measured)
    return {"nodes": n, "seq_len": ev.spec.seq_len, "scope": "model",
            f"best_fair_n{n}": sp["best_fair"],
            f"speedup_vs_best_fair_n{n}": sp["speedup_vs_best_fair"],
            f"speedup_vs_ring_n{n}": sp["speedup_vs_ring"],
            f"speedup_vs_zigzag_n{n}": sp["speedup_vs_zigzag"],
            f"traffic_ratio_vs_ring_n{n}": by["mars"].comm_gib / by["ring"].comm_gib,
            f"full_replication_gap_n{n}": by["mars"].ttft_s / by["full"].ttft_s - 1,
            "decode_tok_s_4_nodes": dec["replicated"].tok_s if "replicated" in dec else None,
            "decode_tok_s_4_nodes_tp": dec["tensor-parallel"].tok_s
            if "tensor-parallel" in dec else None,
            "decode_context": max(ev.spec.decode_contexts),
            "model_vs_rtl_cycle_error": err}


def _predict(runs, fig) -> dict:
    """The system model's TTFT in cycles of each RTL run (its plan on the same configuration:
    the node program's layout and prefill ATTEND records for the run's softmax,
    :func:`mcf.node.layer.prefill_tile_chunk`; the cluster simulation's links and latency)."""
    from ..abi.node_config import NODE_CONFIGS
    from ..cluster import make_plan
    from ..model import model_from_spec
    from ..node.layer import prefill_tile_chunk
    from ..sim.cluster import BENCH_LATENCY_CYCLES
    from ..sysmodel.system import simulate_plan
    from ..sysmodel.validate import rtl_system_spec

    cfg, _ = model_from_spec("retrieval")

    def sys_spec(r):  # the prefill ATTEND records the run's node program issues
        return rtl_system_spec(BENCH_LATENCY_CYCLES, tile_chunk=prefill_tile_chunk(
            NODE_CONFIGS[r.config], r.softmax))

    return {r.policy: sum(simulate_plan(make_plan(r, cfg), fig, sys_spec(r)).step_cycles)
            for r in runs}


def _bar(progress: bool, total: int, desc: str, unit: str, position: int):
    if not progress:
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, position=position, file=sys.stderr)


def demo(spec: DemoSpec, progress: bool = True) -> tuple[dict, int]:
    """Run the demo; return ``(summary, exit status)``. Every RTL run is one node per MPI rank
    (one Verilator build, ``node_rank``, serves them all, with the single-process run's
    cycles); they overlap (``parallel`` at once) and the system model runs beside them (it
    waits for no simulation)."""
    from ..sim.cluster import build_rank
    from ..sysmodel.calibration import load_figures
    from ..sysmodel.evaluation import count_runs, evaluate, markdown, write_report
    from .run import simulate

    runs, inv_runs = spec.runs(), spec.invariance_runs()
    say = (lambda s: print(s, file=sys.stderr, flush=True)) if progress else (lambda s: None)
    fig = load_figures()
    say("building the simulated node of one MPI rank (Verilator; cached after the first "
        "time) ...")
    build_rank()
    say(f"{len(runs)} runs of a {spec.prompt_tokens}-token passkey prompt on {spec.nodes} "
        f"simulated KR260 nodes ({', '.join(spec.policies)}), the MARS run with the two-phase "
        f"softmax on N = {', '.join(str(r.nodes) for r in inv_runs)}, one node per MPI rank, "
        "and the system model ...")
    ev_spec = _eval_spec(spec.quick)
    rtl_bar = _bar(progress, len(runs) + len(inv_runs), "RTL runs", "run", 0)
    model_bar = _bar(progress, count_runs(ev_spec), "system model", "run", 1)

    def one(r):
        try:
            got = simulate(r, progress=False, mpi=True)
        except AssertionError as exc:
            got = {"failed": str(exc).splitlines()[0]}
        if rtl_bar is not None:
            rtl_bar.set_postfix_str(f"{r.policy} {r.softmax} N={r.nodes} done")
            rtl_bar.update(1)
        return got

    def model():
        return evaluate(ev_spec, fig, None if model_bar is None else
                        lambda label: (model_bar.set_postfix_str(label), model_bar.update(1)))

    with ThreadPoolExecutor(spec.parallel) as pool:
        sims = [pool.submit(one, r) for r in runs]
        inv_sims = [pool.submit(one, r) for r in inv_runs]
        ev_future = pool.submit(model)
        got = {r.policy: f.result() for r, f in zip(runs, sims)}
        inv = {r.nodes: f.result() for r, f in zip(inv_runs, inv_sims)}
        ev = ev_future.result()
    for bar in (rtl_bar, model_bar):
        if bar is not None:
            bar.close()
    predicted = _predict(runs, fig)
    invariant, why = n_invariant(inv)

    failed = {p: g["failed"] for p, g in got.items() if "failed" in g}
    ok = {p: g for p, g in got.items() if "failed" not in g}
    checks = {name: not failed and all(g["checks"][name] for g in ok.values())
              for name in (*CHECKS, "tokens_match") if name != "n_invariant"}
    checks["n_invariant"] = invariant
    rtl = {p: {"ttft_cycles": g["ttft_cycles"], "decode_cycles": g["decode_cycles"],
               "exposed_comm_cycles": [max(w) for w in g["exposed_comm_cycles"]],
               "answer": g["task"]["generated"], "expected": g["task"]["answer"],
               "correct": g["task"]["correct"], "checks": g["checks"],
               "node_cycles_per_second": g["node_cycles_per_second"]}
           for p, g in ok.items()}
    measured = {p: r["ttft_cycles"] for p, r in rtl.items()}
    model = summary_model(ev, predicted, measured) if measured else {}
    summary = {"checks": checks, "model": model,
               "failed_runs": failed,
               "n_invariant": {"passed": invariant, "why": why, "softmax": "two_phase",
                               "runs": {n: {k: g[k] for k in ("tokens", "ttft_cycles",
                                                              "decode_cycles",
                                                              "node_cycles_per_second")}
                                        for n, g in inv.items() if "failed" not in g}},
               "rtl": {"nodes": spec.nodes, "prompt_tokens": spec.prompt_tokens,
                       "chunk": spec.chunk, "model": "retrieval", "task": "passkey",
                       "seed": spec.seed, "runs": rtl,
                       "model_predicted_ttft_cycles": {p: round(v) for p, v in
                                                       predicted.items()}},
               "spec": {k: (str(v) if isinstance(v, Path) else v)
                        for k, v in asdict(spec).items()}}
    out = Path(spec.out)
    write_report(ev, out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(_markdown(summary) + "\n" + markdown(ev))
    status = 0 if all(checks.values()) else 1
    return summary, status


def _markdown(s: dict) -> str:
    r = s["rtl"]
    lines = [f"# mcf demo: {r['prompt_tokens']}-token passkey prompts on {r['nodes']} "
             "simulated KR260 nodes", "",
             "| policy | answer | expected | TTFT (cycles) | model (cycles) | decode (cycles "
             "per token) | exposed comm per step |", "|---|---|---|---|---|---|---|"]
    for p, run in r["runs"].items():
        lines.append(f"| {p} | {run['answer']} | {run['expected']} | {run['ttft_cycles']:,} | "
                     f"{r['model_predicted_ttft_cycles'][p]:,} | "
                     + ", ".join(f"{c:,}" for c in run["decode_cycles"]) + " | "
                     + ", ".join(f"{c:,}" for c in run["exposed_comm_cycles"]) + " |")
    lines += ["", "Checks: " + ", ".join(
        f"{k} {'pass' if v else 'FAIL'}" for k, v in s["checks"].items()) + "."]
    inv = s["n_invariant"]
    lines += ["", f"Two-phase softmax, MARS: {inv['why']}.", "",
              "| N | tokens | TTFT (cycles) | decode (cycles per token) |", "|---|---|---|---|"]
    for n, run in inv["runs"].items():
        lines.append(f"| {n} | {run['tokens']} | {run['ttft_cycles']:,} | "
                     + ", ".join(f"{c:,}" for c in run["decode_cycles"]) + " |")
    lines += [f"* {p} failed: {why}" for p, why in s["failed_runs"].items()]
    m = s["model"]
    if m:
        n = m["nodes"]
        lines += ["", f"System model (Qwen2.5-1.5B, {m['seq_len']:,} tokens, N = {n}, whole "
                  f"model, paper setting): MARS {m[f'speedup_vs_best_fair_n{n}']:.3f}x the best "
                  f"fair baseline, {m[f'speedup_vs_ring_n{n}']:.3f}x ring, "
                  f"{m[f'speedup_vs_zigzag_n{n}']:.3f}x zigzag; traffic "
                  f"{m[f'traffic_ratio_vs_ring_n{n}']:.3f}x ring's; "
                  f"{100 * m[f'full_replication_gap_n{n}']:+.1f} % against full replication. "
                  f"Decode on 4 nodes at {m['decode_context']:,} tokens: "
                  f"{_tok(m['decode_tok_s_4_nodes'])} tok/s replicated, "
                  f"{_tok(m['decode_tok_s_4_nodes_tp'])} tok/s tensor-parallel. The model's "
                  f"TTFT error on these RTL runs: {100 * m['model_vs_rtl_cycle_error']:.1f} %."]
    return "\n".join(lines) + "\n"


def _tok(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def run(args) -> int:
    from ..cluster import RUN_POLICIES, RunError

    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    bad = [p for p in policies if p not in RUN_POLICIES]
    if not policies or bad or len(set(policies)) != len(policies):
        raise UsageError(f"--policies {args.policies!r}: distinct names among "
                         f"{', '.join(RUN_POLICIES)}")
    if args.parallel < 1:
        raise UsageError(f"--parallel must be at least 1 (got {args.parallel})")
    from ._checks import node_counts, writable_dir
    inv_nodes = node_counts("--invariance-nodes", args.invariance_nodes)
    if len(inv_nodes) < 2 or len(set(inv_nodes)) != len(inv_nodes):
        raise UsageError(f"--invariance-nodes {args.invariance_nodes!r}: at least two distinct "
                         "node counts")
    out = writable_dir("--out", args.out)
    spec = DemoSpec(nodes=args.nodes, prompt_tokens=args.prompt_tokens, chunk=args.chunk,
                    decode_tokens=args.decode_tokens, seed=args.seed, policies=policies,
                    parallel=args.parallel, quick=args.quick, invariance_nodes=inv_nodes,
                    out=out)
    try:
        runs = spec.runs() + spec.invariance_runs()
    except RunError as exc:
        raise UsageError(str(exc)) from None
    from ..sim.mpi import mpirun
    from .run import _check_model
    for r in runs:
        _check_model(r)
    try:
        mpirun()                          # every RTL run is one node per MPI rank
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    summary, status = demo(spec, progress=not args.quiet)
    _print(summary, spec)
    return status


def _print(s: dict, spec: DemoSpec) -> None:
    r = s["rtl"]
    print(f"mcf demo: the trained retrieval model, {r['prompt_tokens']}-token passkey prompt "
          f"(seed {r['seed']}), {r['nodes']} simulated KR260 nodes (aclk cycles)")
    for p, run in r["runs"].items():
        print(f"  {p:<7} answer {run['answer']} expected {run['expected']}: "
              f"{'right' if run['correct'] else 'wrong'}; TTFT {run['ttft_cycles']:,} cycles "
              f"(model {r['model_predicted_ttft_cycles'][p]:,}), exposed comm "
              + "/".join(f"{c:,}" for c in run["exposed_comm_cycles"]) + " per step")
    for p, why in s["failed_runs"].items():
        print(f"  {p:<7} FAILED: {why}")
    for k, v in s["checks"].items():
        print(f"  check {k:<21}: {'pass' if v else 'FAIL'}")
    print(f"    (n_invariant, two-phase softmax: {s['n_invariant']['why']})")
    m = s["model"]
    if m:
        n = m["nodes"]
        print(f"  system model, Qwen2.5-1.5B at {m['seq_len']:,} tokens on {n} nodes: MARS "
              f"{m[f'speedup_vs_best_fair_n{n}']:.3f}x the best fair baseline "
              f"({m[f'best_fair_n{n}']}), {m[f'speedup_vs_ring_n{n}']:.3f}x ring; decode on "
              f"4 nodes {_tok(m['decode_tok_s_4_nodes'])} tok/s replicated, "
              f"{_tok(m['decode_tok_s_4_nodes_tp'])} tok/s tensor-parallel; model vs RTL "
              f"{100 * m['model_vs_rtl_cycle_error']:.1f} %")
    print(f"  report: {spec.out}/summary.md, summary.json, evaluation.json and the PNGs")


def _description() -> str:
    from ._checks import description
    return description(__doc__)


def register(subs) -> None:
    p = subs.add_parser("demo", help="the whole system in a few minutes: a simulated cluster "
                                     "answers retrieval prompts, the RTL comparison, the model",
                        description=_description())
    p.add_argument("--nodes", type=int, default=4, help="simulated KR260 nodes (default 4)")
    p.add_argument("--prompt-tokens", type=int, default=64,
                   help="passkey prompt length, a multiple of --chunk (default 64)")
    p.add_argument("--chunk", type=int, default=32, help="prefill chunk B (default 32)")
    p.add_argument("--decode-tokens", type=int, default=1,
                   help="decode tokens after the first (default 1: the two-token answer)")
    p.add_argument("--seed", type=int, default=0, help="prompt seed (default 0)")
    p.add_argument("--policies", default="mars,ring,zigzag",
                   help="prefill schedules to run and compare (default mars,ring,zigzag)")
    p.add_argument("--parallel", type=int, default=2,
                   help="simulations at once (default 2, one per core)")
    p.add_argument("--invariance-nodes", default=",".join(map(str, INVARIANCE_NODES)),
                   help="ring sizes of the two-phase n_invariant runs (default "
                        f"{','.join(map(str, INVARIANCE_NODES))})")
    p.add_argument("--quick", action="store_true",
                   help="the system model's small grid (4K prompt, N = 2 and 4)")
    p.add_argument("--out", default="build/report", help="report folder (default build/report)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(handler=run)
