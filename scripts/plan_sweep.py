#!/usr/bin/env python3
"""Table-1-style sweep (paper §6.5): 16K prefill TTFT and traffic for MARS / ring / zigzag over
N, from the MARS cost model (``mcf.mars``), printed beside the paper's figures.

    python scripts/plan_sweep.py                       # kr260-ring, whole-model TTFT
    python scripts/plan_sweep.py --topology switch --scope attention
    python scripts/plan_sweep.py --json                # one JSON object
    python scripts/plan_sweep.py --plot build/mars_memory.png   # memory per node (like Fig. 4)
    python scripts/plan_sweep.py --nodes 8 --chunk 256 512 1024 2048 --policies mars  # Fig. 5

Every figure is computed from the stated assumptions; nothing is fitted to the paper.
"""

from __future__ import annotations

import argparse
import json
import sys

from mcf.abi.platform import K26
from mcf.mars import PlanError
from mcf.mars.sweep import SweepSpec, sweep, table


def plot(rows, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    mars = [r for r in rows if r["policy"] == "mars"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for r in mars:
        p = r["_plan"]
        steps = [s.index for s in p.steps]
        mib = [max(s.node_kv_bytes) / 2 ** 20 for s in p.steps]
        owner = [s.index * p.model.m_chunk(p.chunk) / p.cluster.nodes / 2 ** 20
                 for s in p.steps]
        tag = f"N={r['nodes']} B={r['chunk']}"
        ax1.plot(steps, mib, label=f"MARS {tag}")
        ax1.plot(steps, owner, "--", label=f"owner-only {tag}")
        ax2.plot(steps, [s.active_replica_factor for s in p.steps], label=tag)
    ax1.set(xlabel="prefill step (chunk)", ylabel="KV per node, max (MiB)",
            title="(a) KV memory per node")
    ax2.set(xlabel="prefill step (chunk)", ylabel="mean copies per slice",
            title="(b) active replica factor")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-1.5b")
    ap.add_argument("--seq-len", type=int, default=16384)
    ap.add_argument("--chunk", type=int, nargs="+", default=[1024],
                    help="chunk size(s) B; 0 = B* by eq 8")
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--policies", nargs="+", default=["mars", "ring", "zigzag"])
    ap.add_argument("--kv-budget-mib", type=float, default=64.0)
    ap.add_argument("--buffer-mib", type=float, default=8.0)
    ap.add_argument("--alpha", type=float, default=0.5)
    ap.add_argument("--topology", default="kr260-ring")
    ap.add_argument("--link-gbps", type=float, default=10.0)
    ap.add_argument("--dsps", type=int, default=K26["DSP"])
    ap.add_argument("--mhz", type=float, default=300.0)
    ap.add_argument("--scope", default="model", choices=("model", "attention"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--plot", default=None, help="write a Fig.-4-style PNG")
    args = ap.parse_args(argv)
    spec = SweepSpec(model=args.model, seq_len=args.seq_len,
                     chunks=tuple(b or None for b in args.chunk), nodes=tuple(args.nodes),
                     policies=tuple(args.policies), kv_budget_mib=args.kv_budget_mib,
                     buffer_mib=args.buffer_mib, alpha=args.alpha, topology=args.topology,
                     link_gbps=args.link_gbps, dsps=args.dsps, mhz=args.mhz, scope=args.scope)
    try:
        rows = sweep(spec, keep_plans=bool(args.plot))
    except PlanError as exc:
        print(f"plan_sweep: error: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        plot(rows, args.plot)
    for r in rows:
        r.pop("_plan", None)
    if args.json:
        print(json.dumps({"rows": rows}))
    else:
        print(table(rows, spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
