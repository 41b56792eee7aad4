"""Table-1-style sweep (paper §6.5): prefill TTFT and traffic of MARS and the baselines over the
node count, from the MARS cost model, beside the paper's own figures. Used by
``scripts/plan_sweep.py`` (every knob as a flag, plots) and ``mcf bench plan`` (the README's
table). Every figure is computed from the stated assumptions; nothing is fitted to the paper.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcf.abi.platform import K26

from .model import get_model
from .plan import plan
from .report import assumptions_text, scope_text

__all__ = ["PAPER", "SweepSpec", "sweep", "table"]

GIB = 2 ** 30

# Paper Table 1 (16K prefill): (TTFT s, Comm GiB) — for comparison only.
PAPER = {
    "mars": {2: (1.68, 2.13), 4: (1.16, 3.02), 8: (0.97, 3.71), 16: (0.62, 5.12)},
    "ring": {2: (3.96, 1.94), 4: (2.46, 2.99), 8: (2.29, 3.70), 16: (1.91, 4.40)},
    "zigzag": {2: (3.81, 1.94), 4: (2.35, 2.99), 8: (2.18, 3.69), 16: (1.81, 4.40)},
}


@dataclass(frozen=True)
class SweepSpec:
    """What to sweep; the defaults are the paper's Table 1 setting on a KR260 ring."""
    model: str = "qwen2.5-1.5b"
    seq_len: int = 16384
    chunks: tuple[int | None, ...] = (1024,)       # None: B* by eq 8
    nodes: tuple[int, ...] = (2, 4, 8, 16)
    policies: tuple[str, ...] = ("mars", "ring", "zigzag")
    kv_budget_mib: float = 64.0
    buffer_mib: float = 8.0
    alpha: float = 0.5
    topology: str = "kr260-ring"
    link_gbps: float = 10.0
    dsps: int = K26["DSP"]
    mhz: float = 300.0
    scope: str = "model"


def sweep(spec: SweepSpec, keep_plans: bool = False) -> list[dict]:
    """One row per (N, B, policy); with ``keep_plans`` each row keeps its ``Plan`` as
    ``_plan`` (for plots; not JSON-serialisable). Raises :class:`mcf.mars.PlanError`."""
    from . import make_cluster  # defined in the package's __init__, which imports this module's
    # siblings first
    model = get_model(spec.model)
    rows = []
    for n in spec.nodes:
        for chunk in spec.chunks:
            for policy in spec.policies:
                cl = make_cluster(n, kv_budget_mib=spec.kv_budget_mib,
                                  buffer_mib=spec.buffer_mib, topology=spec.topology,
                                  link_gbps=spec.link_gbps, dsps=spec.dsps,
                                  clock_hz=spec.mhz * 1e6, scope=spec.scope)
                p = plan(model, cl, spec.seq_len, chunk, policy, spec.alpha)
                t = p.totals
                paper = PAPER.get(policy, {}).get(n)
                row = {
                    "policy": policy, "nodes": n, "chunk": p.chunk, "ttft_s": t.ttft_s,
                    "comm_gib_hops": t.comm_bytes / GIB, "delivered_gib": t.delivered_bytes / GIB,
                    "exposed_comm_s": t.t_exposed_comm_s,
                    "peak_node_kv_mib": t.peak_node_kv_bytes / 2 ** 20,
                    "memory_ok": t.memory_ok, "final_owner_only": t.final_owner_only,
                    "paper_ttft_s": paper[0] if paper else None,
                    "paper_comm_gib": paper[1] if paper else None,
                    "assumptions": assumptions_text(cl), "scope": scope_text(p),
                }
                if keep_plans:
                    row["_plan"] = p
                rows.append(row)
    return rows


def table(rows: list[dict], spec: SweepSpec) -> str:
    """The sweep as a plain-text table with its assumptions."""
    first = rows[0]
    out = [
        f"MARS cost-model sweep: {spec.model}, S = {spec.seq_len}, alpha = {spec.alpha}",
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
