"""Table-1-style sweep (paper §6.5): prefill TTFT and traffic of MARS and the baselines over the
node count, from the MARS cost model, beside the paper's own figures. Used by
``scripts/plan_sweep.py`` (every knob as a flag, plots) and ``mcf bench plan`` (the README's
tables). Every figure is computed from the stated assumptions; nothing is fitted to the paper.

Schemes (:data:`SCHEMES`), all on the same network, compute model and chunk size ``B`` unless
the scheme says otherwise:

* ``mars`` — MARS (eq 16 factors, blocks keep ``r(i)``, budget-forced drains, deadline).
* ``ring`` / ``zigzag`` — Ring / Zigzag Attention, double-buffered (a block is forwarded while
  the next arrives: the model charges link loads and chain latency, never store-and-forward
  serialisation) and bidirectional (each history slice goes both ways round the full-duplex
  ring, half of the receivers each way), at the same ``B``.
* ``ring-1way`` / ``zigzag-1way`` — the same streaming one way round (the earlier baseline).
* ``ring-unchunked`` / ``zigzag-unchunked`` — one chunk, ``B = S`` (bidirectional).
* ``full`` — full replication (``r = N`` for every block, ignoring ``S_node``).
* ``pd`` — PD disaggregation: zigzag on ⌊N/2⌋ nodes, then the KV hand-off.

The *fair* baselines MARS is compared with are the chunked bidirectional ring and zigzag
(:data:`FAIR`).
"""

from __future__ import annotations

from dataclasses import dataclass

from mcf.abi.platform import ACLK_HZ, K26

from .model import get_model
from .plan import plan
from .report import assumptions_text, scope_text

__all__ = ["PAPER", "SCHEMES", "FAIR", "SweepSpec", "sweep", "table", "speedups"]

GIB = 2 ** 30

# Paper Table 1 (16K prefill): (TTFT s, Comm GiB) — for comparison only.
PAPER = {
    "mars": {2: (1.68, 2.13), 4: (1.16, 3.02), 8: (0.97, 3.71), 16: (0.62, 5.12)},
    "ring": {2: (3.96, 1.94), 4: (2.46, 2.99), 8: (2.29, 3.70), 16: (1.91, 4.40)},
    "zigzag": {2: (3.81, 1.94), 4: (2.35, 2.99), 8: (2.18, 3.69), 16: (1.81, 4.40)},
}

# scheme -> (policy, unchunked, bidirectional, what it is)
SCHEMES: dict[str, tuple[str, bool, bool, str]] = {
    "mars": ("mars", False, True, "MARS"),
    "ring": ("ring", False, True, "Ring Attention, double-buffered, bidirectional, same B"),
    "zigzag": ("zigzag", False, True, "Zigzag Attention, double-buffered, bidirectional, "
               "same B"),
    "ring-1way": ("ring", False, False, "Ring Attention streaming one way round, same B"),
    "zigzag-1way": ("zigzag", False, False, "Zigzag Attention streaming one way round, same B"),
    "ring-unchunked": ("ring", True, True, "Ring Attention unchunked (B = S), bidirectional"),
    "zigzag-unchunked": ("zigzag", True, True, "Zigzag Attention unchunked (B = S), "
                         "bidirectional"),
    "full": ("full", False, True, "full replication (r = N for every block, no budget)"),
    "pd": ("pd", False, True, "PD disaggregation: zigzag on N/2 nodes, then KV hand-off"),
}
FAIR = ("ring", "zigzag")
"""The fair chunked baselines MARS's speedup is stated against."""


@dataclass(frozen=True)
class SweepSpec:
    """What to sweep. ``alpha`` and ``kv_budget_mib`` (``S_node``) are explicit; ``setting``
    names where they come from (:mod:`mcf.mars.setting`). The defaults are the paper's
    Table 1 setting on a KR260 ring of kr260 nodes."""
    alpha: float
    kv_budget_mib: float
    setting: str = "paper"
    model: str = "qwen2.5-1.5b"
    seq_len: int = 16384
    chunks: tuple[int | None, ...] = (1024,)       # None: B* by eq 8
    nodes: tuple[int, ...] = (2, 4, 8, 16)
    schemes: tuple[str, ...] = ("mars", "ring", "zigzag")
    buffer_mib: float = 8.0
    topology: str = "kr260-ring"
    link_gbps: float = 10.0
    dsps: int = K26["DSP"]
    mhz: float = ACLK_HZ / 1e6
    scope: str = "model"
    node_config: str = "kr260"


def sweep(spec: SweepSpec, keep_plans: bool = False) -> list[dict]:
    """One row per (N, B, scheme); with ``keep_plans`` each row keeps its ``Plan`` as
    ``_plan`` (for plots; not JSON-serialisable). Raises :class:`mcf.mars.PlanError`."""
    from . import PlanError, make_cluster  # defined in the package's __init__
    model = get_model(spec.model)
    rows = []
    for n in spec.nodes:
        for chunk in spec.chunks:
            for scheme in spec.schemes:
                if scheme not in SCHEMES:
                    raise PlanError(f"unknown scheme {scheme!r} (one of {', '.join(SCHEMES)})")
                policy, unchunked, bidir, what = SCHEMES[scheme]
                cl = make_cluster(n, spec.kv_budget_mib, node_config=spec.node_config,
                                  buffer_mib=spec.buffer_mib, topology=spec.topology,
                                  link_gbps=spec.link_gbps, dsps=spec.dsps,
                                  clock_hz=spec.mhz * 1e6, scope=spec.scope)
                b = spec.seq_len if unchunked else chunk
                p = plan(model, cl, spec.seq_len, b, policy, spec.alpha, bidirectional=bidir,
                         streams=not unchunked)
                t = p.totals
                paper = PAPER.get(scheme, {}).get(n)
                row = {
                    "scheme": scheme, "policy": policy, "baseline": what, "nodes": n,
                    "chunk": p.chunk, "ttft_s": t.ttft_s,
                    "comm_gib_hops": t.comm_bytes / GIB, "delivered_gib": t.delivered_bytes / GIB,
                    "exposed_comm_s": t.t_exposed_comm_s,
                    "peak_node_kv_mib": t.peak_node_kv_bytes / 2 ** 20,
                    "memory_ok": t.memory_ok, "final_owner_only": t.final_owner_only,
                    "pressure_drains": t.pressure_drains,
                    "paper_ttft_s": paper[0] if paper else None,
                    "paper_comm_gib": paper[1] if paper else None,
                    "assumptions": assumptions_text(cl), "scope": scope_text(p),
                }
                if keep_plans:
                    row["_plan"] = p
                rows.append(row)
    return rows


def speedups(rows: list[dict]) -> list[dict]:
    """Per (N, chunked B): MARS's TTFT over each fair baseline's and over the best of them
    (``> 1``: MARS is faster); only where MARS and every fair baseline were swept."""
    out = []
    by = {(r["nodes"], r["chunk"], r["scheme"]): r for r in rows}
    for (n, b, scheme), r in by.items():
        if scheme != "mars" or not all((n, b, f) in by for f in FAIR):
            continue
        fair = {f: by[n, b, f]["ttft_s"] for f in FAIR}
        best = min(fair, key=fair.get)
        out.append({"nodes": n, "chunk": b, "best_fair": best,
                    "speedup_vs_best_fair": fair[best] / r["ttft_s"],
                    **{f"speedup_vs_{f}": v / r["ttft_s"] for f, v in fair.items()}})
    return out


def table(rows: list[dict], spec: SweepSpec) -> str:
    """The sweep as a plain-text table with its assumptions and every scheme's baseline."""
    first = rows[0]
    out = [
        f"MARS cost-model sweep: {spec.model}, S = {spec.seq_len}, {spec.setting} setting "
        f"(alpha = {spec.alpha:g}, S_node = {spec.kv_budget_mib:.1f} MiB), "
        f"{spec.node_config} nodes",
        f"assumptions (N = {first['nodes']}; other N alike): {first['assumptions']}",
        f"{first['scope']}. Comm = bytes x hops over the run; delivered = bytes received.",
        "schemes: " + "; ".join(f"{s} = {SCHEMES[s][3]}" for s in spec.schemes),
        "",
        f"{'scheme':<16} {'N':>3} {'B':>6} {'TTFT s':>9} {'exposed':>8} {'Comm GiB':>9} "
        f"{'deliv GiB':>9} {'peak MiB':>9} | {'paper TTFT':>10} {'paper GiB':>9}",
    ]
    for r in rows:
        pt = f"{r['paper_ttft_s']:.2f}" if r["paper_ttft_s"] is not None else "-"
        pc = f"{r['paper_comm_gib']:.2f}" if r["paper_comm_gib"] is not None else "-"
        mem = "" if r["memory_ok"] else " (over budget)"
        out.append(f"{r['scheme']:<16} {r['nodes']:>3} {r['chunk']:>6} {r['ttft_s']:>9.3f} "
                   f"{r['exposed_comm_s']:>8.3f} {r['comm_gib_hops']:>9.3f} "
                   f"{r['delivered_gib']:>9.3f} {r['peak_node_kv_mib']:>9.1f} | {pt:>10} "
                   f"{pc:>9}{mem}")
    sp = speedups(rows)
    if sp:
        out += ["", "MARS speedup (TTFT of the baseline / TTFT of MARS):"]
        for s in sp:
            out.append(f"  N = {s['nodes']:>2}, B = {s['chunk']}: "
                       + ", ".join(f"vs {f} {s[f'speedup_vs_{f}']:.3f}x" for f in FAIR)
                       + f"; vs the best fair baseline ({s['best_fair']}) "
                       f"{s['speedup_vs_best_fair']:.3f}x")
    return "\n".join(out)
