#!/usr/bin/env python3
"""Table-1-style sweep (paper §6.5): 16K prefill TTFT and traffic for MARS and the fair
baselines over N, from the MARS cost model (``mcf.mars``), printed beside the paper's figures.

    python scripts/plan_sweep.py                       # paper setting, kr260-ring, whole model
    python scripts/plan_sweep.py --setting board       # S_node from the KR260's DDR
    python scripts/plan_sweep.py --topology switch --scope attention
    python scripts/plan_sweep.py --schemes mars ring zigzag ring-unchunked full pd
    python scripts/plan_sweep.py --json                # one JSON object
    python scripts/plan_sweep.py --plot build/mars_memory.png   # memory per node (like Fig. 4)
    python scripts/plan_sweep.py --nodes 8 --chunk 256 512 1024 2048 --schemes mars  # Fig. 5

Schemes and what each baseline is: ``mcf.mars.sweep.SCHEMES``. Every figure is computed from
the stated assumptions; nothing is fitted to the paper.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from mcf.abi.node_config import NODE_CONFIGS
from mcf.abi.platform import ACLK_HZ, K26
from mcf.mars import get_model
from mcf.mars.setting import SETTINGS, get_setting
from mcf.mars.sweep import SCHEMES, SweepSpec, sweep, table


def plot(rows, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    mars = [r for r in rows if r["scheme"] == "mars"]
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
    ap.add_argument("--schemes", nargs="+", default=["mars", "ring", "zigzag"],
                    help=f"any of {', '.join(SCHEMES)}")
    ap.add_argument("--setting", default="paper", choices=SETTINGS,
                    help="alpha and S_node: paper (0.5, 64 MiB) or board (KR260 DDR - weights)")
    ap.add_argument("--kv-budget-mib", type=float, default=None,
                    help="S_node in MiB (default: the setting's)")
    ap.add_argument("--alpha", type=float, default=None, help="eq 15 (default: the setting's)")
    ap.add_argument("--node-config", default="kr260", choices=tuple(NODE_CONFIGS))
    ap.add_argument("--buffer-mib", type=float, default=8.0)
    ap.add_argument("--topology", default="kr260-ring")
    ap.add_argument("--link-gbps", type=float, default=10.0)
    ap.add_argument("--dsps", type=int, default=K26["DSP"])
    ap.add_argument("--mhz", type=float, default=ACLK_HZ / 1e6)
    ap.add_argument("--scope", default="model", choices=("model", "attention"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--plot", default=None, help="write a Fig.-4-style PNG")
    args = ap.parse_args(argv)
    try:
        st = get_setting(args.setting, get_model(args.model))
        spec = SweepSpec(
            alpha=st.alpha if args.alpha is None else args.alpha,
            kv_budget_mib=st.kv_budget_mib if args.kv_budget_mib is None else args.kv_budget_mib,
            setting=args.setting if args.alpha is None and args.kv_budget_mib is None
            else f"{args.setting} with flags", model=args.model, seq_len=args.seq_len,
            chunks=tuple(b or None for b in args.chunk), nodes=tuple(args.nodes),
            schemes=tuple(args.schemes), buffer_mib=args.buffer_mib, topology=args.topology,
            link_gbps=args.link_gbps, dsps=args.dsps, mhz=args.mhz, scope=args.scope,
            node_config=args.node_config)
        rows = sweep(spec, keep_plans=bool(args.plot))
    except ValueError as exc:      # PlanError and unknown models
        print(f"plan_sweep: error: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        plot(rows, args.plot)
    for r in rows:
        r.pop("_plan", None)
    if args.json:
        print(json.dumps({"spec": dataclasses.asdict(spec), "rows": rows}))
    else:
        print(table(rows, spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
