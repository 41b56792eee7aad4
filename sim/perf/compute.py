"""Matrix half of the compute engine: GEMM jobs back to back, DMA efficiency, MACs per DSP,
resources (paper §5, Fig. 2: the ping-pong DMA loader; docs/compute.md).

Cycles come from cocotb + Verilator runs of :class:`mcf.hdl.compute.gemm.GemmEngine` (16 × 16
array, group :data:`mcf.abi.quant.GROUP_SIZE`, 64-token chunks) fed by stream sources at one
128-bit beat per cycle on each of the activation and weight streams — what one HP port
delivers through the DMA loader (measured separately, ``dma_efficiency``). Every job of every
sequence is checked bit-exact against :func:`mcf.golden.gemm.gemm`; a mismatch, a rejected job
descriptor, a step count other than planned, or a failed/hung simulation raises
:class:`~mcf.sim.perf.BenchRefused`.

Sequences (Qwen2.5-1.5B shapes, N sliced so the simulation stays short; K = 1536, and
K = 8960 for the down projection): Q, K, V projections of one chunk, then gate, up, down; in
the full run also the Q and the down prefill jobs each alone, for contrast.

* ``gemm_sequence_mac_utilization`` — prefill sequence, whole: k-steps × 256 MACs over the
  cycles from the first job descriptor to the last result beat (includes loading the first
  activations and tile and draining the last tile).
* ``gemm_steady_mac_utilization`` — same sequence, steady state: k-steps issued after the first
  result beat over the cycles from the first to the last result beat.
* ``decode_port_efficiency`` — decode sequence (M = 1, bandwidth bound): weight-stream bytes
  over (cycles × 16 B), first descriptor to last result.
* ``dma_efficiency`` — one long DMA read against AxiRam answering every burst 100 cycles after
  its AR (pipelined like DDR): bytes delivered (checked) over (cycles × 16 B).
* ``macs_per_dsp`` — 256 MACs/cycle over the DSP48E2s of the GEMM engine (and of the array).
* ``resources`` — :func:`mcf.sim.synth.resources` of :class:`MatrixEngine` (defaults, URAM
  inference), of the kr260's ``MatrixEngine(arrays=4)`` (``matrix_engine_kr260``) and of the
  GEMM parts, LUTs mapped with yosys ``abc`` (``abc9=False``: the bundled ABC9 fails on the
  packed dot-product array); no fmax is claimed.
* ``kr260`` — the kr260 node's GEMM (docs/node.md §11): :class:`GemmEngine` with
  :data:`KR260_ARRAYS` token-parallel arrays (1,024 MACs/cycle) and a 512-bit ``w_in`` (four
  HP ports in lockstep, §4), run on the same sequences with N four times as large (so a job
  still computes about as long as the next job's activations take to load, as on one array;
  real N, 1536–8960, is larger still). ``macs_per_cycle`` (whole prefill sequence) and
  ``steady_macs_per_cycle`` (first to last result) count the k-steps of all arrays × 256;
  utilisations divide by 1,024; the decode port efficiency by 64 B/cycle.

``small=True`` runs 16-token chunks (without the down projection in the prefill sequence, see
:func:`sequences`), half the decode slices and a shorter DMA read (CI).

    mcf bench compute [--small] [--no-synth] [--json]
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from mcf.abi.compute import GEMM_STATUS
from mcf.abi.node_config import KR260
from mcf.abi.quant import GROUP_SIZE
from mcf.sim.perf import BenchRefused, refuse_unplanned, resource_table

__all__ = ["collect", "render", "sequences", "gemm_build", "ROWS", "LANES", "KR260_ARRAYS"]

ROWS, LANES = 16, 16
BEAT_BYTES = LANES
HIDDEN, INTER = 1536, 8960
M_CHUNK, M_SMALL = 64, 16
DMA_LATENCY = 100
KR260_ARRAYS, KR260_W_BYTES, KR260_N_SCALE = KR260.gemm_arrays, 64, 4   # docs/node.md §4, §11
# the kr260 arrays' lane sums: DSP48E2 cascades, simulated with the slice model (same cycles)
KR260_CHAIN = KR260.gemm_chain
KR260_SIM_DSP = "model" if KR260.gemm_dsp == "primitive" else KR260.gemm_dsp
# N of each projection in the sequences (slices of 1536 / 256 / 256 / 8960 / 8960 / 1536)
SLICES = (("q", HIDDEN, 128), ("k", HIDDEN, 64), ("v", HIDDEN, 64), ("gate", HIDDEN, 64),
          ("up", HIDDEN, 96), ("down", INTER, 32))


def sequences(small: bool = False, n_scale: int = 1) -> list[dict]:
    """The job sequences the bench runs: ``prefill`` (M = chunk) and ``decode`` (M = 1).

    The small prefill sequence leaves out the down projection: one K = 8960 tile takes 4,624
    weight beats to load, which hides behind the previous tile's ``M · 96`` cycles only for
    M ≥ 48 (the full run's 64-token chunk does; 16 tokens do not). ``n_scale`` multiplies
    every N (the kr260 run)."""
    m = M_SMALL if small else M_CHUNK
    out = []
    for name, tokens, seed in (("prefill", m, 10), ("decode", 1, 20)):
        slices = SLICES[:-1] if small and name == "prefill" else SLICES
        half = small and name == "decode"          # CI: half the decode weights
        jobs = [{"proj": p, "m": tokens, "n": (n // 2 if half else n) * n_scale, "k": k,
                 "seed": seed + i}
                for i, (p, k, n) in enumerate(slices)]
        out.append({"name": name, "jobs": jobs})
    if not small:   # each prefill shape alone, for contrast (first descriptor to last result)
        for job in (out[0]["jobs"][0], out[0]["jobs"][-1]):
            out.append({"name": f"{job['proj']}_alone", "jobs": [job]})
    return out


def _refuse_sequence(r: dict, planned_bad: int = 0) -> None:
    what = f"GEMM sequence {r['name']}"
    bad = [i for i, n in enumerate(r["mismatches"]) if n]
    if bad:
        raise BenchRefused(f"{what}: results differ from mcf.golden.gemm in jobs {bad} "
                           f"({[r['mismatches'][i] for i in bad]} values)")
    st = r["status"]
    refuse_unplanned(what, {"bad_jobs": st["bad_jobs"]}, {"bad_jobs": planned_bad})
    refuse_unplanned(what, {"jobs_done": st["jobs_done"], "steps": r["steps"]},
                     {"jobs_done": len(r["jobs"]), "steps": r["planned_steps"]})


def gemm_build(arrays: int = 1, w_bytes: int = BEAT_BYTES, chain: int = 1,
               dsp: str = "fabric"):
    """The Verilator build of the bench's :class:`GemmEngine` (K up to the down projection's,
    M up to a chunk), shared with ``tests/test_gemm_cocotb.py``: ``arrays=KR260_ARRAYS,
    w_bytes=KR260_W_BYTES, chain=KR260_CHAIN, dsp=KR260_SIM_DSP`` is the kr260 node's."""
    from mcf.hdl.compute.gemm import GemmEngine
    from mcf.hdl.flat import FlatTop
    from mcf.sim import build

    axis = {"job": "job", "x_in": "s_axis_x", "w_in": "s_axis_w", "o": "m_axis_y"}
    top = FlatTop(GemmEngine(ROWS, LANES, GROUP_SIZE, k_max=INTER, m_max=M_CHUNK,
                             arrays=arrays, w_width=8 * w_bytes, chain=chain, dsp=dsp), axis)
    name = f"gemm_engine_m{M_CHUNK}" if arrays == 1 and w_bytes == BEAT_BYTES else \
        f"gemm_engine_x{arrays}_w{8 * w_bytes}_m{M_CHUNK}"
    if chain > 1:
        name += f"_c{chain}_{dsp}"
    return build(top, name, describe=f"GemmEngine({ROWS}, {LANES}, {GROUP_SIZE}, k_max={INTER}, "
                 f"m_max={M_CHUNK}, arrays={arrays}, w_width={8 * w_bytes}, chain={chain}, "
                 f"dsp={dsp!r}) as {axis}")


def gemm_sequences(small: bool, sabotage: list[dict] | None = None, arrays: int = 1,
                   w_bytes: int = BEAT_BYTES, n_scale: int = 1, chain: int = 1,
                   dsp: str = "fabric") -> list[dict]:
    from mcf.sim import run

    built = gemm_build(arrays, w_bytes, chain, dsp)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gemm.json"
        params = {"rows": ROWS, "lanes": LANES, "group": GROUP_SIZE, "w_bytes": w_bytes,
                  "sequences": sequences(small, n_scale), "out": str(out),
                  "sabotage": sabotage}
        try:
            run(built, "mcf.sim.benches.gemm_engine", params=params)
        except AssertionError as exc:
            if not out.exists():
                raise BenchRefused(f"GEMM sequences: simulation failed: {exc}") from exc
            for r in json.loads(out.read_text()):
                _refuse_sequence(r)
            raise BenchRefused(f"GEMM sequences: bench check failed: {exc}") from exc
        rows = json.loads(out.read_text())
    for r in rows:
        _refuse_sequence(r)
    return rows


def dma_read(small: bool) -> dict:
    from mcf.hdl.flat import FlatTop
    from mcf.hdl.mem.dma import DmaLoader
    from mcf.sim import build, run

    axis = {"rd_desc": "s_axis_rd_desc", "rd": "m_axis_rd", "wr_desc": "s_axis_wr_desc",
            "wr": "s_axis_wr"}
    built = build(FlatTop(DmaLoader(128), axis), "dma_loader_128")
    length = 1 << (16 if small else 18)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "dma.json"
        try:
            run(built, "mcf.sim.benches.dma_loader",
                params={"tests": ["efficiency"], "latency": DMA_LATENCY, "lengths": [length],
                        "ar_pause": 0, "r_pause": 0, "bp": 0, "idle": 0, "out": str(out)})
        except AssertionError as exc:
            raise BenchRefused(f"DMA read: {exc}") from exc
        r = json.loads(out.read_text())[0]
    if not r["match"]:
        raise BenchRefused("DMA read: delivered bytes differ from the memory")
    refuse_unplanned("DMA read", {"rd_errors": r["rd_errors"], "rd_rejects": r["rd_rejects"]})
    r["efficiency"] = r["bytes"] / (r["cycles"] * r["beat_bytes"])
    return r


def _figures(r: dict, arrays: int = 1, w_bytes: int = BEAT_BYTES) -> dict:
    macs = ROWS * LANES
    steady_steps = r["steps"] - r["steps_at_first_out"]
    steady_cycles = r["cycles"] - r["first_out"]
    out = {
        "macs": r["steps"] * macs,
        "mac_utilization": round(r["steps"] / (r["cycles"] * arrays), 4),
        "steady_mac_utilization": round(steady_steps / (steady_cycles * arrays), 4),
        "port_efficiency": round(r["w_bytes"] / (r["cycles"] * w_bytes), 4),
        "input_bytes_per_cycle": round((r["x_bytes"] + r["w_bytes"]) / r["cycles"], 3),
    }
    if arrays > 1:
        out["macs_per_cycle"] = round(r["steps"] * macs / r["cycles"], 1)
        out["steady_macs_per_cycle"] = round(steady_steps * macs / steady_cycles, 1)
    return out


def kr260_gemm(small: bool) -> dict:
    """The kr260 GEMM (see the module docstring) on the bench's sequences, N × 4."""
    seqs = gemm_sequences(small, arrays=KR260_ARRAYS, w_bytes=KR260_W_BYTES,
                          n_scale=KR260_N_SCALE, chain=KR260_CHAIN, dsp=KR260_SIM_DSP)
    for r in seqs:
        r.update(_figures(r, KR260_ARRAYS, KR260_W_BYTES))
    by = {r["name"]: r for r in seqs}
    pre = by["prefill"]
    return {
        "arrays": KR260_ARRAYS, "macs_per_cycle_peak": KR260_ARRAYS * ROWS * LANES,
        "w_bytes": KR260_W_BYTES, "n_scale": KR260_N_SCALE,
        "macs_per_cycle": pre["macs_per_cycle"],
        "steady_macs_per_cycle": pre["steady_macs_per_cycle"],
        "mac_utilization": pre["mac_utilization"],
        "steady_mac_utilization": pre["steady_mac_utilization"],
        "decode_port_efficiency": by["decode"]["port_efficiency"],
        "sequences": seqs,
    }


def synth_figures() -> dict:
    from mcf.hdl.compute.gemm import GemmEngine
    from mcf.hdl.compute.gemm_array import GemmArray
    from mcf.hdl.compute.gemm_top import MatrixEngine
    from mcf.hdl.flat import FlatTop
    from mcf.sim.synth import resources, utilization

    res = {
        "matrix_engine": resources(FlatTop(MatrixEngine()), "mcf_matrix_engine", uram=True,
                                   abc9=False),
        "matrix_engine_kr260": resources(
            FlatTop(MatrixEngine(arrays=KR260_ARRAYS, k_max=INTER, m_max=M_CHUNK,
                                 chain=KR260_CHAIN, dsp=KR260.gemm_dsp)),
            "mcf_matrix_engine_x4", uram=True, abc9=False),
        # DSPs do not depend on buffer depths: a small-buffer engine gives them quickly
        "gemm_engine_dsp": resources(GemmEngine(ROWS, LANES, GROUP_SIZE, k_max=1024,
                                                m_max=4), "mcf_gemm_dsp", abc9=False),
        "gemm_array": resources(GemmArray(ROWS, LANES, GROUP_SIZE), "mcf_gemm_array",
                                abc9=False),
    }
    macs = ROWS * LANES
    return {
        "resources": res,
        "k26_fraction": {k: round(v, 4)
                         for k, v in utilization(res["matrix_engine"]).items()},
        "k26_fraction_kr260": {k: round(v, 4)
                               for k, v in utilization(res["matrix_engine_kr260"]).items()},
        "macs_per_dsp": round(macs / res["gemm_engine_dsp"]["DSP"], 3),
        "macs_per_array_dsp": round(macs / res["gemm_array"]["DSP"], 3),
    }


def collect(small: bool = False, synth: bool = True, *,
            sabotage: list[dict] | None = None) -> dict:
    """Run the GEMM sequences and the DMA read (see the module docstring). ``sabotage`` (tests
    only) goes to the GEMM bench: a list of ``{"sequence", "job", "kind": "weights" |
    "bad_job"}`` — the bench must then refuse."""
    seqs = gemm_sequences(small, sabotage)
    for r in seqs:
        r.update(_figures(r))
    by = {r["name"]: r for r in seqs}
    dma = dma_read(small)
    kr260 = kr260_gemm(small)
    out = {
        "gemm_sequence_mac_utilization": by["prefill"]["mac_utilization"],
        "gemm_steady_mac_utilization": by["prefill"]["steady_mac_utilization"],
        "decode_port_efficiency": by["decode"]["port_efficiency"],
        "dma_efficiency": round(dma["efficiency"], 4),
        "array": {"rows": ROWS, "lanes": LANES, "group": GROUP_SIZE,
                  "macs_per_cycle": ROWS * LANES, "beat_bytes": BEAT_BYTES},
        "sequences": seqs,
        "dma": dma,
        "status_layout": [n for n, _ in GEMM_STATUS],
        "kr260": kr260,
    }
    if synth:
        out.update(synth_figures())
    return out


def render(result: dict) -> str:
    a = result["array"]
    lines = [f"GEMM {a['rows']}x{a['lanes']} array ({a['macs_per_cycle']} MAC/cycle), group "
             f"{a['group']}, activations and weights at {a['beat_bytes']} B/cycle each; jobs "
             "queued back to back, every result bit-exact vs mcf.golden.gemm",
             f"{'sequence':10} {'job':5} {'M':>3} {'N':>4} {'K':>5}"]
    for r in result["sequences"]:
        for j in r["jobs"]:
            lines.append(f"{r['name']:10} {j['proj']:5} {j['m']:>3} {j['n']:>4} {j['k']:>5}")
    lines.append("")
    lines.append(f"{'sequence':10} {'MACs':>11} {'cycles':>8} {'MAC util':>9} "
                 f"{'steady':>7} {'w-port eff':>10} {'in B/cyc':>8}")
    for r in result["sequences"]:
        lines.append(f"{r['name']:10} {r['macs']:>11,} {r['cycles']:>8,} "
                     f"{r['mac_utilization']:>9.2%} {r['steady_mac_utilization']:>7.2%} "
                     f"{r['port_efficiency']:>10.2%} {r['input_bytes_per_cycle']:>8.2f}")
    lines += [
        "",
        "MAC util = k-steps x 256 / cycles from the first job descriptor to the last result "
        "(whole sequence);",
        "steady = the same from the first result beat to the last; w-port eff = weight bytes / "
        "(cycles x 16 B).",
        f"gemm_sequence_mac_utilization {result['gemm_sequence_mac_utilization']:.2%} "
        f"(prefill, whole); gemm_steady_mac_utilization "
        f"{result['gemm_steady_mac_utilization']:.2%}; decode_port_efficiency "
        f"{result['decode_port_efficiency']:.2%}",
    ]
    d = result["dma"]
    lines.append(f"DMA read {d['bytes']:,} B, latency {d['latency']} cycles: {d['cycles']:,} "
                 f"cycles, {d['bytes'] / d['cycles']:.2f} of {d['beat_bytes']} B/cycle = "
                 f"{result['dma_efficiency']:.2%}")
    if "resources" in result:
        res = result["resources"]
        lines.append(f"MACs per DSP48E2: {result['macs_per_dsp']} (GEMM engine, "
                     f"{res['gemm_engine_dsp']['DSP']} DSP); array alone "
                     f"{result['macs_per_array_dsp']} ({res['gemm_array']['DSP']} DSP)")
        lines += resource_table(res, "resources (matrix_engine: MatrixEngine() with -uram; "
                                      "LUTs of the three mapped by abc)")
    if "kr260" in result:
        lines += render_kr260(result)
    return "\n".join(lines)


def render_kr260(result: dict) -> list[str]:
    k = result["kr260"]
    lines = ["", f"kr260 GEMM: {k['arrays']} token-parallel {ROWS}x{LANES} arrays sharing the "
             f"weight word ({k['macs_per_cycle_peak']} MAC/cycle peak), w_in {k['w_bytes']} "
             f"B/cycle, N x {k['n_scale']}; every result bit-exact vs mcf.golden.gemm",
             f"{'sequence':10} {'MACs':>12} {'cycles':>8} {'MAC/cyc':>8} {'util':>7} "
             f"{'steady':>7} {'w-port eff':>10}"]
    for r in k["sequences"]:
        lines.append(f"{r['name']:10} {r['macs']:>12,} {r['cycles']:>8,} "
                     f"{r['macs_per_cycle']:>8.1f} {r['mac_utilization']:>7.2%} "
                     f"{r['steady_mac_utilization']:>7.2%} {r['port_efficiency']:>10.2%}")
    lines.append(f"prefill: {k['macs_per_cycle']:.1f} MAC/cycle whole sequence, "
                 f"{k['steady_macs_per_cycle']:.1f} steady; decode w-port efficiency "
                 f"{k['decode_port_efficiency']:.2%}")
    if "matrix_engine_kr260" in result.get("resources", {}):
        r4, r1 = result["resources"]["matrix_engine_kr260"], result["resources"]["matrix_engine"]
        f4 = result["k26_fraction_kr260"]
        lines.append("MatrixEngine(arrays=4) vs MatrixEngine(): " + ", ".join(
            f"{key} {r4[key]:,} ({r4[key] - r1[key]:+,}; {f4[key]:.1%} of K26)"
            for key in ("LUT", "FF", "DSP", "BRAM36", "URAM") if key in f4))
    return lines
