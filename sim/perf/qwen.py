"""Qwen scale in RTL (``mcf bench qwen``; issue #35 items 2 and 3, docs/system-model.md): the
first ``LAYERS`` layer(s) of Qwen2.5-1.5B at full dimension (hidden 1,536, 12 / 2 heads,
head_dim 128, MLP 8,960, the real vocabulary; the random-weight checkpoint
:func:`mcf.model.resolve_model` writes into ``build/models``, or a real one) as ``mcf run`` runs
them on ``kr260`` node tops — MARS prefill and KV-stationary decode, every step checked bit for
bit against the integer golden model — and the system model's prediction of the same runs.

Per ring size (N = 2, then N = 4 unless ``nodes`` says otherwise) one run
(:func:`mcf.commands.run.simulate`, all nodes in one Verilator simulation): its prefill step
cycles (TTFT), its decode cycles per token (the root's layer, the query multicast, the nodes'
ATTENDs, the states reduced back and the LM head on the node: the whole token, as ``mcf run``
reports it), the simulator's speed. The prediction (:func:`predict`): the model's plan of the
same run (:func:`mcf.cluster.make_plan`) replayed by :func:`mcf.sysmodel.system.simulate_plan`
on the RTL cluster's configuration (:func:`mcf.sysmodel.validate.rtl_system_spec`: the node
program's layout, the bench link latency) for TTFT, and the decode model
(:func:`mcf.sysmodel.evaluation.decode`, the replicated root on the KR260 ring at the run's
context) for a decode token, its weights streamed at the rate of the memory the run ran against
(``memory``, :data:`DECODE_MEMORY`: the simulation's DDR model is ideal; Table 2 keeps the real
controller's assumed 90 % efficiency). ``model_vs_rtl_cycle_error_qwen`` is the largest relative
error of the two over the runs (issue target ≤ 0.10).

:func:`from_record` recomputes the prediction and the errors of a recorded result (its measured
part kept) with today's model, without re-running the simulation::

    mcf bench qwen --from-record docs/results/qwen.json [--json OUT]

A failed check refuses the figure (:class:`~mcf.sim.perf.BenchRefused`). ``small`` (what CI
runs) is the same code path on the tiny model and the ``sim`` node (one run, N = 2): the kr260
node's Verilator build alone takes ~40 min on a 2-core machine and the N = 2 run hours.

    mcf bench qwen --json build/bench/qwen.json        # hours: the kr260 build and runs
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mcf.sim.perf import checked_run

__all__ = ["QwenRun", "QWEN", "SMALL", "DECODE_MEMORY", "SIM_MEMORY", "MEASURED",
           "model_config", "predict", "measure", "compare", "collect", "from_record", "render"]


@dataclass(frozen=True)
class QwenRun:
    """One ``mcf run`` of the bench: ``model`` (``mcf run --model``), ``layers``
    (``--layers``), ``config`` (``--node-config``), prompt, chunk and decode tokens."""
    model: str
    layers: int | None
    config: str
    prompt_tokens: int
    chunk: int
    decode_tokens: int

    def spec(self, nodes: int, *, resolve: bool = True, **kw):
        """The run's :class:`mcf.cluster.RunSpec` on ``nodes`` nodes, the model resolved (the
        random-weight Qwen2.5-1.5B is written on first use; ``resolve=False``: the model's
        name only, for :func:`predict` with a configuration)."""
        from dataclasses import replace

        from mcf.cluster import RunSpec
        from mcf.model import resolve_model

        spec = RunSpec(model=self.model, prompt_tokens=self.prompt_tokens, nodes=nodes,
                       chunk=self.chunk, decode_tokens=self.decode_tokens, config=self.config,
                       **kw)
        if self.model == "tiny" or not resolve:
            return spec
        return replace(spec, model=resolve_model(self.model, layers=self.layers,
                                                 progress=None))


QWEN = QwenRun("qwen2.5-1.5b", 1, "kr260", prompt_tokens=128, chunk=32, decode_tokens=2)
"""Issue #35 item 2's run: ``mcf run --model qwen2.5-1.5b --layers 1 --node-config kr260
--prompt-tokens 128 --decode-tokens 2`` (chunk 32: four prefill steps)."""
SMALL = QwenRun("tiny", None, "sim", prompt_tokens=64, chunk=32, decode_tokens=1)
"""CI's reduced path: the same functions on the tiny model and the ``sim`` node."""


DECODE_MEMORY = {
    "ideal": ("stripe_ideal_weight_bytes_per_cycle",
              "decode.json weights: the stripe readers against ideal DDR port models"),
    "ddr90": ("stripe_weight_bytes_per_cycle",
              "decode.json weights_ddr90: DDR ports idle 10 % of cycles (the real controller's "
              "assumed efficiency, Table 2's)"),
}
"""The memory a predicted decode token streams its weights from: the figure of
:class:`mcf.sysmodel.calibration.BenchFigures` it uses and what it is."""

SIM_MEMORY = "ideal"
"""The memory of the simulated nodes ``mcf run`` runs (the cluster bench's DDR models answer
every beat): what the bench predicts its runs against."""

MEASURED = ("checks", "tokens", "ttft_cycles", "prefill_step_cycles", "head_cycles",
            "decode_cycles", "sim_cycles", "wall_seconds", "node_cycles_per_second")
"""The keys of a run's entry that :func:`compare` takes from the RTL run (:func:`measure`)."""


def _model(spec):
    from mcf.model import model_from_spec

    cfg, _ = model_from_spec(spec.model, seed=spec.seed) if spec.model == "tiny" \
        else model_from_spec(spec.model)
    return cfg


def model_config(run: QwenRun):
    """The Qwen2 configuration of ``run`` without reading a checkpoint (the tiny model's, or
    Qwen2.5-1.5B's truncated to ``run.layers``)."""
    from dataclasses import replace

    from mcf.model.config import QWEN25_1P5B_MODEL

    if run.model == "tiny":
        return _model(run.spec(2))
    return replace(QWEN25_1P5B_MODEL, num_hidden_layers=run.layers or
                   QWEN25_1P5B_MODEL.num_hidden_layers)


def predict(spec, fig=None, cfg=None, memory: str = SIM_MEMORY,
            requant_overlap: bool = True) -> dict:
    """The system model's cycles for the run ``spec`` (a :class:`mcf.cluster.RunSpec`):
    ``prefill_step_cycles`` and ``ttft_cycles`` (the run's plan through
    :func:`~mcf.sysmodel.system.simulate_plan` on the RTL cluster's configuration, the prefill
    ATTEND records those the run's node program issues for its softmax:
    :func:`mcf.node.layer.prefill_tile_chunk`) and
    ``decode_cycles_per_token`` per decode token (the replicated root's token on the KR260 ring
    at the context it decodes at: the prompt plus the tokens before it). ``fig``: the bench
    figures (default :func:`mcf.sysmodel.calibration.load_figures`); ``cfg``: the model's
    configuration (default: read from ``spec.model``); ``memory``: the weight stream's memory
    for decode (:data:`DECODE_MEMORY`); ``requant_overlap``: the RTL's vector unit overlaps a
    requantise entry's tokens (:data:`mcf.sysmodel.rates.RIDING_OPS`; ``False`` for a run
    recorded before it existed)."""
    from dataclasses import replace

    from mcf.abi.node_config import NODE_CONFIGS
    from mcf.cluster import make_plan
    from mcf.node.layer import prefill_tile_chunk
    from mcf.sim.cluster import BENCH_LATENCY_CYCLES
    from mcf.sysmodel.calibration import load_figures
    from mcf.sysmodel.evaluation import decode
    from mcf.sysmodel.rates import NodeRates
    from mcf.sysmodel.system import simulate_plan
    from mcf.sysmodel.validate import rtl_system_spec

    fig = fig or load_figures()
    if memory not in DECODE_MEMORY:
        raise ValueError(f"memory {memory!r}: one of {', '.join(DECODE_MEMORY)}")
    plan = make_plan(spec, cfg or _model(spec))
    # the prefill ATTEND records the run's node program issues for its softmax
    tile_chunk = prefill_tile_chunk(NODE_CONFIGS[spec.config], spec.softmax)
    sys_spec = replace(rtl_system_spec(BENCH_LATENCY_CYCLES, tile_chunk=tile_chunk),
                       requant_overlap=requant_overlap)
    res = simulate_plan(plan, fig, sys_spec)
    steps = [float(c) for c in res.step_cycles][:len(plan.steps)]
    rates = NodeRates.calibrated(fig, spec.config, plan.model, overheads=sys_spec.overheads,
                                 tile_chunk=tile_chunk, requant_overlap=requant_overlap)
    attr = DECODE_MEMORY[memory][0]
    dfig = replace(fig, stripe_weight_bytes_per_cycle=getattr(fig, attr))
    dec = []
    for k in range(spec.decode_tokens):
        row = decode(dfig, rates, plan.model, spec.nodes, spec.prompt_tokens + 1 + k,
                     modes=("replicated",))[0]
        dec.append(fig.clock_hz / row.tok_s)
    return {"prefill_step_cycles": steps, "ttft_cycles": sum(steps),
            "decode_cycles_per_token": dec, "layers": plan.model.layers, "memory": memory}


def measure(spec, *, mpi: bool = False) -> dict:
    """One RTL run of ``spec`` (:func:`mcf.commands.run.simulate`); refuses on a failed check."""
    from mcf.commands.run import ddr_model_bytes

    return checked_run(spec, f"N={spec.nodes}", mpi=mpi,
                       mem=ddr_model_bytes(_model(spec), spec))


def _error(pred: float, meas: float) -> float:
    return (pred - meas) / meas


def compare(spec, got: dict, pred: dict) -> dict:
    """One run's entry: measured and predicted cycles and their relative errors."""
    layers = pred["layers"]
    dec_m, dec_p = got["decode_cycles"], pred["decode_cycles_per_token"][:len(got["decode_cycles"])]
    entry = {
        "bit_exact": all(got["checks"].values()), "checks": got["checks"],
        "tokens": got["tokens"], "ttft_cycles": got["ttft_cycles"],
        "prefill_step_cycles": got["prefill_step_cycles"], "head_cycles": got["head_cycles"],
        "decode_cycles": dec_m, "layers": layers,
        "prefill_cycles_per_layer": got["ttft_cycles"] / layers,
        "predicted_ttft_cycles": round(pred["ttft_cycles"], 1),
        "predicted_prefill_step_cycles": [round(c, 1) for c in pred["prefill_step_cycles"]],
        "predicted_decode_cycles": [round(c, 1) for c in dec_p],
        "ttft_error": round(_error(pred["ttft_cycles"], got["ttft_cycles"]), 4),
        "decode_errors": [round(_error(p, m), 4) for p, m in zip(dec_p, dec_m)],
        "sim_cycles": got["sim_cycles"], "wall_seconds": got["wall_seconds"],
        "node_cycles_per_second": got["node_cycles_per_second"],
    }
    if dec_m:
        entry["decode_cycles_per_token"] = sum(dec_m) / len(dec_m)
    return entry


def _summary(run: QwenRun, runs: dict, memory: str, requant_overlap: bool = True) -> dict:
    """The bench's result from its runs' entries (:func:`compare`)."""
    result = {"run": asdict(run), "runs": runs,
              "prediction": {"decode_memory": memory,
                             "decode_weights": DECODE_MEMORY[memory][1],
                             "requant_overlap": requant_overlap}}
    first = next(iter(runs.values()))
    for name, r in runs.items():
        result[f"{name}.bit_exact"] = r["bit_exact"]
    result["prefill_cycles_per_layer"] = first["prefill_cycles_per_layer"]
    if "decode_cycles_per_token" in first:
        result["decode_cycles_per_token_per_layer"] = (first["decode_cycles_per_token"]
                                                       - first["head_cycles"]) / first["layers"]
    errs = [e for r in runs.values() for e in (r["ttft_error"], *r["decode_errors"])]
    key = "model_vs_rtl_cycle_error" + ("_qwen" if run.model != SMALL.model else "")
    result[key] = max(abs(e) for e in errs)
    result["sim_cycles_per_second"] = first["node_cycles_per_second"]
    return result


def collect(small: bool = False, synth: bool = True, nodes: tuple[int, ...] = (2, 4)) -> dict:
    run = SMALL if small else QWEN
    if small:
        nodes = (2,)
    runs = {}
    for n in nodes:
        spec = run.spec(n)
        runs[f"n{n}"] = compare(spec, measure(spec), predict(spec))
    return _summary(run, runs, SIM_MEMORY)


def from_record(record: dict, fig=None, memory: str = SIM_MEMORY) -> dict:
    """``record`` (a result of :func:`collect`) with its prediction and errors recomputed by
    today's model (``fig``: default :func:`mcf.sysmodel.calibration.load_figures`); its
    measured part (:data:`MEASURED` of every run) and its other keys (notes) kept. A record
    without ``prediction.requant_overlap`` was measured on the vector unit before the
    requantise overlap (2026-12-07) and is predicted without it."""
    run = QwenRun(**record["run"])
    overlap = record.get("prediction", {}).get("requant_overlap", False)
    cfg = model_config(run)
    runs = {}
    for name, r in record["runs"].items():
        spec = run.spec(int(name.removeprefix("n")), resolve=False)
        got = {k: r[k] for k in MEASURED}
        runs[name] = compare(spec, got, predict(spec, fig, cfg, memory, overlap))
    keys = ("run", "runs", "prediction", "prefill_cycles_per_layer",
            "decode_cycles_per_token_per_layer", "sim_cycles_per_second")
    kept = {k: v for k, v in record.items()
            if k not in keys and not k.startswith("model_vs_rtl_cycle_error")
            and not k.endswith(".bit_exact")}
    return _summary(run, runs, memory, overlap) | kept


def render(result: dict) -> str:
    run = result["run"]
    lines = [f"{run['model']} (layers {run['layers'] or 'all'}) on {run['config']} node tops, "
             f"{run['prompt_tokens']} prompt tokens, chunk {run['chunk']}, "
             f"{run['decode_tokens']} decode tokens; cycles of aclk",
             f"{'run':<5}{'bit-exact':>10}{'TTFT':>14}{'model':>14}{'err':>8}"
             f"{'decode/token':>14}{'model':>14}{'sim cyc/s':>11}"]
    for name, r in result["runs"].items():
        dm = r.get("decode_cycles_per_token")
        dp = (sum(r["predicted_decode_cycles"]) / len(r["predicted_decode_cycles"])
              if r["predicted_decode_cycles"] else None)
        lines.append(f"{name:<5}{str(r['bit_exact']):>10}{r['ttft_cycles']:>14,}"
                     f"{r['predicted_ttft_cycles']:>14,.0f}{100 * r['ttft_error']:>7.1f}%"
                     f"{'-' if dm is None else f'{dm:,.0f}':>14}"
                     f"{'-' if dp is None else f'{dp:,.0f}':>14}"
                     f"{r['node_cycles_per_second']:>11,.0f}")
    key = next(k for k in result if k.startswith("model_vs_rtl_cycle_error"))
    lines.append(f"{key}: {result[key]:.3f} (largest |model - RTL| / RTL over TTFT and decode "
                 f"tokens)")
    if "prediction" in result:
        lines.append(f"predicted decode weights: {result['prediction']['decode_weights']}")
    return "\n".join(lines)

