"""MARS vs ring vs zigzag bench (``mcf bench plan``): the paper's Table 1 setting (16K prefill of
Qwen2.5-1.5B, B = 1024, 64 MiB of KV per node, alpha = 0.5, KR260 ring) through the MARS cost
model (:mod:`mcf.mars.sweep`). No simulation and no resources: these are model figures, and the
table says which assumptions produce them. ``small`` sweeps a 4K prompt on 2 and 4 nodes.
"""

from __future__ import annotations

import dataclasses

from mcf.mars.sweep import SweepSpec, sweep

from . import BenchRefused

__all__ = ["collect", "render"]


def collect(small: bool = False, synth: bool = True) -> dict:
    spec = SweepSpec(seq_len=4096, chunks=(512,), nodes=(2, 4)) if small else SweepSpec()
    rows = sweep(spec)
    bad = [f"{r['policy']} N={r['nodes']}" for r in rows
           if not (r["memory_ok"] and r["final_owner_only"])]
    if bad:
        raise BenchRefused(f"plans over the memory budget or not owner-only at the end: {bad}")
    return {"spec": dataclasses.asdict(spec), "rows": rows}


def render(result: dict) -> str:
    rows = result["rows"]
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    by = {(r["nodes"], r["policy"]): r for r in rows}
    head = ("| N | " + " | ".join(f"{p.upper() if p == 'mars' else p.capitalize()} TTFT s / GiB"
                                  for p in policies)
            + " | paper " + " / ".join(p.upper() if p == "mars" else p.capitalize()
                                       for p in policies) + " TTFT s |")
    lines = [head, "|---|" + "---|" * (len(policies) + 1)]
    for n in dict.fromkeys(r["nodes"] for r in rows):
        cells = [f"{by[n, p]['ttft_s']:.3f} / {by[n, p]['comm_gib_hops']:.3f}" for p in policies]
        paper = [by[n, p]["paper_ttft_s"] for p in policies]
        ptxt = " / ".join("–" if v is None else f"{v:.2f}" for v in paper)
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {ptxt} |")
    first = rows[0]
    lines += ["", f"Assumptions (N = {first['nodes']}; other N alike): {first['assumptions']}. "
              f"{first['scope']}."]
    return "\n".join(lines)
