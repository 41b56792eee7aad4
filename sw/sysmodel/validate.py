"""The model against the RTL: node.json's ``layer`` entry — MARS's prefill steps of the tiny
model as the layer program on two simulated ``sim`` node tops (``mcf bench node``) — replayed
through the model on the same configuration: the bench's own MARS plan
(:func:`mcf.mars.plan.tiny_plan`: N, S, B of the entry), the node program's token
layout, the cluster simulation's links (the KR260 ring's 10G/1G rates at the assumed clock,
link frames without Ethernet framing, the entry's link latency in cycles).

What this checks and what it cannot: the node-program overheads (:class:`.rates.ProgramOverheads`)
are measured from the same run's per-engine totals, so the check is on what the totals do not
fix — how each step's cycles follow from the schedule (the attention growing with the chunk, at
the attention bench's rate per pair), which node is critical, the links' overlap with compute and
the step's tail — and on the lower node's busy fraction. ``overheads=False`` shows what the
engine benches alone predict.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..mars.plan import tiny_plan
from .calibration import BenchFigures, CalibrationError
from .rates import NodeRates
from .system import SystemResult, SystemSpec, simulate_plan

__all__ = ["Validation", "rtl_plan", "rtl_system_spec", "validate", "validate_comm",
           "layer_run_tile_chunk"]


def rtl_plan(fig: BenchFigures, run=None):
    """The MARS plan the node bench ran (the bench's own function,
    :func:`mcf.mars.plan.tiny_plan`; ``run``: the entry, default the layer run)."""
    run = fig.layer if run is None else run
    if run.model != "tiny":
        raise CalibrationError(f"layer run of model {run.model!r}; the bench plans 'tiny'")
    return tiny_plan(run.nodes, run.seq_len, run.chunk)


def rtl_system_spec(latency_cycles: int, overheads: bool = True,
                    tile_chunk: int | None = None) -> SystemSpec:
    """The model on the RTL cluster's configuration: the node program's token layout, the
    whole model, link frames without Ethernet framing, ``latency_cycles`` per link;
    ``tile_chunk`` as :class:`.system.SystemSpec`'s (``None``: the node program's choice for a
    single-softmax run)."""
    return SystemSpec(layout="node-program", scope="model", overheads=overheads,
                      ethernet=False, latency_cycles=latency_cycles, tile_chunk=tile_chunk)


def layer_run_tile_chunk(fig: BenchFigures) -> int:
    """PREFILL_TILE tokens per record of node.json's layer run: 0 when its ``att_records``
    are the per-token program's (one PREFILL record per token and KV head, as the run was
    measured before the ``sim`` node had the tiled path); a run of PREFILL_TILE records is
    refused (its per-token record overhead, which :class:`.rates.ProgramOverheads` takes from
    it, is not measured by it)."""
    from .rates import run_work
    run = fig.layer
    model, work = run_work(run)
    for n, ws in work.items():
        want = model.layers * sum(w.records for w in ws)
        if run.engines[n].get("att_records") != want:
            raise CalibrationError(f"layer run node {n}: att_records "
                                   f"{run.engines[n].get('att_records')}, the per-token "
                                   f"program has {want} (a run of PREFILL_TILE records is not "
                                   "modelled here)")
    return 0


@dataclass(frozen=True)
class Validation:
    measured: tuple[int, ...]
    predicted: tuple[float, ...]
    busy_measured: float | None     # node.json layer.compute_busy_fraction (the lower node)
    busy_predicted: float | None
    result: SystemResult

    @property
    def errors(self) -> list[float]:
        """Per step: (predicted − measured) / measured."""
        return [(p - m) / m for p, m in zip(self.predicted, self.measured)]

    @property
    def max_error(self) -> float:
        return max(abs(e) for e in self.errors)

    @property
    def total_error(self) -> float:
        return sum(self.predicted) / sum(self.measured) - 1

    def to_dict(self) -> dict:
        return {"measured_step_cycles": list(self.measured),
                "predicted_step_cycles": [round(p, 1) for p in self.predicted],
                "step_errors": [round(e, 4) for e in self.errors],
                "max_abs_error": round(self.max_error, 4),
                "total_error": round(self.total_error, 4),
                "busy_fraction_measured": self.busy_measured,
                "busy_fraction_predicted": None if self.busy_predicted is None
                else round(self.busy_predicted, 4),
                "overheads": self.result.spec.overheads,
                "rates": self.result.rates.to_dict()}


def validate(fig: BenchFigures, overheads: bool = True) -> Validation:
    run = fig.layer
    p = rtl_plan(fig)
    if p.num_chunks != len(run.step_cycles):
        raise CalibrationError(f"layer run: {len(run.step_cycles)} steps, the plan has "
                               f"{p.num_chunks}")
    res = simulate_plan(p, fig, rtl_system_spec(run.link_latency_cycles, overheads,
                                                layer_run_tile_chunk(fig)))
    return Validation(run.step_cycles, tuple(res.step_cycles), run.compute_busy_fraction,
                      min(res.busy_fraction()), res)


def validate_comm(fig: BenchFigures) -> Validation:
    """node.json's ``prefill`` entry (the KV placed by the PS, nothing computed): the network
    part of the model alone on the same cluster. The model leaves out the node's fixed latency
    of starting a step (ring fetch, send reads and landing writes in DDR), which no bench
    measures on its own, so it predicts these short steps low."""
    run = fig.comm
    p = rtl_plan(fig, run)
    res = simulate_plan(p, fig, rtl_system_spec(run.link_latency_cycles, overheads=False),
                        rates=NodeRates.idle("sim"))
    return Validation(run.step_cycles, tuple(res.step_cycles), None, None, res)
