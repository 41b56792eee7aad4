"""The measured figures the system model is calibrated with, read from the bench results — never
typed. Each bench's JSON is taken from ``build/bench/<name>.json`` when ``mcf bench <name>`` has
written one, else from the committed ``docs/results/<name>.json``; every figure keeps where it
came from (:attr:`BenchFigures.sources`).

What is read (bench → figure):

* ``node`` — ``macs_per_cycle`` (the kr260 node's GEMM, Qwen-shaped prefill sequence),
  ``meta_records_per_cycle`` (command-ring ingress through the whole node), and the ``layer``
  entry: the measured 2-node tiny-model layer program (step cycles, link latency, per-engine
  busy cycles) — :class:`LayerRun` — and the ``prefill`` entry, the same cluster's
  communication alone — :class:`CommRun`;
* ``compute`` — ``dma_efficiency`` (the DMA read bench), ``gemm_sequence_mac_utilization``
  (one 16 x 16 array on the prefill sequence);
* ``attention`` — cycles per visible (query, key, head) of the prefill cases per GQA group and
  the engine geometry they were measured at; ``tiled`` (optional: only a node with the tiled
  prefill needs it) — the PREFILL_TILE executor's measured rate and the shape it was measured
  at (:func:`mcf.sim.perf.attention.tiled`);
* ``attention_arrays`` (optional: only a node with ``attn_on_arrays`` needs it) — cycles per
  visible (query, key, head) of the attention engine on the GEMM's arrays
  (:class:`mcf.hdl.compute.array_engine.ArrayEngine`, :mod:`mcf.sim.perf.attention_arrays`), its
  prefill cases per GQA group and the shape it was measured at (:class:`ArrayAttentionRate`);
* ``nic`` — the router's hop latency and output beats per cycle, the link framer's wire beats
  per cycle;
* ``packet`` — the packet path's latency of a header-only packet and its per-packet header
  cycles (64-bit path, the node's packet width);
* ``decode`` (optional: only Table 2's decode row needs it) — the weight stream of the stripe
  readers (:class:`mcf.hdl.mem.stripe.StripeReader`, four HP ports in lockstep into the GEMM's
  512-bit ``w_in``) in bytes per cycle, measured on an M = 1 Qwen2.5-1.5B layer against DDR
  port models that idle 10 % of cycles (``weights_ddr90``: the realistic figure, the 90 %
  controller efficiency an assumption) and ideal ones (``weights``).

The clock every cycle count is converted at is :data:`mcf.abi.platform.ACLK_HZ` (an assumption,
no fmax claimed); :func:`at_clock` gives the same figures at another clock (``mcf model
--clock-mhz``). Every figure read here is in cycles and does not depend on the clock; what does
is derived from the clock where it is used: a link's line rate in bytes per cycle
(``rate_bps / 8 / clock_hz``, :meth:`.network.Network.line_bytes_per_cycle`) and a cable's
latency in cycles (``LINK_LATENCY_S x clock_hz``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..abi.framing import MAX_PAYLOAD, payload_beats
from ..abi.node_config import PACKET_WIDTH
from ..abi.platform import ACLK_HZ

__all__ = ["CalibrationError", "LayerRun", "CommRun", "ArrayAttentionRate", "BenchFigures",
           "load_figures", "results_dirs", "at_clock", "REPO", "PAIR_CASE_KIND"]

REPO = Path(__file__).resolve().parents[2]
"""The checkout the package is installed from (``sw/`` is ``mcf``)."""


class CalibrationError(ValueError):
    """A bench result is missing, incomplete or does not describe the run the model expects."""


def results_dirs(root: Path = REPO) -> tuple[Path, Path]:
    """Where bench results are looked up, in order: ``build/bench`` then ``docs/results``."""
    return root / "build" / "bench", root / "docs" / "results"


def _load(name: str, dirs) -> tuple[dict, str]:
    for d in dirs:
        path = Path(d) / f"{name}.json"
        if path.is_file():
            shown = path.resolve()
            shown = shown.relative_to(REPO) if shown.is_relative_to(REPO) else shown
            try:
                return json.loads(path.read_text()), str(shown)
            except json.JSONDecodeError as exc:
                raise CalibrationError(f"{path}: not JSON ({exc})") from None
    raise CalibrationError(f"no {name}.json in {', '.join(str(d) for d in dirs)} "
                           f"(run `mcf bench {name}`)")


def _load_optional(name: str, dirs) -> tuple[dict, str] | None:
    """:func:`_load`, or ``None`` when no folder has ``<name>.json`` (a file that is there but
    not JSON still refuses)."""
    if not any((Path(d) / f"{name}.json").is_file() for d in dirs):
        return None
    return _load(name, dirs)


def _get(doc: dict, path: str, where: str):
    cur = doc
    for key in path.split("."):
        if not isinstance(cur, dict) or key not in cur:
            raise CalibrationError(f"{where}: no {path!r}")
        cur = cur[key]
    return cur


@dataclass(frozen=True)
class CommRun:
    """node.json's ``prefill`` entry: the same cluster's MARS steps with the KV placed by the
    PS — the communication alone (doorbell to the last landing, nothing computed)."""
    nodes: int
    model: str
    seq_len: int
    chunk: int
    link_latency_cycles: int
    step_cycles: tuple[int, ...]

    @staticmethod
    def _common(e: dict) -> tuple:
        return (int(e["nodes"]), str(e["model"]), int(e["seq_len"]), int(e["chunk"]),
                int(e["link_latency_cycles"]), tuple(int(c) for c in e["step_cycles"]))

    @classmethod
    def from_entry(cls, e: dict, where: str) -> CommRun:
        try:
            return cls(*cls._common(e))
        except (KeyError, TypeError, ValueError) as exc:
            raise CalibrationError(f"{where}: incomplete prefill entry ({exc})") from None


@dataclass(frozen=True)
class LayerRun(CommRun):
    """node.json's ``layer`` entry: the tiny model's layer program on two simulated ``sim``
    node tops (every layer computed on the nodes, bit-exact), MARS's prefill steps."""
    compute_busy_fraction: float = 0.0
    engines: dict = field(default_factory=dict)   # node -> {counter: value}

    @classmethod
    def from_entry(cls, e: dict, where: str) -> LayerRun:
        try:
            engines = {int(k): dict(v) for k, v in e["engines"].items()}
            run = cls(*cls._common(e), float(e["compute_busy_fraction"]), engines)
        except (KeyError, TypeError, ValueError) as exc:
            raise CalibrationError(f"{where}: incomplete layer entry ({exc})") from None
        if sorted(engines) != list(range(run.nodes)):
            raise CalibrationError(f"{where}: engines of nodes {sorted(engines)}, "
                                   f"expected 0..{run.nodes - 1}")
        return run


PAIR_CASE_KIND = "prefill"
"""The bench cases a node's cycles per ATTEND pair are read from (``attention.json``'s and
``attention_arrays.json``'s): the causal prefill jobs, per causally visible pair."""


def _pair_cases(doc: dict, where: str) -> tuple[dict[int, float], dict[int, str]]:
    """``(GQA group -> cycles per visible pair, GQA group -> case name)`` of the
    :data:`PAIR_CASE_KIND` cases of a bench's ``cases``."""
    pairs, names = {}, {}
    cases = _get(doc, "cases", where)
    if not isinstance(cases, dict):
        raise CalibrationError(f"{where}: cases is not an object")
    for case, row in cases.items():
        if isinstance(row, dict) and row.get("kind") == PAIR_CASE_KIND:
            try:
                pairs[int(row["heads"])] = float(row["cycles_per_qk"])
            except (KeyError, TypeError, ValueError) as exc:
                raise CalibrationError(f"{where}: incomplete case {case} ({exc})") from None
            names[int(row["heads"])] = case
    if not pairs:
        raise CalibrationError(f"{where}: no {PAIR_CASE_KIND} case")
    return pairs, names


def _nearest_group(pairs: dict[int, float], group: int) -> int:
    """The GQA group measured nearest ``group`` (the smaller one on a tie)."""
    return min(sorted(pairs), key=lambda x: (abs(x - group), x))


@dataclass(frozen=True)
class ArrayAttentionRate:
    """``attention_arrays.json``: the attention engine on the GEMM's arrays
    (:class:`mcf.hdl.compute.array_engine.ArrayEngine`) at one node configuration's shape —
    cycles per causally visible (query, key, head) of its prefill cases, steady state."""
    cycles_per_pair: dict          # GQA group G -> cycles per visible (query, key, head)
    cases: dict                    # GQA group G -> the bench case measuring it
    shape: dict                    # the engine's parameters (mcf.sim.perf.attention_arrays)
    decode_cycles_per_pair: float  # the bench's decode_g6 (reported, not priced)

    def pair_cycles(self, group: int) -> tuple[float, str]:
        """Cycles per visible pair measured at GQA group ``group`` (the nearest group measured
        when that one was not) and the case's name."""
        g = _nearest_group(self.cycles_per_pair, group)
        return self.cycles_per_pair[g], self.cases[g]

    @classmethod
    def from_doc(cls, doc: dict, where: str) -> ArrayAttentionRate:
        pairs, names = _pair_cases(doc, where)
        shape = _get(doc, "shape", where)
        if not isinstance(shape, dict):
            raise CalibrationError(f"{where}: shape is not an object")
        try:
            dec = float(_get(doc, "decode_cycles_per_qk", where))
        except (TypeError, ValueError) as exc:
            raise CalibrationError(f"{where}: decode_cycles_per_qk ({exc})") from None
        return cls(pairs, names, dict(shape), dec)


@dataclass(frozen=True)
class BenchFigures:
    """Every measured figure the model uses, with its source (``sources[field]``)."""
    clock_hz: float
    kr260_macs_per_cycle: float
    gemm_sequence_utilization: float
    meta_records_per_cycle: float
    dma_efficiency: float
    attention_cycles_per_pair: dict         # GQA group G -> cycles per (query, key, head)
    attention_cases: dict                   # GQA group G -> the bench case measuring it
    attention_head_dim: int                 # the attention bench's engine geometry
    attention_lanes: int
    router_hop_cycles: int
    router_beats_per_cycle: float
    framer_beats_per_cycle: float
    packet_latency_cycles: int              # header-only packet through packetizer -> parser
    packet_header_cycles: float             # cycles per packet beyond its payload beats
    layer: LayerRun
    comm: CommRun
    sources: dict = field(default_factory=dict)
    node_macs_per_cycle_peak: float | None = None   # node.json's, when the bench reports it
    stripe_weight_bytes_per_cycle: float | None = None  # decode.json weights_ddr90 (no file: None)
    stripe_ddr_efficiency: float | None = None          # the DDR efficiency it was measured at
    stripe_ideal_weight_bytes_per_cycle: float | None = None    # decode.json weights
    # attention.json's tiled entries (``tiled``, ``tiled_<config>``), each measured at one shape
    attention_tiled: tuple = ()
    attention_arrays: ArrayAttentionRate | None = None  # attention_arrays.json (no file: None)

    def attention_pair_cycles(self, group: int) -> tuple[float, str]:
        """Cycles per visible pair measured at GQA group ``group`` (the nearest group measured
        when that one was not) and the case's name."""
        g = _nearest_group(self.attention_cycles_per_pair, group)
        return self.attention_cycles_per_pair[g], self.attention_cases[g]


def load_figures(dirs=None) -> BenchFigures:
    """Read every figure from the bench results (``dirs``: folders searched in order; default
    :func:`results_dirs`)."""
    dirs = tuple(dirs) if dirs is not None else results_dirs()
    node, node_at = _load("node", dirs)
    comp, comp_at = _load("compute", dirs)
    att, att_at = _load("attention", dirs)
    nic, nic_at = _load("nic", dirs)
    pkt, pkt_at = _load("packet", dirs)
    src: dict[str, str] = {"clock_hz": "mcf.abi.platform.ACLK_HZ (assumed aclk, no fmax)"}

    def take(doc, at, path, name):
        v = _get(doc, path, at)
        src[name] = f"{at}: {path}"
        return v

    pairs, cases = _pair_cases(att, att_at)
    src["attention_cycles_per_pair"] = f"{att_at}: cases.{PAIR_CASE_KIND}_g*.cycles_per_qk"
    arrays = None
    found = _load_optional("attention_arrays", dirs)
    if found is None:
        src["attention_arrays"] = ("no attention_arrays.json (run `mcf bench "
                                   "attention_arrays`)")
    else:
        arr, arr_at = found
        arrays = ArrayAttentionRate.from_doc(arr, arr_at)
        src["attention_arrays"] = f"{arr_at}: cases.{PAIR_CASE_KIND}_g*.cycles_per_qk"
    width = str(PACKET_WIDTH)
    cpp = take(pkt, pkt_at, f"widths.{width}.cycles_per_packet", "packet_header_cycles")
    size = str(payload_beats(MAX_PAYLOAD, PACKET_WIDTH))
    if size not in cpp:
        raise CalibrationError(f"{pkt_at}: no {size}-beat (MAX_PAYLOAD) packet at {width} bits")
    stripe = {}
    try:
        dec, dec_at = _load("decode", dirs)
    except CalibrationError:
        src["stripe_weight_bytes_per_cycle"] = "no decode.json (run `mcf bench decode`)"
    else:
        stripe = dict(
            stripe_weight_bytes_per_cycle=float(take(
                dec, dec_at, "weights_ddr90.weight_bytes_per_cycle",
                "stripe_weight_bytes_per_cycle")),
            stripe_ddr_efficiency=float(take(dec, dec_at, "weights_ddr90.ddr_efficiency",
                                             "stripe_ddr_efficiency")),
            stripe_ideal_weight_bytes_per_cycle=float(take(
                dec, dec_at, "weights.weight_bytes_per_cycle",
                "stripe_ideal_weight_bytes_per_cycle")))
    tiled = []
    names = sorted(k for k in att if k == "tiled" or k.startswith("tiled_"))
    for name in names:
        entry = att[name]
        keys = ("record_cycles", "row_cycles", "row_block_cycles", "key_cycles",
                "row_key_cycles", "shape")
        if not isinstance(entry, dict) or any(k not in entry for k in keys):
            raise CalibrationError(f"{att_at}: {name} needs {', '.join(keys)}")
        tiled.append(entry | {"entry": name})
    src["attention_tiled"] = (f"{att_at}: " + ", ".join(names) if names else
                              f"{att_at}: no tiled entry (run `mcf bench attention`)")
    layer_entry = take(node, node_at, "layer", "layer")
    comm_entry = take(node, node_at, "prefill", "comm")
    return BenchFigures(
        clock_hz=ACLK_HZ,
        kr260_macs_per_cycle=float(take(node, node_at, "macs_per_cycle", "kr260_macs_per_cycle")),
        gemm_sequence_utilization=float(take(comp, comp_at, "gemm_sequence_mac_utilization",
                                             "gemm_sequence_utilization")),
        meta_records_per_cycle=float(take(node, node_at, "meta_records_per_cycle",
                                          "meta_records_per_cycle")),
        dma_efficiency=float(take(comp, comp_at, "dma_efficiency", "dma_efficiency")),
        attention_cycles_per_pair=pairs,
        attention_cases=cases,
        attention_head_dim=int(take(att, att_at, "params.head_dim", "attention_head_dim")),
        attention_lanes=int(take(att, att_at, "params.lanes", "attention_lanes")),
        router_hop_cycles=int(take(nic, nic_at, "multicast.hop_latency_cycles",
                                   "router_hop_cycles")),
        router_beats_per_cycle=float(take(nic, nic_at, "multicast.beats_per_cycle",
                                          "router_beats_per_cycle")),
        framer_beats_per_cycle=float(take(nic, nic_at, "link.wire_beats_per_cycle",
                                          "framer_beats_per_cycle")),
        packet_latency_cycles=int(take(pkt, pkt_at, f"widths.{width}.latency.0",
                                       "packet_latency_cycles")),
        packet_header_cycles=float(cpp[size]) - int(size),
        layer=LayerRun.from_entry(layer_entry, f"{node_at}: layer"),
        comm=CommRun.from_entry(comm_entry, f"{node_at}: prefill"),
        sources=src,
        attention_tiled=tuple(tiled),
        attention_arrays=arrays,
        node_macs_per_cycle_peak=(float(take(node, node_at, "macs_per_cycle_peak",
                                             "node_macs_per_cycle_peak"))
                                  if "macs_per_cycle_peak" in node else None),
        **stripe)


def at_clock(fig: BenchFigures, clock_hz: float) -> BenchFigures:
    """``fig`` with every cycle turned into seconds at ``clock_hz`` instead of
    :data:`~mcf.abi.platform.ACLK_HZ`. The measured figures are cycles and stay as they are (the
    RTL does the same work per cycle at any clock); the links do not: a link keeps its rate in
    bit/s and its cable latency in seconds, so per cycle it carries ``rate_bps / 8 / clock_hz``
    bytes and its latency is ``latency_s x clock_hz`` cycles (:class:`.network.Network` derives
    both from ``fig.clock_hz``). A slower clock therefore stretches every compute-bound second
    by ``ACLK_HZ / clock_hz`` and leaves link-bound seconds as they were. Raises ``ValueError``
    for a clock that is not a finite number > 0."""
    if not (isinstance(clock_hz, (int, float)) and math.isfinite(clock_hz) and clock_hz > 0):
        raise ValueError(f"the clock must be a finite number > 0 Hz, got {clock_hz}")
    if clock_hz == fig.clock_hz:
        return fig
    src = fig.sources | {"clock_hz": f"given: {clock_hz / 1e6:g} MHz (mcf model --clock-mhz; "
                                     f"the ABI's assumed aclk is {ACLK_HZ / 1e6:g} MHz, no fmax "
                                     "claimed)"}
    return replace(fig, clock_hz=float(clock_hz), sources=src)
