"""MARS vs the baselines (``mcf bench plan``): the paper's Table 1 setting (16K prefill of
Qwen2.5-1.5B, B = 1024, kr260 nodes on a KR260 ring) through the MARS cost model
(:mod:`mcf.mars.sweep`), three tables: the paper's setting (α = 0.5, S_node = 64 MiB) for the
whole model and for attention only, and the board's setting (S_node = the KR260's DDR after the
weights, :func:`mcf.mars.setting.board_setting`). Every scheme states its baseline
(:data:`mcf.mars.sweep.SCHEMES`). No simulation and no resources: these are model figures, and
each table says which assumptions produce them. ``small`` sweeps a 4K prompt on 2 and 4 nodes.
"""

from __future__ import annotations

import dataclasses

from mcf.mars import get_model
from mcf.mars.setting import get_setting
from mcf.mars.sweep import FAIR, SCHEMES, SweepSpec, speedups, sweep

from . import BenchRefused

__all__ = ["collect", "render", "TABLES", "BENCH_SCHEMES", "UNBUDGETED"]

BENCH_SCHEMES = ("mars", "ring", "zigzag", "ring-unchunked", "zigzag-unchunked", "full", "pd")
UNBUDGETED = ("full", "pd")
"""Schemes that do not plan within S_node (their peak is reported, flagged when over it)."""
TABLES = (("paper", "model"), ("paper", "attention"), ("board", "model"))
"""(setting, scope) of each table."""


def _spec(setting: str, scope: str, small: bool) -> SweepSpec:
    model = "qwen2.5-1.5b"
    st = get_setting(setting, get_model(model))
    size = dict(seq_len=4096, chunks=(512,), nodes=(2, 4)) if small else {}
    return SweepSpec(alpha=st.alpha, kv_budget_mib=st.kv_budget_mib, setting=setting,
                     model=model, schemes=BENCH_SCHEMES, scope=scope, **size)


def collect(small: bool = False, synth: bool = True) -> dict:
    tables, flat = [], []
    for setting, scope in TABLES:
        spec = _spec(setting, scope, small)
        rows = sweep(spec)
        bad = [f"{r['scheme']} N={r['nodes']}" for r in rows
               if not r["final_owner_only"] or (r["scheme"] not in UNBUDGETED
                                                and not r["memory_ok"])]
        if bad:
            raise BenchRefused(f"plans over the memory budget or not owner-only at the end: "
                               f"{bad}")
        st = get_setting(setting, get_model(spec.model))
        tables.append({"setting": setting, "setting_source": st.source, "scope": scope,
                       "spec": dataclasses.asdict(spec), "rows": rows,
                       "speedups": speedups(rows)})
        flat += [r | {"setting": setting} for r in rows]
    return {"tables": tables, "rows": flat}


def _name(s: str) -> str:
    return "MARS" if s == "mars" else s


def render(result: dict) -> str:
    """Markdown: one table per (setting, scope), each followed by its caption."""
    out = []
    for tab in result["tables"]:
        rows, spec = tab["rows"], tab["spec"]
        schemes = list(dict.fromkeys(r["scheme"] for r in rows))
        by = {(r["nodes"], r["scheme"]): r for r in rows}
        sp = {s["nodes"]: s for s in tab["speedups"]}
        paper = tab["setting"] == "paper" and tab["scope"] == "model"
        head = ["N"] + [_name(s) for s in schemes] + ["MARS vs best fair"]
        if paper:
            head.append("paper MARS / ring / zigzag s")
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        for n in dict.fromkeys(r["nodes"] for r in rows):
            cells = [str(n)]
            for s in schemes:
                r = by[n, s]
                flag = "" if r["memory_ok"] else "*"
                cells.append(f"{r['ttft_s']:.3f} / {r['comm_gib_hops']:.2f}{flag}")
            s = sp.get(n)
            cells.append(f"{s['speedup_vs_best_fair']:.2f}× ({s['best_fair']})" if s else "–")
            if paper:
                pv = [by[n, k]["paper_ttft_s"] if (n, k) in by else None
                      for k in ("mars", "ring", "zigzag")]
                cells.append(" / ".join("–" if v is None else f"{v:.2f}" for v in pv))
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
        out.append(f"Above: **{tab['setting']} setting** (α = {spec['alpha']:g}, "
                   f"S_node = {spec['kv_budget_mib']:.1f} MiB: {tab['setting_source']}); "
                   f"{rows[0]['scope']}; cells are TTFT s / traffic GiB × hops.")
        out.append("")
    first = result["tables"][0]["rows"][0]
    out.append("Baselines: " + "; ".join(f"{_name(s)} = {SCHEMES[s][3]}" for s in BENCH_SCHEMES)
               + f". Fair baselines (the speedup column): {', '.join(FAIR)} at the same B. "
               "`*`: over S_node (full replication and PD's prefill pool do not plan "
               "within the budget).")
    out.append("")
    out.append(f"Assumptions (N = {first['nodes']}, first table; other N and tables alike but "
               f"for the scope and S_node stated above): {first['assumptions']}.")
    return "\n".join(out)
