"""Cycle costs of a node's layer program, from the bench figures (:mod:`.calibration`).

Two kinds of figure go in:

* **engine rates** from the engines' own benches — the GEMM's MACs/cycle (kr260: ``node.json``
  ``macs_per_cycle``, the kr260 GEMM on the Qwen-shaped prefill sequence), the attention
  engine's cycles per visible (query, key, head) (``attention.json``, the prefill case of the
  model's GQA group, carried from the bench's ``head_dim / lanes`` to the configuration's), the
  KV reader's bytes per cycle (one 128-bit HP port, HP1, x ``compute.json``
  ``dma_efficiency``; the GEMM's weights come through the stripe readers on all four ports,
  whose decode rate :mod:`.evaluation` reads from ``decode.json``);
* **node-program overheads** the engine benches cannot see, from the measured layer program
  (``node.json`` ``layer``, :class:`~.calibration.LayerRun`): the JOB cycles the GEMM is not
  active (vector passes, requantisation, fences, DMA round trips) beyond the vector unit's
  beats, per row pass (:func:`vector_passes`), the fixed cycles of one ATTEND record (query and
  list fetch, pipeline fill and drain, the ``o/l`` write) beyond its pairs, and EMIT's cycles
  per ACT byte. The run's node configuration is recognised from its counters (GEMM steps x
  MACs per step = the program's MACs), and the run's GEMM rate is that configuration's.

The vector cost has two parameters: ``vector_cycles_per_row_pass`` (fitted on the layer run) and
the vector unit's own rate, one beat of ``vec_lanes`` elements per cycle per pass over a row
(:data:`VECTOR_BEATS_PER_CYCLE`; RMSNorm and requantise pass over the buffered row twice,
:class:`mcf.hdl.compute.vector.VectorUnit`). For a model they fold into one
``vector_cycles_per_element`` = (row passes x cycles per row pass + element passes /
vec_lanes) / elements, per token and layer (:func:`vector_passes`): the per-row costs amortise
over wide rows (Qwen2.5-1.5B's 1,536 / 8,960) that the tiny model's 128-wide rows do not.

Per layer (:class:`~.work.NodeWork`): ``JOB = MACs / gemm_macs_per_cycle + vector elements x
vector_cycles_per_element``; ``EMIT = ACT bytes x emit_cycles_per_byte``; ``ATTEND = records x
attend_record_cycles + max(pairs x attend_pair_cycles, KV bytes / kv_read_bytes_per_cycle)``.

On a node with the tiled prefill (``NodeConfig.tiled``) in a single-softmax run
(:func:`mcf.node.layer.prefill_tile_chunk`), the prefill ATTEND is PREFILL_TILE records
(:class:`~.work.NodeWork` ``tile_*``) priced at the tiled executor's measured rate
(``attention.json`` ``tiled`` — the ``sim`` node's tile shape — and ``tiled_<config>``, each
measured at one shape: the configuration's must be among them): per record
``tile_record_cycles + tile_row_cycles x rows + Σ over its (query tile, block) pairs max(rows x
tile_row_block_cycles, keys x tile_key_cycles, rows x keys x tile_row_key_cycles)``. Decode
ATTEND (and prefill on a node without the tiled path) keeps the per-token engine's rate.

On a node with every non-tiled ATTEND (DECODE, PREFILL, MAX, FIXED) on the GEMM's arrays
(``NodeConfig.attn_on_arrays``: :class:`mcf.hdl.compute.array_engine.ArrayEngine` instead of the
vector engine), ``attend_pair_cycles`` is that engine's measured rate
(``attention_arrays.json``, the prefill case of the model's GQA group,
:class:`~.calibration.ArrayAttentionRate`) as measured, not scaled: the bench must have measured
the configuration's own shape (:data:`ARRAY_SHAPE`), or the calibration refuses
(:func:`attend_pair_rate`).

``overheads=False`` gives the engine rates alone (vector passes at one beat per cycle, EMIT at
the DMA rate, no per-record cost): what the unit benches predict without the node program.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import fmean

from ..abi.attend import ATTEND_TILE_ROWS
from ..abi.kv import kv_token_bytes
from ..abi.node_config import AXI_WIDTH, NODE_CONFIGS, NodeConfig
from ..abi.quant import VectorOp
from .calibration import BenchFigures, CalibrationError, LayerRun
from .work import NodeWork, node_work, vector_elements

__all__ = ["ProgramOverheads", "NodeRates", "run_work", "check_fits", "peak_macs_per_cycle",
           "vector_passes", "attend_pair_rate", "VECTOR_BEATS_PER_CYCLE", "TWO_PASS_OPS",
           "RIDING_OPS", "ARRAY_SHAPE"]


ENGINE_COUNTERS = ("gemm_steps", "gemm_active_cycles", "att_records", "emit_tokens",
                   "kvr_tokens", "cmp_job_cycles", "cmp_attend_cycles", "cmp_emit_cycles")
"""The layer run's per-engine counters the overheads are measured from."""


VECTOR_BEATS_PER_CYCLE = 1
"""The vector unit's rate: one beat (``vec_lanes`` elements) per cycle per pass over a row
(:class:`mcf.hdl.compute.vector.VectorUnit`'s latency contract)."""

TWO_PASS_OPS = (VectorOp.RMSNORM, VectorOp.REQUANT)
"""Vector ops that buffer the row and pass over it twice (the unit's second pass at one beat per
cycle, after the row's per-token calculation)."""

RIDING_OPS = (VectorOp.REQUANT,)
"""Two-pass ops whose next token's first pass rides along this token's second pass when the
tokens of one VEC entry arrive back to back (:class:`mcf.hdl.compute.vector_ctrl.VectorControl`):
over an entry of many tokens one pass per element (the entry's first token pays both)."""


def vector_passes(model, overlap: bool = True) -> tuple[int, int]:
    """``(row passes, element passes)`` of the vector unit per token and layer of the node
    program (:mod:`mcf.node.layer`'s two JOB templates): one row pass per VEC entry (``JOB 2l``:
    RMSNorm, requantise, RoPE of Q, RoPE of K and the V copy per KV head, the query requantise
    per query head; ``JOB 2l+1``: the seven passes of :func:`.work.vector_elements`); element
    passes count every element once per pass over it (twice for :data:`TWO_PASS_OPS`; with
    ``overlap``, entries of many tokens as in prefill, once for :data:`RIDING_OPS`; without,
    one token per entry as in decode, twice)."""
    h, nq, nkv = model.hidden, model.q_heads * model.head_dim, model.kv_heads * model.head_dim
    rq = 1 if overlap and VectorOp.REQUANT in RIDING_OPS else 2   # a requantise's passes
    rows = (3 + 2 * model.kv_heads + model.q_heads) + 7
    elems = (2 * h + rq * h + nq + 2 * nkv + rq * nq) + (rq * nq + h + 2 * h + rq * h
                                                         + model.intermediate
                                                         + rq * model.intermediate + h)
    return rows, elems


def _model_vector_cost(model, lanes: int, per_row_pass: float, overlap: bool = True) -> float:
    """Cycles per vector element of ``model`` (one figure for both JOBs: their sum per token);
    ``overlap``: :func:`vector_passes`'."""
    rows, elems = vector_passes(model, overlap)
    return (rows * per_row_pass + elems / (lanes * VECTOR_BEATS_PER_CYCLE)) / sum(
        vector_elements(model))


def _work_plan(run: LayerRun):
    """A MARS plan of the run's shape (N, S, B): the node program's work depends on these only."""
    from ..mars import get_model, plan
    from ..mars.cluster import ClusterSpec, make_topology
    model = get_model(run.model)
    cl = ClusterSpec(run.nodes, 1 << 30, 1 << 30, make_topology("kr260-ring", run.nodes))
    return model, plan(model, cl, run.seq_len, run.chunk, "mars", alpha=0.5)


def run_work(run: LayerRun) -> tuple[object, dict[int, list[NodeWork]]]:
    """The layer run's model and, per node, its :class:`NodeWork` of every step (node program)."""
    model, p = _work_plan(run)
    return model, {n: [node_work(model, p, s.index, n, "node-program") for s in p.steps]
                   for n in range(run.nodes)}


@dataclass(frozen=True)
class ProgramOverheads:
    """The node program's costs beyond the engine rates, measured in the layer run."""
    config: str                        # the run's node configuration (recognised)
    gemm_macs_per_cycle: float         # the run's GEMM rate (its configuration, its shapes)
    vector_cycles_per_row_pass: float  # JOB cycles beyond GEMM and vector beats, per row pass
    vector_cycles_per_element: float   # the run's model: both terms per vector element
    attend_record_cycles: float
    attend_record_spread: float        # max - min of the per-node estimates (a check)
    emit_cycles_per_byte: float

    @classmethod
    def measure(cls, fig: BenchFigures) -> ProgramOverheads:
        run = fig.layer
        missing = {n: sorted(set(ENGINE_COUNTERS) - set(e)) for n, e in run.engines.items()}
        if any(missing.values()):
            raise CalibrationError(f"layer run: engine counters missing {missing}")
        model, work = run_work(run)
        L = model.layers
        macs = {n: L * sum(w.macs_a + w.macs_b for w in ws) for n, ws in work.items()}
        cfg = None
        for c in NODE_CONFIGS.values():
            if all(macs[n] == run.engines[n]["gemm_steps"] * c.gemm_rows * c.gemm_lanes
                   * c.gemm_arrays for n in work):
                cfg = c
                break
        if cfg is None:
            raise CalibrationError("layer run: no node configuration's GEMM steps match the "
                                   f"program's MACs ({macs})")
        cpq, _ = attend_pair_rate(fig, cfg, model)
        kv_rate = AXI_WIDTH // 8 * fig.dma_efficiency
        record = kv_token_bytes(model.head_dim)
        gemm, vec, rec, emit = [], [], [], []
        for n, ws in work.items():
            e = run.engines[n]
            want = {"att_records": L * sum(w.records for w in ws),
                    "emit_tokens": L * sum(w.records for w in ws),
                    "kvr_tokens": L * sum(w.kv_read_bytes for w in ws) // record}
            for key, v in want.items():
                if e[key] != v:
                    raise CalibrationError(f"layer run node {n}: {key} = {e[key]}, the node "
                                           f"program of this shape has {v}")
            gemm.append(macs[n] / e["gemm_active_cycles"])
            tokens = L * sum(w.tokens for w in ws if w.vec_a + w.vec_b)
            rows, elems = (tokens * c for c in vector_passes(model))
            vec.append((e["cmp_job_cycles"] - e["gemm_active_cycles"]
                        - elems / (cfg.vec_lanes * VECTOR_BEATS_PER_CYCLE)) / rows)
            bound = L * sum(max(w.pairs * cpq, w.kv_read_bytes / kv_rate) for w in ws)
            rec.append((e["cmp_attend_cycles"] - bound) / e["att_records"])
            emit.append(e["cmp_emit_cycles"] / (L * sum(w.emit_bytes for w in ws)))
        per_row = fmean(vec)
        return cls(cfg.name, fmean(gemm), per_row,
                   _model_vector_cost(model, cfg.vec_lanes, per_row), fmean(rec),
                   max(rec) - min(rec), fmean(emit))


def check_fits(model, cfg: NodeConfig) -> None:
    """Raise ``ValueError`` when ``model``'s attention does not fit ``cfg``'s engine."""
    if model.head_dim != cfg.attn_head_dim or model.q_heads // model.kv_heads > cfg.attn_heads:
        raise ValueError(f"{model.name} does not fit the {cfg.name} attention engine (head_dim "
                         f"{cfg.attn_head_dim}, up to {cfg.attn_heads} query heads per KV "
                         f"head; the model has {model.head_dim} and "
                         f"{model.q_heads // model.kv_heads})")


def peak_macs_per_cycle(fig: BenchFigures, config: str | NodeConfig) -> tuple[int, str]:
    """The GEMM's peak multiply-accumulates per cycle of ``config`` and where it comes from: the
    node configuration in :mod:`mcf.abi.node_config` (arrays x rows x lanes,
    :attr:`NodeConfig.macs_per_cycle`), the one source of truth. When node.json reports the
    kr260 node's ``macs_per_cycle_peak`` it must be the same number, or the calibration
    refuses."""
    cfg = NODE_CONFIGS[config] if isinstance(config, str) else config
    peak = cfg.macs_per_cycle
    src = (f"mcf.abi.node_config.{cfg.name.upper()}: {cfg.gemm_arrays} arrays x "
           f"{cfg.gemm_rows} rows x {cfg.gemm_lanes} lanes")
    bench = fig.node_macs_per_cycle_peak
    if cfg.name == "kr260" and bench is not None:
        if bench != peak:
            raise CalibrationError(f"{fig.sources['node_macs_per_cycle_peak']} = {bench:g}, "
                                   f"the kr260 configuration's GEMM peak is {peak} ({src})")
        src += f" (= {fig.sources['node_macs_per_cycle_peak']})"
    return peak, src


def _lane_scale(fig: BenchFigures, cfg: NodeConfig, head_dim: int) -> float:
    """Cycles per pair scale as ``head_dim / lanes``: the bench's geometry to ``cfg``'s."""
    return (head_dim / cfg.attn_lanes) / (fig.attention_head_dim / fig.attention_lanes)


ARRAY_SHAPE = {"head_dim": "attn_head_dim", "lanes": "attn_lanes", "max_heads": "attn_heads",
               "max_block": "attn_block", "keys": "tile_keys", "arr_lanes": "tile_lanes",
               "arrays": "gemm_arrays", "array_rows": "gemm_rows", "chain": "gemm_chain"}
"""The shape keys of ``attention_arrays.json`` (ArrayEngine's parameters) and the NodeConfig
fields they must equal."""


def attend_pair_rate(fig: BenchFigures, cfg: NodeConfig, model) -> tuple[float, str]:
    """Cycles per visible (query, key, head) of ``cfg``'s non-tiled ATTEND for ``model`` and
    where the figure comes from: with ``attn_on_arrays`` the engine on the arrays' measured
    rate (``fig.attention_arrays``, which must have been measured at ``cfg``'s shape; else
    :class:`CalibrationError`), otherwise the vector engine's carried to ``cfg``'s lanes
    (:func:`_lane_scale`)."""
    group = model.q_heads // model.kv_heads
    if not cfg.attn_on_arrays:
        cpq, case = fig.attention_pair_cycles(group)
        return cpq * _lane_scale(fig, cfg, model.head_dim), (
            f"{fig.sources['attention_cycles_per_pair']} ({case}), x ({model.head_dim}/"
            f"{cfg.attn_lanes}) / ({fig.attention_head_dim}/{fig.attention_lanes})")
    a = fig.attention_arrays
    where = fig.sources.get("attention_arrays", "attention_arrays.json")
    if a is None:
        raise CalibrationError(f"{where}; the {cfg.name} node runs every non-tiled ATTEND on "
                               "the GEMM's arrays (attn_on_arrays) and needs its measured rate")
    want = {k: getattr(cfg, f) for k, f in ARRAY_SHAPE.items()}
    if any(a.shape.get(k) != v for k, v in want.items()):
        got = {k: a.shape.get(k) for k in want}
        raise CalibrationError(f"{where}: the engine on the arrays was measured at {got}, the "
                               f"{cfg.name} node's is {want}")
    cpq, case = a.pair_cycles(group)
    return cpq, (f"{where} ({case}; ArrayEngine at the {a.shape.get('config', '?')} shape, "
                 "as measured)")


TILE_SHAPE = {"head_dim": "attn_head_dim", "tile_keys": "tile_keys", "tile_lanes": "tile_lanes",
              "kv_lanes": "attn_lanes", "max_block": "attn_block"}
"""The tiled bench's shape keys and the NodeConfig fields they must equal."""


def _tiled_rate(fig: BenchFigures, cfg: NodeConfig, tile_chunk: int) -> dict:
    """NodeRates' ``tile_*`` fields of ``cfg`` for ``tile_chunk`` tokens per record (0: none),
    from ``attention.json``'s ``tiled`` entry, which must have been measured at ``cfg``'s tile
    shape."""
    if not tile_chunk:
        return {"sources": {}}
    if not cfg.tiled or not 1 <= tile_chunk <= cfg.tile_max_chunk:
        raise ValueError(f"{cfg.name}: no PREFILL_TILE records of {tile_chunk} tokens (tiled "
                         f"path {'up to ' + str(cfg.tile_max_chunk) if cfg.tiled else 'absent'})")
    where = fig.sources.get("attention_tiled", "attention.json")
    if not fig.attention_tiled:
        raise CalibrationError(f"{where}: no tiled prefill rate (run `mcf bench attention`); "
                               f"the {cfg.name} node runs PREFILL_TILE records")
    want = {k: getattr(cfg, f) for k, f in TILE_SHAPE.items()} | {"tile_rows": ATTEND_TILE_ROWS}
    match = [t for t in fig.attention_tiled
             if all(t["shape"].get(k) == v for k, v in want.items())]
    if not match:
        shapes = "; ".join(str(t["shape"]) for t in fig.attention_tiled)
        raise CalibrationError(f"{where}: the tiled rate was measured at {shapes}, the "
                               f"{cfg.name} node's tiled path is {want}")
    t = match[0]
    src = (f"{where.split(':')[0]}: {t['entry']} (TileUnit + KvReader + TilePrefill at the "
           f"{t['shape']['config']} shape)")
    return {"tile_chunk": tile_chunk, "tile_block": cfg.attn_block,
            "tile_record_cycles": float(t["record_cycles"]),
            "tile_row_cycles": float(t["row_cycles"]),
            "tile_row_block_cycles": float(t["row_block_cycles"]),
            "tile_key_cycles": float(t["key_cycles"]),
            "tile_row_key_cycles": float(t["row_key_cycles"]),
            "sources": {"tile_rate": f"{src}: record_cycles, row_cycles, row_block_cycles, "
                                     "key_cycles, row_key_cycles"}}


@dataclass(frozen=True)
class NodeRates:
    """Cycle costs of one node configuration for one model."""
    config: str
    gemm_macs_per_cycle: float
    vector_cycles_per_element: float    # prefill: entries of many tokens (RIDING_OPS overlap)
    attend_record_cycles: float
    attend_pair_cycles: float
    kv_read_bytes_per_cycle: float
    emit_cycles_per_byte: float
    overheads: bool
    sources: dict = field(default_factory=dict)
    # the tiled prefill (PREFILL_TILE records; tile_chunk 0: per-token PREFILL records)
    tile_chunk: int = 0                 # query tokens per PREFILL_TILE record
    tile_block: int = 0                 # keys per KV block (attn_block)
    tile_record_cycles: float = 0.0
    tile_row_cycles: float = 0.0
    tile_row_block_cycles: float = 0.0
    tile_key_cycles: float = 0.0
    tile_row_key_cycles: float = 0.0
    # decode: one token per VEC entry (no overlap); None: vector_cycles_per_element
    decode_vector_cycles_per_element: float | None = None

    @property
    def decode_vector_cost(self) -> float:
        """Cycles per vector element of one decode token (:func:`vector_passes` without the
        overlap of :data:`RIDING_OPS`)."""
        d = self.decode_vector_cycles_per_element
        return self.vector_cycles_per_element if d is None else d

    @classmethod
    def calibrated(cls, fig: BenchFigures, config: str | NodeConfig, model,
                   overheads: bool = True, measured: ProgramOverheads | None = None,
                   tile_chunk: int | None = None, requant_overlap: bool = True) -> NodeRates:
        """``tile_chunk``: query tokens per PREFILL_TILE record; ``None``: what the node
        program runs in a single-softmax run (:func:`mcf.node.layer.prefill_tile_chunk`: the
        configuration's ``tile_max_chunk`` on a node with the tiled path, else 0); 0: per-token
        PREFILL records. ``requant_overlap``: prefill's requantise entries priced with
        :data:`RIDING_OPS`' overlap (``False``: the vector unit before it, for a run recorded
        on that RTL)."""
        from ..node.layer import prefill_tile_chunk
        cfg = NODE_CONFIGS[config] if isinstance(config, str) else config
        check_fits(model, cfg)
        if tile_chunk is None:
            tile_chunk = prefill_tile_chunk(cfg, "single")
        tiled = _tiled_rate(fig, cfg, tile_chunk)
        pair, pair_src = attend_pair_rate(fig, cfg, model)
        kv_rate = AXI_WIDTH // 8 * fig.dma_efficiency
        src = {"attend_pair_cycles": pair_src,
               "kv_read_bytes_per_cycle": f"{AXI_WIDTH // 8} B/cycle (one HP port) x "
                                          f"{fig.sources['dma_efficiency']}"}
        if overheads:
            ov = measured or ProgramOverheads.measure(fig)
            run = f"{fig.sources['layer']} ({ov.config} node top, {fig.layer.model} model)"
            if cfg.name == ov.config:
                gemm = ov.gemm_macs_per_cycle
                src["gemm_macs_per_cycle"] = f"{run}: program MACs / gemm_active_cycles"
            elif cfg.name == "kr260":
                gemm = fig.kr260_macs_per_cycle
                src["gemm_macs_per_cycle"] = fig.sources["kr260_macs_per_cycle"]
            else:
                gemm = fig.gemm_sequence_utilization * cfg.macs_per_cycle
                src["gemm_macs_per_cycle"] = fig.sources["gemm_sequence_utilization"]
            vec = _model_vector_cost(model, cfg.vec_lanes, ov.vector_cycles_per_row_pass,
                                     overlap=requant_overlap)
            dvec = _model_vector_cost(model, cfg.vec_lanes, ov.vector_cycles_per_row_pass,
                                      overlap=False)
            rec, emit = ov.attend_record_cycles, ov.emit_cycles_per_byte
            rows, elems = vector_passes(model, requant_overlap)
            src["vector_cycles_per_element"] = (
                f"({rows} row passes x {ov.vector_cycles_per_row_pass:.2f} cycles + {elems} "
                f"element passes / {cfg.vec_lanes} lanes) / {sum(vector_elements(model))} "
                f"elements per token and layer; cycles per row pass: {run}: (cmp_job - "
                "gemm_active - element passes / vec_lanes) / row passes")
            src["decode_vector_cycles_per_element"] = (
                f"as vector_cycles_per_element with {vector_passes(model, False)[1]} element "
                "passes (one token per VEC entry: no requantise overlap)")
            src["attend_record_cycles"] = f"{run}: (cmp_attend - pair/KV bound) / att_records"
            src["emit_cycles_per_byte"] = f"{run}: cmp_emit_cycles / ACT K/V bytes"
        else:
            gemm = fig.kr260_macs_per_cycle if cfg.name == "kr260" else \
                fig.gemm_sequence_utilization * cfg.macs_per_cycle
            src["gemm_macs_per_cycle"] = fig.sources["kr260_macs_per_cycle" if cfg.name ==
                                                     "kr260" else "gemm_sequence_utilization"]
            vec, rec, emit = 1 / cfg.vec_lanes, 0.0, 1 / kv_rate
            dvec = vec
            src["vector_cycles_per_element"] = f"1 / vec_lanes ({cfg.vec_lanes}): one beat " \
                                               "per cycle"
            src["attend_record_cycles"] = "0 (engine rates alone)"
            src["emit_cycles_per_byte"] = "the KV reader's DMA rate"
        src |= tiled.pop("sources")
        return cls(cfg.name, gemm, vec, rec, pair, kv_rate, emit, overheads, src, **tiled,
                   decode_vector_cycles_per_element=dvec)

    @classmethod
    def idle(cls, config: str) -> NodeRates:
        """A node that computes nothing (the KV placed by the PS: communication alone)."""
        inf = float("inf")
        return cls(config, inf, 0.0, 0.0, 0.0, inf, 0.0, False, {"all": "no compute"})

    # --- per layer ---------------------------------------------------------------------------
    def job_a(self, w: NodeWork) -> float:
        return w.macs_a / self.gemm_macs_per_cycle + w.vec_a * self.vector_cycles_per_element

    def job_b(self, w: NodeWork) -> float:
        return w.macs_b / self.gemm_macs_per_cycle + w.vec_b * self.vector_cycles_per_element

    def emit(self, w: NodeWork) -> float:
        return w.emit_bytes * self.emit_cycles_per_byte

    def attend(self, w: NodeWork) -> float:
        if w.tile_records:
            return self.attend_tiled(w)
        if not w.records:
            return 0.0
        return w.records * self.attend_record_cycles + max(
            w.pairs * self.attend_pair_cycles, w.kv_read_bytes / self.kv_read_bytes_per_cycle)

    def attend_tiled(self, w: NodeWork) -> float:
        """The PREFILL_TILE records of ``w`` at the tiled executor's measured rate (a block
        longer than ``tile_block`` keys, possible in the ``plan`` layout, as blocks of it)."""
        if not self.tile_chunk:
            raise ValueError("PREFILL_TILE work on rates without the tiled path")
        rb, kc, blk = self.tile_row_block_cycles, self.tile_key_cycles, self.tile_block
        rk = self.tile_row_key_cycles

        def pair(rows, keys):
            return max(rows * rb, keys * kc, rows * keys * rk)
        pairs = 0.0
        for rows, keys in w.tile_pairs:
            whole, rest = divmod(keys, blk)
            pairs += whole * pair(rows, blk) + (pair(rows, rest) if rest else 0.0)
        return w.tile_records * self.tile_record_cycles + w.tile_rows * self.tile_row_cycles \
            + pairs

    def to_dict(self) -> dict:
        """JSON-ready (an unbounded rate is ``None``)."""
        def val(v):
            return None if isinstance(v, float) and v == float("inf") else v
        return {k: val(getattr(self, k)) for k in (
            "config", "gemm_macs_per_cycle", "vector_cycles_per_element",
            "attend_record_cycles", "attend_pair_cycles", "kv_read_bytes_per_cycle",
            "emit_cycles_per_byte", "overheads", "tile_chunk", "tile_record_cycles",
            "tile_row_cycles", "tile_row_block_cycles", "tile_key_cycles",
            "tile_row_key_cycles", "decode_vector_cycles_per_element")} | {
            "sources": dict(self.sources)}
