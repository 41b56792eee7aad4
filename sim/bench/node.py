"""Node bench (``mcf bench node``; issue #11 §3): two ``sim``-configuration node tops in a KR260
ring (:class:`mcf.sim.cluster.ClusterTop`, links at 10G/1G rates of a 300 MHz ``aclk``, latency
:data:`LINK_LATENCY` cycles) run MARS's own prefill chunk steps of the ``tiny`` model, every KV byte
checked at every planned receiver; the metadata ingress rate through the whole node; the kr260
GEMM's MACs/cycle (:func:`mcf.sim.bench.compute.kr260_gemm`, bit-exact); yosys resources of both
node tops and of the kr260 compute engines that are built but not yet joined to the top.

What is not measured yet, and why, is in the result's ``not_measured``: the node top's compute
half (JOB template walker, EMIT tee, ATTEND executor) is not joined, so a prefill step here is its
communication (MARS's plan, store and free phases) and there is no decode step or compute-busy
fraction to report. A cocotb assertion (a byte that did not land, any drop or bad-record counter)
makes the bench refuse.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from mcf.sim.bench import BenchRefused, resource_table

__all__ = ["collect", "render", "LINK_LATENCY"]

LINK_LATENCY = 64
"""Link latency in cycles (MARS's 2 µs would be 600 cycles at 300 MHz; shortened so the tiny
model's steps are not all wire time)."""

NOT_MEASURED = {
    "decode_step_cycles": "the ATTEND executor (attention states) is not joined to the node top",
    "compute_busy_fraction": "the GEMM and attention engines are not joined to the node top",
}


def _cluster(n: int):
    from mcf.hdl.flat import FlatTop
    from mcf.sim import build
    from mcf.sim.cluster import ClusterTop
    return build(FlatTop(ClusterTop(n, latency_cycles=LINK_LATENCY), clock="aclk",
                         resetn="aresetn"), f"node_cluster{n}")


def _run(built, testcase: str, params: dict) -> dict:
    from mcf.sim import run
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        try:
            run(built, "mcf.sim.benches.node_cluster", testcase=testcase,
                params={**params, "out": str(out)})
        except AssertionError as exc:
            raise BenchRefused(f"node bench {testcase}: {str(exc).splitlines()[0]}") from None
        return json.loads(out.read_text())


def prefill(small: bool) -> dict:
    seq_len = 96 if small else 256
    got = _run(_cluster(2), "prefill", {"nodes": 2, "seq_len": seq_len, "chunk": 32,
                                        "seed": 1, "pause": 0.0})
    return {"nodes": 2, "model": "tiny", "seq_len": seq_len, "chunk": 32,
            "link_latency_cycles": LINK_LATENCY, **got}


def ingress(small: bool) -> dict:
    n = 256 if small else 2048
    return _run(_cluster(2), "ingress_rate", {"nodes": 2, "records": n, "seed": 2,
                                              "cmd_log2": 12})


def synth_figures() -> dict:
    from mcf.abi.node_config import KR260
    from mcf.hdl.compute.attention import AttentionEngine
    from mcf.hdl.compute.gemm_top import MatrixEngine
    from mcf.hdl.flat import FlatTop
    from mcf.hdl.node.kv_reader import KvReader
    from mcf.hdl.tops import TOPS
    from mcf.sim.bench.compute import INTER, KR260_ARRAYS, M_CHUNK
    from mcf.sim.synth import resources

    tops = {
        "mcf_node (kr260)": resources(TOPS["mcf_node"](), "mcf_node", uram=True, abc9=False),
        "mcf_node_sim": resources(TOPS["mcf_node_sim"](), "mcf_node_sim", abc9=False),
    }
    engines = {
        "MatrixEngine(arrays=4)": resources(
            FlatTop(MatrixEngine(arrays=KR260_ARRAYS, k_max=INTER, m_max=M_CHUNK)),
            "mcf_matrix_engine_x4", uram=True, abc9=False),
        "AttentionEngine(64 lanes)": resources(
            FlatTop(AttentionEngine(KR260.attn_head_dim, KR260.attn_lanes, KR260.attn_heads,
                                    KR260.attn_block)), "mcf_attention_kr260", abc9=False),
        "KvReader (kr260)": resources(
            FlatTop(KvReader(KR260.attn_head_dim, KR260.attn_lanes, KR260.attn_block)),
            "mcf_kv_reader_kr260", abc9=False),
    }
    total = {k: tops["mcf_node (kr260)"][k] + sum(e[k] for e in engines.values())
             for k in tops["mcf_node (kr260)"]}
    return {"resources": tops, "engines_to_join": engines,
            "kr260_with_engines": total}


def collect(small: bool = False, synth: bool = True) -> dict:
    from mcf.sim.bench.compute import kr260_gemm
    pre = prefill(small)
    rate = ingress(small)
    gemm = kr260_gemm(small)
    out = {
        "prefill_comm_step_cycles": pre["step_cycles"],
        "meta_records_per_cycle": round(rate["records_per_cycle"], 4),
        "macs_per_cycle": gemm["macs_per_cycle"],
        "steady_macs_per_cycle": gemm["steady_macs_per_cycle"],
        "not_measured": NOT_MEASURED,
        "prefill": pre,
        "ingress": rate,
    }
    if synth:
        out.update(synth_figures())
    return out


def render(result: dict) -> str:
    pre = result["prefill"]
    lines = [
        f"Two sim node tops, KR260 ring (10G + 1G link rates at 300 MHz, latency "
        f"{pre['link_latency_cycles']} cycles): MARS prefill of the {pre['model']} model, "
        f"S = {pre['seq_len']}, chunk {pre['chunk']}; every planned KV byte checked at every "
        "receiver",
        "communication of each chunk step (cycles, doorbell to last landing): "
        + ", ".join(str(c) for c in result["prefill_comm_step_cycles"]),
        f"metadata ingress: {result['ingress']['records']} records (header-only CONTROL sends "
        f"through one node, ring to local sink) in {result['ingress']['cycles']} cycles = "
        f"{result['meta_records_per_cycle']} records/cycle",
        f"kr260 GEMM (4 arrays): {result['macs_per_cycle']} MACs/cycle over the prefill "
        f"sequence, {result['steady_macs_per_cycle']} steady",
        "not measured yet: " + "; ".join(f"{k} ({v})"
                                          for k, v in result["not_measured"].items()),
    ]
    if "resources" in result:
        lines += [""]
        rows = {**result["resources"], **result["engines_to_join"],
                "kr260 node + engines (sum)": result["kr260_with_engines"]}
        lines += resource_table(rows, "Node tops, and the kr260 engines not yet joined")
    return "\n".join(lines)
