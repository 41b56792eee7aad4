"""Cluster bench (``mcf bench cluster``; issue #14 "Bench", docs/cluster.md): the tiny model end
to end on simulated KR260 rings of ``sim`` node tops (:func:`mcf.commands.run.simulate`, one
Verilator build per ring size), the paper's comparison measured in RTL: TTFT in cycles of MARS,
ring and zigzag prefill at N = 2 and 4 on the same prompt, the exposed communication per step
(the COMPUTE queues' wait cycles), decode cycles per token, and the simulator's speed — in one
simulation and with one node per MPI rank (:mod:`mcf.sim.mpi`), which must give the same cycles
and bits (the full run; ``small``, CI's, runs no MPI rank: ``tests/test_cluster_mpi.py`` makes
that comparison there).

Every run is checked bit for bit against its golden model, its tokens against the golden's, its
KV layout owner-only in the nodes' directories and within the KV budget: a failed check makes
the bench refuse. Cycles are ``aclk`` cycles (link rates at an assumed 300 MHz; no fmax).
"""

from __future__ import annotations

from mcf.sim.perf import BenchRefused

__all__ = ["collect", "render", "POLICIES"]

POLICIES = ("mars", "ring", "zigzag")
DECODE_TOKENS = {2: 2, 4: 2}
"""Decode tokens of the MARS run per ring size (states reduced along a chain, so every engine
merges at most two: bit-exact at any N, docs/cluster.md)."""
CHUNK = 32
PARALLEL = 2
"""Simulations run at once (one per core of the 2-core machine); the MPI run (one rank per
node) runs alone afterwards."""


def _sizes(small: bool) -> dict[int, int]:
    """Nodes → prompt tokens (C = S/B chunk steps; CI's small run: one step)."""
    return {2: CHUNK} if small else {2: 2 * CHUNK, 4: 2 * CHUNK}


def collect(small: bool = False, synth: bool = True) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    from mcf.cluster import RunSpec
    from mcf.commands.run import simulate
    from mcf.sim.cluster import BENCH_LATENCY_CYCLES, CLOCK_HZ, build_cluster, simulated

    result = {"model": "tiny", "chunk": CHUNK, "clock_hz_assumed": CLOCK_HZ,
              "link_latency_cycles": BENCH_LATENCY_CYCLES, "tiny": {},
              "decode_cycles_per_token": {}, "sim_cycles_per_second": {},
              "parallel_runs": PARALLEL}
    specs = [RunSpec(nodes=n, prompt_tokens=seq, chunk=CHUNK, policy=policy,
                     decode_tokens=(min(1, DECODE_TOKENS[n]) if small else DECODE_TOKENS[n])
                     if policy == "mars" else 0)
             for n, seq in _sizes(small).items() for policy in POLICIES]
    for n in _sizes(small):
        build_cluster(n)                  # elaborate and build once, before the runs overlap

    def one(spec, mpi=False):
        try:
            return simulate(spec, progress=False, mpi=mpi)
        except AssertionError as exc:
            raise BenchRefused(f"{spec.policy} N={spec.nodes}{' (MPI)' if mpi else ''}: "
                               f"{str(exc).splitlines()[0]}") from None

    with ThreadPoolExecutor(PARALLEL) as pool:
        runs = dict(zip(((s.nodes, s.policy) for s in specs), pool.map(one, specs)))
    if not small:     # CI's small run leaves it to tests/test_cluster_mpi.py (the same check)
        n_mpi = max(_sizes(small))
        mpi = one(next(s for s in specs if s.nodes == n_mpi and s.policy == "mars"), mpi=True)
        one_sim, ranks = simulated(runs[(n_mpi, "mars")]), simulated(mpi)
        differ = sorted(k for k in one_sim.keys() | ranks.keys()
                        if one_sim.get(k) != ranks.get(k))
        if differ:
            raise BenchRefused(f"MPI N={n_mpi}: not the single-process run's "
                               f"{', '.join(differ)}")
        result["sim_cycles_per_second"][f"mpi_n{n_mpi}"] = round(mpi["node_cycles_per_second"])
        result["mpi_identical"] = sorted(one_sim)
    for n, seq in _sizes(small).items():
        row: dict = {"prompt_tokens": seq, "exposed_comm_cycles": {},
                     "prefill_step_cycles": {}}
        for policy in POLICIES:
            got = runs[(n, policy)]
            failed = [k for k, ok in got["checks"].items() if not ok]
            if failed:
                raise BenchRefused(f"{policy} N={n}: checks failed: {', '.join(failed)}")
            row[f"{policy}_ttft_cycles"] = got["ttft_cycles"]
            row["prefill_step_cycles"][policy] = got["prefill_step_cycles"]
            row["exposed_comm_cycles"][policy] = [max(w) for w in got["exposed_comm_cycles"]]
            if policy == "mars":
                row["peak_kv_bytes"] = got["peak_kv_bytes"]
                row["owned_tokens"] = got["owned_tokens"]
                if got["decode_cycles"]:
                    result["decode_cycles_per_token"][f"n{n}"] = got["decode_cycles"]
                result["sim_cycles_per_second"][f"single_process_n{n}"] = round(
                    got["node_cycles_per_second"])
        result["tiny"][f"n{n}"] = row
    return result


def render(result: dict) -> str:
    lines = ["| nodes | prompt | policy | TTFT (cycles) | vs MARS | exposed comm per step "
             "(max over nodes, cycles) |",
             "|---|---|---|---|---|---|"]
    for key, row in result["tiny"].items():
        mars = row["mars_ttft_cycles"]
        for policy in POLICIES:
            t = row[f"{policy}_ttft_cycles"]
            lines.append(f"| {key[1:]} | {row['prompt_tokens']} | {policy} | {t:,} | "
                         f"{t / mars:.3f}× | "
                         + ", ".join(f"{c:,}" for c in row["exposed_comm_cycles"][policy])
                         + " |")
    dec = "; ".join(f"N = {k[1:]}: " + ", ".join(f"{c:,}" for c in v)
                    for k, v in result["decode_cycles_per_token"].items())
    speed = ", ".join(f"{k.replace('_', ' ').replace('mpi', 'MPI')}: {v:,}"
                      for k, v in result["sim_cycles_per_second"].items())
    lines += ["", f"Decode cycles per token (MARS, tiny model): {dec}. Simulated node-cycles "
              f"per second on this machine (2 cores; single-process runs two at a time, the MPI "
              f"run — one rank per node, the same cycles and bits — alone): {speed}. "
              f"`aclk` cycles, link rates at an assumed "
              f"{result['clock_hz_assumed'] / 1e6:.0f} MHz, link latency "
              f"{result['link_latency_cycles']} cycles, chunk {result['chunk']}."]
    return "\n".join(lines) + "\n"
