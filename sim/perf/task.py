"""Task bench (``mcf bench task``; issue #17 "Bench", docs/evaluation.md): the trained
``retrieval`` checkpoint answering passkey prompts (:mod:`mcf.model.task`, seeds ``0 .. n-1``).

* Greedy exact-match accuracy against the prompt length of the float reference and of the
  integer golden model with both INT4 KV formats (:mod:`mcf.model.evaluate`).
* The RTL cluster: ``mcf run --model retrieval --task passkey`` on 2 and 4 simulated node tops
  (:func:`mcf.commands.run.simulate`, MARS prefill, decode along the chain) at
  :data:`RTL_TOKENS` prompt tokens, on the first :data:`RTL_PROMPTS` prompts. Every step is
  checked bit for bit against the run's integer golden model and the generated tokens against
  the golden's (a run that would have the cores alone runs one node per MPI rank, which gives
  the same cycles and bits, docs/cluster.md); a failed check makes the bench refuse, so
  ``bit_exact_vs_golden`` is only ever reported true. ``golden_nK_acc_L``: that golden model
  (``mcf.model.evaluate``'s ``mars_nK``) on all the prompts — what the RTL answers wherever
  it equals it.

Cycles are ``aclk`` cycles (no fmax is claimed).
"""

from __future__ import annotations

from mcf.sim.perf import checked_run

__all__ = ["collect", "render", "LENGTHS", "PROMPTS", "RTL_TOKENS", "RTL_PROMPTS"]

LENGTHS = (256, 512, 1024, 2048, 4094)
"""Prompt lengths of the golden models (4094 + 2 answer tokens fill the model's 4096
positions)."""
PROMPTS = 50
RTL_TOKENS = 512
RTL_PROMPTS = {2: 2, 4: 1}
"""Nodes → passkey prompts run in RTL (seeds ``0 .. k-1``; a 512-token prompt costs tens of
minutes of simulation)."""
SMALL = {"lengths": (256,), "prompts": 4, "rtl_tokens": 32, "rtl_prompts": {2: 1}}
"""CI's size: one length, four prompts, one 32-token prompt on two node tops."""
PARALLEL = 2
"""Processes / simulations at once (one per core of the 2-core machine)."""
KEYS = {"float": "float", "int": "int4_per_token", "int_channel": "int4_per_channel"}


def _rtl(nodes: int, tokens: int, seeds: int) -> list[dict]:
    from concurrent.futures import ThreadPoolExecutor

    from mcf.cluster import RunSpec
    from mcf.model.task import PASSKEY
    from mcf.sim.cluster import build_cluster, build_rank

    mpi = seeds < PARALLEL                # a run alone: one node per MPI rank, same cycles
    # elaborate and build once, before the runs overlap (only the build the runs use)
    if mpi:
        build_rank()
    else:
        build_cluster(nodes)
    specs = [RunSpec(model="retrieval", task="passkey", nodes=nodes, prompt_tokens=tokens,
                     decode_tokens=PASSKEY.value_len - 1, seed=s) for s in range(seeds)]

    def one(spec):
        return checked_run(spec, f"N={nodes} seed {spec.seed}", mpi=mpi)

    with ThreadPoolExecutor(PARALLEL) as pool:
        return list(pool.map(one, specs))


def collect(small: bool = False, synth: bool = True) -> dict:
    from mcf.model.checkpoint import RETRIEVAL_DIR
    from mcf.model.evaluate import measure

    lengths = SMALL["lengths"] if small else LENGTHS
    n = SMALL["prompts"] if small else PROMPTS
    tokens = SMALL["rtl_tokens"] if small else RTL_TOKENS
    rtl_prompts = SMALL["rtl_prompts"] if small else RTL_PROMPTS
    clusters = [f"mars_n{k}" for k in rtl_prompts]
    acc = measure(RETRIEVAL_DIR, [(m, L) for m in KEYS for L in lengths]
                  + [(m, tokens) for m in clusters], n, jobs=PARALLEL)
    result: dict = {"model": "retrieval", "prompts": n,
                    "model_bytes": sum(f.stat().st_size for f in RETRIEVAL_DIR.iterdir()
                                       if f.suffix == ".safetensors")}
    for m, key in KEYS.items():
        result[key] = {f"acc_{L}": a.accuracy for L, a in sorted(acc[m].items())}
        result[key]["wrong_seeds"] = {str(L): list(a.wrong_seeds)
                                      for L, a in sorted(acc[m].items()) if a.wrong_seeds}
    rtl: dict = {"prompt_tokens": tokens, "prompts": {}, "answers": {}, "ttft_cycles": {},
                 "decode_cycles": {}}
    for nodes, k in rtl_prompts.items():
        runs = _rtl(nodes, tokens, k)
        key = f"n{nodes}"
        rtl[f"{key}_acc_{tokens}"] = sum(r["task"]["correct"] for r in runs) / k
        rtl[f"golden_{key}_acc_{tokens}"] = acc[f"mars_{key}"][tokens].accuracy
        rtl["prompts"][key] = k
        rtl["answers"][key] = [r["tokens"] for r in runs]
        rtl["ttft_cycles"][key] = [r["ttft_cycles"] for r in runs]
        rtl["decode_cycles"][key] = [c for r in runs for c in r["decode_cycles"]]
    rtl["bit_exact_vs_golden"] = True     # every run's checks passed, or collect refused
    result["rtl"] = rtl
    return result


def render(result: dict) -> str:
    lengths = sorted({int(k[4:]) for k in result["float"] if k.startswith("acc_")})
    names = {"float": "float reference", "int4_per_token": "INT4 golden, per-token KV",
             "int4_per_channel": "INT4 golden, per-channel-K KV"}
    lines = ["| model | " + " | ".join(f"{L} tokens" for L in lengths) + " |",
             "|---|" + "---|" * len(lengths)]
    for key, name in names.items():
        lines.append(f"| {name} | " + " | ".join(f"{100 * result[key][f'acc_{L}']:.1f} %"
                                                  for L in lengths) + " |")
    rtl = result["rtl"]
    tok = rtl["prompt_tokens"]
    runs = "; ".join(
        f"N = {k[1:]}: {100 * rtl[f'{k}_acc_{tok}']:.0f} % of {p} prompt{'s' * (p > 1)}, "
        f"TTFT " + ", ".join(f"{c:,}" for c in rtl["ttft_cycles"][k]) + " cycles (the run's "
        f"golden model: {100 * rtl[f'golden_{k}_acc_{tok}']:.1f} % of {result['prompts']})"
        for k, p in rtl["prompts"].items())
    lines += ["", f"Passkey exact match over {result['prompts']} prompts per length "
              f"(seeds 0..{result['prompts'] - 1}), checkpoint {result['model_bytes']:,} "
              f"bytes. RTL cluster at {tok} prompt tokens: {runs}; every run bit-exact "
              f"against the integer golden model."]
    return "\n".join(lines) + "\n"
