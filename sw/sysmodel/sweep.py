"""The N sweep of the system model: MARS and every baseline of :data:`mcf.mars.sweep.SCHEMES`
(the same schedules MARS's cost model uses: bidirectional double-buffered ring and zigzag at the
same chunk, their unchunked versions, full replication, PD), each modelled by
:func:`.system.simulate_plan` on one link assumption; speedups by
:func:`mcf.mars.sweep.speedups` (the fair baselines: chunked ring and zigzag)."""

from __future__ import annotations

from dataclasses import dataclass

from ..mars.sweep import FAIR, SCHEMES, speedups
from .calibration import BenchFigures
from .network import LINKS, cluster_for
from .rates import NodeRates, peak_macs_per_cycle
from .system import SystemSpec, simulate_plan
from .work import compute_bound_s

__all__ = ["ModelSweep", "DEFAULT_SCHEMES", "run_sweep", "summary", "table", "clock_line"]

GIB = 2 ** 30

DEFAULT_SCHEMES = ("mars", "ring", "zigzag", "ring-unchunked", "zigzag-unchunked", "full", "pd")


@dataclass(frozen=True)
class ModelSweep:
    """What to sweep. ``alpha`` / ``kv_budget_mib`` are MARS's (eq 15, ``S_node``) with the
    setting they came from."""
    alpha: float
    kv_budget_mib: float
    setting: str = "paper"
    model: str = "qwen2.5-1.5b"
    seq_len: int = 16384
    chunk: int = 1024
    nodes: tuple[int, ...] = (2, 4, 8, 16)
    schemes: tuple[str, ...] = DEFAULT_SCHEMES
    link: str = "kr260-ring"
    node_config: str = "kr260"
    buffer_mib: float = 8.0
    spec: SystemSpec = SystemSpec()

    def __post_init__(self):
        if self.link not in LINKS:
            raise ValueError(f"unknown link {self.link!r} (one of {', '.join(LINKS)})")
        for s in self.schemes:
            if s not in SCHEMES:
                raise ValueError(f"unknown scheme {s!r} (one of {', '.join(SCHEMES)})")


def run_sweep(sw: ModelSweep, fig: BenchFigures, progress=None) -> list[dict]:
    """One row per (N, scheme). ``progress(label)`` is called before each model run.
    Raises :class:`mcf.mars.PlanError` for a plan MARS refuses."""
    from ..mars import get_model, plan
    model = get_model(sw.model)
    rates = NodeRates.calibrated(fig, sw.node_config, model, overheads=sw.spec.overheads)
    peak, _ = peak_macs_per_cycle(fig, sw.node_config)
    rows = []
    c = fig.clock_hz
    for n in sw.nodes:
        cl = cluster_for(sw.link, n, sw.kv_budget_mib, node_config=sw.node_config,
                         buffer_mib=sw.buffer_mib, scope=sw.spec.scope, clock_hz=fig.clock_hz)
        for scheme in sw.schemes:
            policy, unchunked, bidir, what = SCHEMES[scheme]
            if progress is not None:
                progress(f"N={n} {scheme}")
            b = sw.seq_len if unchunked else sw.chunk
            p = plan(model, cl, sw.seq_len, b, policy, sw.alpha, bidirectional=bidir,
                     streams=not unchunked)
            r = simulate_plan(p, fig, sw.spec, rates)
            rows.append({
                "scheme": scheme, "baseline": what, "model": sw.model, "nodes": n,
                "seq_len": sw.seq_len, "chunk": p.chunk, "scope": sw.spec.scope,
                "node_config": sw.node_config,
                "clock_hz": c,
                "ttft_s": r.ttft_s, "compute_s": r.compute_cycles / c,
                "exposed_comm_s": r.exposed_cycles / c,
                "min_busy_fraction": min(r.busy_fraction()),
                "compute_bound_s": compute_bound_s(model, sw.seq_len, n, peak, c,
                                                   sw.spec.scope),
                "macs_per_cycle_peak": peak,
                "cost_model_ttft_s": p.totals.ttft_s,
                "comm_gib_hops": p.totals.comm_bytes / GIB,
                "peak_node_kv_mib": p.totals.peak_node_kv_bytes / 2 ** 20,
                "memory_ok": p.totals.memory_ok,
            })
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """MARS's speedup over each fair baseline and the best of them, per N; and the gap to full
    replication (MARS TTFT / full TTFT) where both were modelled."""
    out = speedups(rows)
    by = {(r["nodes"], r["scheme"]): r for r in rows}
    for s in out:
        full = by.get((s["nodes"], "full"))
        if full is not None:
            s["full_replication_gap"] = by[(s["nodes"], "mars")]["ttft_s"] / full["ttft_s"]
    return out


def clock_line(fig: BenchFigures) -> str:
    """How the clock enters: seconds = cycles / clock; the links' per-cycle rates derived from
    their bit/s and seconds at that clock."""
    from ..abi.platform import ACLK_HZ
    what = "the ABI's assumed aclk, mcf.abi.platform.ACLK_HZ" if fig.clock_hz == ACLK_HZ else \
        f"given; the ABI assumes {ACLK_HZ / 1e6:g} MHz"
    return (f"clock: every cycle at {fig.clock_hz / 1e6:g} MHz ({what}; no fmax claimed); "
            "link line rates per cycle = bit/s / 8 / clock, cable latency in cycles = "
            "seconds x clock, NIC and node figures in cycles as measured")


def table(rows: list[dict], sw: ModelSweep, fig: BenchFigures) -> str:
    """The sweep as text with its assumptions."""
    spec = sw.spec
    peak, peak_src = peak_macs_per_cycle(fig, sw.node_config)
    covers = ("the layer program of all layers (Q/K/V, attention, O, MLP) for the whole "
              "prompt; no embedding or LM head" if spec.scope == "model"
              else "the ATTEND records of all layers alone")
    out = [
        f"system model: {sw.model}, S = {sw.seq_len}, B = {sw.chunk}, {sw.node_config} nodes, "
        f"{sw.setting} setting (alpha = {sw.alpha:g}, S_node = {sw.kv_budget_mib:.1f} MiB)",
        f"links: {sw.link} - {LINKS[sw.link].text}",
        clock_line(fig),
        f"TTFT covers {covers}; layout {spec.layout}; "
        + ("node-program overheads from the layer bench" if spec.overheads
           else "engine rates alone (no node-program overheads)"),
        "exposed = cycles the busiest node's compute does not cover; bound = the compute bound "
        f"at the node's own peak (prefill ops / (N x 2 x {peak} MACs/cycle x clock): "
        f"{peak_src}); cost model = MARS's analytic TTFT for the same plan, a bound at the "
        "K26's DSP peak (every DSP doing 4 ops per cycle)",
        "schemes: " + "; ".join(f"{s} = {SCHEMES[s][3]}" for s in sw.schemes),
        "",
        f"{'scheme':<17} {'N':>3} {'B':>6} {'TTFT s':>10} {'compute s':>10} {'exposed s':>10} "
        f"{'busy min':>9} {'Comm GiB':>9} {'bound s':>9} {'cost model s':>12}",
    ]
    for r in rows:
        mem = "" if r["memory_ok"] else " (over S_node)"
        out.append(f"{r['scheme']:<17} {r['nodes']:>3} {r['chunk']:>6} {r['ttft_s']:>10.3f} "
                   f"{r['compute_s']:>10.3f} {r['exposed_comm_s']:>10.3f} "
                   f"{r['min_busy_fraction']:>9.3f} {r['comm_gib_hops']:>9.3f} "
                   f"{r['compute_bound_s']:>9.3f} {r['cost_model_ttft_s']:>12.3f}{mem}")
    sp = summary(rows)
    if sp:
        out += ["", "MARS speedup (baseline TTFT / MARS TTFT):"]
        for s in sp:
            gap = f"; MARS / full replication {s['full_replication_gap']:.3f}" \
                if "full_replication_gap" in s else ""
            out.append(f"  N = {s['nodes']:>2}: " + ", ".join(
                f"vs {f} {s[f'speedup_vs_{f}']:.3f}x" for f in FAIR)
                + f"; vs the best fair ({s['best_fair']}) {s['speedup_vs_best_fair']:.3f}x{gap}")
    return "\n".join(out)
