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
from mcf.mars import PlanError, get_model, make_cluster, plan
from mcf.mars.report import assumptions_text, scope_text

GIB = 2 ** 30

# Paper Table 1 (16K prefill): (TTFT s, Comm GiB) — for comparison only.
PAPER = {
    "mars": {2: (1.68, 2.13), 4: (1.16, 3.02), 8: (0.97, 3.71), 16: (0.62, 5.12)},
    "ring": {2: (3.96, 1.94), 4: (2.46, 2.99), 8: (2.29, 3.70), 16: (1.91, 4.40)},
    "zigzag": {2: (3.81, 1.94), 4: (2.35, 2.99), 8: (2.18, 3.69), 16: (1.81, 4.40)},
}


def sweep(args) -> list[dict]:
    model = get_model(args.model)
    rows = []
    combos = [(n, b, pol) for n in args.nodes for b in args.chunk for pol in args.policies]
    for n, chunk, policy in combos:
        cl = make_cluster(n, kv_budget_mib=args.kv_budget_mib, buffer_mib=args.buffer_mib,
                          topology=args.topology, link_gbps=args.link_gbps,
                          dsps=args.dsps, clock_hz=args.mhz * 1e6, scope=args.scope)
        p = plan(model, cl, args.seq_len, chunk, policy, args.alpha)
        t = p.totals
        paper = PAPER.get(policy, {}).get(n)
        rows.append({
            "policy": policy, "nodes": n, "chunk": p.chunk, "ttft_s": t.ttft_s,
            "comm_gib_hops": t.comm_bytes / GIB, "delivered_gib": t.delivered_bytes / GIB,
            "exposed_comm_s": t.t_exposed_comm_s, "peak_node_kv_mib": t.peak_node_kv_bytes
            / 2 ** 20, "memory_ok": t.memory_ok, "final_owner_only": t.final_owner_only,
            "paper_ttft_s": paper[0] if paper else None,
            "paper_comm_gib": paper[1] if paper else None,
            "assumptions": assumptions_text(cl), "scope": scope_text(p),
            "_plan": p,
        })
    return rows


def table(rows, args) -> str:
    first = rows[0]
    out = [
        f"MARS cost-model sweep: {args.model}, S = {args.seq_len}, alpha = {args.alpha}",
        f"assumptions (N = {first['nodes']}; other N alike): {first['assumptions']}",
        f"{first['scope']}. Comm = bytes x hops over the run; delivered = bytes received.",
        "",
        f"{'scheme':<8} {'N':>3} {'B':>5} {'TTFT s':>9} {'exposed':>8} {'Comm GiB':>9} "
        f"{'deliv GiB':>9} {'peak MiB':>9} | {'paper TTFT':>10} {'paper GiB':>9}",
    ]
    for r in rows:
        pt = f"{r['paper_ttft_s']:.2f}" if r["paper_ttft_s"] is not None else "-"
        pc = f"{r['paper_comm_gib']:.2f}" if r["paper_comm_gib"] is not None else "-"
        mem = "" if r["memory_ok"] else " (over budget)"
        out.append(f"{r['policy']:<8} {r['nodes']:>3} {r['chunk']:>5} {r['ttft_s']:>9.3f} "
                   f"{r['exposed_comm_s']:>8.3f} {r['comm_gib_hops']:>9.3f} "
                   f"{r['delivered_gib']:>9.3f} {r['peak_node_kv_mib']:>9.1f} | {pt:>10} "
                   f"{pc:>9}{mem}")
    return "\n".join(out)


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
    args.chunk = [b or None for b in args.chunk]
    try:
        rows = sweep(args)
    except PlanError as exc:
        print(f"plan_sweep: error: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        plot(rows, args.plot)
    for r in rows:
        r.pop("_plan")
    if args.json:
        print(json.dumps({"rows": rows}))
    else:
        print(table(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
