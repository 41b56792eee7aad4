"""The event-level system model (``mcf.sysmodel``, ``mcf model``; docs/system-model.md): the
calibration read from the bench JSON, the node program's work counts against the node's own
templates and read sets, the event engine on hand-computed cases, the network's packet costs,
the validation against the RTL layer bench (within 15 %), MARS and the baselines on Qwen2.5,
and the command's errors."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from mcf.abi.compute import DmaDesc
from mcf.abi.eth import FCS_BYTES, HEADER_BYTES, IFG_BYTES, LINK_OVERHEAD, PREAMBLE
from mcf.abi.jobs import JOB_ARG, VEC_CFG, walk
from mcf.abi.node_config import KR260, SIM
from mcf.abi.node_config import KR260_ENGINE as ENGINE
from mcf.abi.platform import ACLK_HZ, SFP_RATE_BPS
from mcf.abi.quant import VectorOp
from mcf.cli import main
from mcf.mars import get_model, plan
from mcf.mars.cluster import ClusterSpec, make_topology
from mcf.sysmodel.calibration import CalibrationError, load_figures, results_dirs
from mcf.sysmodel.events import COMPUTE, NET, Hop, Route, StepInput, simulate_step
from mcf.sysmodel.network import Network, cluster_for
from mcf.sysmodel.rates import (
    RIDING_OPS,
    TWO_PASS_OPS,
    VECTOR_BEATS_PER_CYCLE,
    NodeRates,
    ProgramOverheads,
    run_work,
    vector_passes,
)
from mcf.sysmodel.system import SystemSpec, simulate_plan
from mcf.sysmodel.validate import validate, validate_comm
from mcf.sysmodel.work import keys_read_blocks, node_work, vector_elements

DOCS = results_dirs()[1]


@pytest.fixture(scope="module")
def fig():
    return load_figures()


@pytest.fixture(scope="module")
def qwen():
    return get_model("qwen2.5-1.5b")


# --- calibration ----------------------------------------------------------------------------

def _copy_results(tmp_path):
    d = tmp_path / "results"
    shutil.copytree(DOCS, d)
    return d


def test_figures_come_from_the_bench_json(tmp_path):
    d = _copy_results(tmp_path)
    base = load_figures([d])
    node = json.loads((d / "node.json").read_text())
    node["macs_per_cycle"] = 512.0
    (d / "node.json").write_text(json.dumps(node))
    for name in ("attention.json", "attention_arrays.json"):
        att = json.loads((d / name).read_text())
        att["cases"]["prefill_g6"]["cycles_per_qk"] *= 2
        (d / name).write_text(json.dumps(att))
    comp = json.loads((d / "compute.json").read_text())
    comp["dma_efficiency"] = 0.5
    (d / "compute.json").write_text(json.dumps(comp))
    got = load_figures([d])
    q = get_model("qwen2.5-1.5b")
    r0, r1 = (NodeRates.calibrated(f, "kr260", q) for f in (base, got))
    assert r1.gemm_macs_per_cycle == 512.0 != r0.gemm_macs_per_cycle
    assert r1.attend_pair_cycles == pytest.approx(2 * r0.attend_pair_cycles)   # on the arrays
    e0, e1 = (NodeRates.calibrated(f, ENGINE, q) for f in (base, got))
    assert e1.attend_pair_cycles == pytest.approx(2 * e0.attend_pair_cycles)   # vector engine
    assert r1.kv_read_bytes_per_cycle == pytest.approx(8.0)
    assert str(d / "node.json") in got.sources["kr260_macs_per_cycle"]
    assert load_figures([DOCS]).sources["dma_efficiency"] == \
        "docs/results/compute.json: dma_efficiency"
    assert got.clock_hz == ACLK_HZ


def test_lookup_order_and_missing_bench(tmp_path):
    d = _copy_results(tmp_path)
    first = tmp_path / "bench"
    first.mkdir()
    node = json.loads((d / "node.json").read_text())
    node["meta_records_per_cycle"] = 0.25
    (first / "node.json").write_text(json.dumps(node))
    f = load_figures([first, d])
    assert f.meta_records_per_cycle == 0.25
    assert str(first / "node.json") in f.sources["layer"]
    (d / "nic.json").unlink()
    with pytest.raises(CalibrationError, match=r"no nic\.json .*mcf bench nic"):
        load_figures([first, d])


def test_program_overheads_from_the_layer_run(fig):
    ov = ProgramOverheads.measure(fig)
    assert ov.config == SIM.name                  # recognised from the GEMM step counter
    run = fig.layer
    e0 = run.engines[0]
    assert ov.gemm_macs_per_cycle == pytest.approx(
        e0["gemm_steps"] * SIM.macs_per_cycle / e0["gemm_active_cycles"])
    assert ov.gemm_macs_per_cycle < SIM.macs_per_cycle
    # the two nodes' ATTEND totals differ by 256 blocks of visible keys: the attention bench's
    # cycles per pair account for that difference to within 1 % of one record's fixed cost
    assert ov.attend_record_spread < 0.01 * ov.attend_record_cycles
    assert ov.emit_cycles_per_byte > 0
    # the vector cost's two terms give back the JOB cycles the GEMM was not active, per node
    model, work = run_work(run)
    rows, elems = vector_passes(model)
    tokens = [model.layers * sum(w.tokens for w in work[n]) for n in range(run.nodes)]
    excess = [run.engines[n]["cmp_job_cycles"] - run.engines[n]["gemm_active_cycles"]
              for n in range(run.nodes)]
    assert ov.vector_cycles_per_row_pass > 0
    assert sum(t * (rows * ov.vector_cycles_per_row_pass + elems / SIM.vec_lanes)
               for t in tokens) == pytest.approx(sum(excess))
    assert ov.vector_cycles_per_element == pytest.approx(
        sum(excess) / sum(t * sum(vector_elements(model)) for t in tokens))


def test_vector_cost_amortises_over_wide_rows(fig, qwen):
    """Qwen2.5-1.5B's 1,536 / 8,960-wide rows pay the per-row-pass cycles over more elements
    than the tiny model's 128 / 256: its cycles per element are the two terms' at its widths."""
    ov = ProgramOverheads.measure(fig)
    r = NodeRates.calibrated(fig, "kr260", qwen)
    rows, elems = vector_passes(qwen)
    assert r.vector_cycles_per_element == pytest.approx(
        (rows * ov.vector_cycles_per_row_pass + elems / KR260.vec_lanes)
        / sum(vector_elements(qwen)))
    assert 1 / KR260.vec_lanes < r.vector_cycles_per_element < ov.vector_cycles_per_element


def test_overheads_refuse_a_run_of_another_shape(tmp_path):
    d = _copy_results(tmp_path)
    node = json.loads((d / "node.json").read_text())
    node["layer"]["engines"]["1"]["kvr_tokens"] += 16
    (d / "node.json").write_text(json.dumps(node))
    with pytest.raises(CalibrationError, match="kvr_tokens"):
        ProgramOverheads.measure(load_figures([d]))
    del node["layer"]["engines"]["0"]["cmp_emit_cycles"]
    (d / "node.json").write_text(json.dumps(node))
    with pytest.raises(CalibrationError, match="missing .*cmp_emit_cycles"):
        ProgramOverheads.measure(load_figures([d]))


def test_attention_rate_follows_the_configuration(fig, qwen):
    r = NodeRates.calibrated(fig, ENGINE, qwen)
    cpq, case = fig.attention_pair_cycles(6)
    assert case == "prefill_g6"
    assert r.attend_pair_cycles == pytest.approx(
        cpq * (qwen.head_dim / ENGINE.attn_lanes)
        / (fig.attention_head_dim / fig.attention_lanes))
    a_cpq, a_case = fig.attention_arrays.pair_cycles(6)          # kr260: ArrayEngine's, as is
    assert a_case == "prefill_g6"
    assert NodeRates.calibrated(fig, KR260, qwen).attend_pair_cycles == a_cpq
    with pytest.raises(ValueError, match="does not fit"):
        NodeRates.calibrated(fig, "kr260", get_model("tiny"))


# --- work counts ----------------------------------------------------------------------------

def test_vector_elements_match_the_node_templates():
    from mcf.golden.qwen_layer import TINY, quantize_layer, random_layer
    from mcf.node.layer import ModelImage
    from mcf.node.layout import NodeLayout
    spec = get_model("tiny")
    p = plan(spec, ClusterSpec(2, 1 << 20, 1 << 20, make_topology("kr260-ring", 2)), 64, 32,
             "mars", alpha=0.5)
    qls = [quantize_layer(random_layer(TINY, 0), TINY)]
    m = 16
    img = ModelImage(TINY, qls, SIM, NodeLayout.for_plan(p, SIM, base=0x1000), tokens=m)
    raw = img.image[img.table]

    def read(addr, n):
        return raw[addr - img.table: addr - img.table + n]

    counted, rows, passes, single = [], 0, 0, 0
    for t in range(2):
        actions, _ = walk(read, img.table, img.table_len, JOB_ARG.const({"template": t})
                          .as_bits(), SIM.gemm_limits)
        total, vec = 0, None
        for _, target, value in actions:
            if target == "vec":
                vec = VEC_CFG.from_bits(value)
            elif target == "rd_desc0" and vec is not None:
                n, count = int(vec.n_beats) * SIM.vec_lanes, DmaDesc.unpack(value).count
                total += n * count
                rows += count
                two = VectorOp(vec.op) in TWO_PASS_OPS
                # an entry's tokens back to back: a RIDING_OPS token's first pass rides along
                # the one before's second (the entry's first token pays both)
                ride = two and VectorOp(vec.op) in RIDING_OPS
                passes += n * count * (1 if ride or not two else 2)
                single += n * count * (2 if two else 1)
                vec = None
        counted.append(total)
    assert tuple(counted) == tuple(m * v for v in vector_elements(spec))
    assert (rows, passes) == tuple(m * v for v in vector_passes(spec))
    assert (rows, single) == tuple(m * v for v in vector_passes(spec, overlap=False))


def _vector_sim(lanes: int, n_max: int, bench) -> list[int]:
    """amaranth.sim of a vector unit with ``bench(dut, got)`` as its testbench; returns
    ``got``."""
    from amaranth.sim import Simulator

    from mcf.hdl.compute.vector import VectorUnit
    dut = VectorUnit(lanes=lanes, n_max=n_max)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    got = []
    sim.add_testbench(bench(dut, got))
    sim.run()
    return got


def _vector_token_cycles(jobs, lanes: int, n_max: int) -> list[int]:
    """amaranth.sim of the vector unit: cycles of each ``(op, n)`` token from its first ``a``
    beat to its last result beat, operands always valid and the result always taken."""
    from mcf.abi.quant import norm_eps_code

    def bench(dut, got):
        async def tb(ctx):
            ctx.set(dut.o.ready, 1)
            ctx.set(dut.eps, norm_eps_code(1e-6))
            for op, n in jobs:
                nb, ai, bi, cyc, start = n // lanes, 0, 0, 0, None
                ctx.set(dut.op, op)
                ctx.set(dut.n_beats, nb)
                while True:
                    ctx.set(dut.a.valid, ai < nb)
                    ctx.set(dut.a.payload, (ai * 7919 + 1) & 0xFFFF)
                    ctx.set(dut.b.valid, op != VectorOp.REQUANT and bi < nb)
                    ctx.set(dut.b.payload, 0x4000)
                    _, _, ar, av, br, bv, ov, p = await ctx.tick().sample(
                        dut.a.ready, dut.a.valid, dut.b.ready, dut.b.valid, dut.o.valid,
                        dut.o.payload)
                    if ar and av:
                        start = cyc if start is None else start
                        ai += 1
                    bi += int(br and bv)
                    cyc += 1
                    if ov and p.last:
                        got.append(cyc - start)
                        break
                ctx.set(dut.a.valid, 0)
                ctx.set(dut.b.valid, 0)
                await ctx.tick().repeat(4)

        return tb
    return _vector_sim(lanes, n_max, bench)


def test_vector_unit_runs_at_the_models_element_rate():
    """The vector cost's per-element term is the unit's: each op of the node program takes
    ``passes x n / lanes`` more cycles for ``n`` more elements (two passes for
    :data:`TWO_PASS_OPS`) at :data:`VECTOR_BEATS_PER_CYCLE`; what does not grow with the row
    is the per-row-pass term the layer run calibrates."""
    lanes, n0, n1 = SIM.vec_lanes, 64, 128
    ops = (VectorOp.ADD, VectorOp.SILU_MUL, VectorOp.ROPE, VectorOp.RMSNORM, VectorOp.REQUANT)
    cycles = _vector_token_cycles([(op, n) for op in ops for n in (n0, n1)], lanes, n1)
    for i, op in enumerate(ops):
        passes = 2 if op in TWO_PASS_OPS else 1
        assert cycles[2 * i + 1] - cycles[2 * i] == \
            passes * (n1 - n0) / lanes / VECTOR_BEATS_PER_CYCLE, op


def test_node_program_reads_whole_blocks():
    spec = get_model("tiny")
    p = plan(spec, ClusterSpec(2, 1 << 20, 1 << 20, make_topology("kr260-ring", 2)), 128, 32,
             "mars", alpha=0.5)
    for c in range(1, 5):
        # node 0's 16 tokens see every earlier slice and their own; node 1's also node 0's
        assert keys_read_blocks(p, c, 0) == 16 * (32 * (c - 1) + 16)
        assert keys_read_blocks(p, c, 1) == 16 * (32 * (c - 1) + 32)
        w = node_work(spec, p, c, 1, "node-program")
        assert w.tokens == 16 and w.records == 32
        # node 1's tokens (16..31 of the chunk) see 32(c-1) + 17..32 keys, every query head
        assert w.pairs == spec.q_heads * sum(32 * (c - 1) + 17 + i for i in range(16))
    a = node_work(spec, p, 2, 0, "plan", scope="attention")
    assert a.macs_a == a.vec_b == a.emit_bytes == 0 and a.pairs > 0


# --- network and events ---------------------------------------------------------------------

def test_packet_costs(fig):
    topo = make_topology("kr260-switch", 2)
    net = Network(topo, fig)
    up, down = (0, 0), (-1, 1)
    assert net.frame_wire_bytes(1980) == (len(PREAMBLE) + 1 + HEADER_BYTES + LINK_OVERHEAD
                                          + 1980 + FCS_BYTES + IFG_BYTES)
    assert net.frame_wire_bytes(0) == len(PREAMBLE) + 1 + 64 + IFG_BYTES   # padded frame
    rate = SFP_RATE_BPS / 8 / ACLK_HZ
    assert net.packet_cycles(down, 1980, False) == pytest.approx(net.frame_wire_bytes(1980)
                                                                 / rate)
    assert net.link_latency(up) == pytest.approx(2e-6 * ACLK_HZ)          # ends at the switch
    assert net.link_latency(down) == pytest.approx(2e-6 * ACLK_HZ + fig.router_hop_cycles
                                                   + fig.packet_latency_cycles)
    bare = Network(topo, fig, ethernet=False, latency_cycles=64)
    assert bare.frame_wire_bytes(1980) == LINK_OVERHEAD + 1980
    assert bare.link_latency(up) == 64
    ideal = Network(cluster_for("ideal", 2, 64, node_config="kr260").topology, fig)
    # unbounded line rate: the NIC's framer, router and record ingress set the time
    assert ideal.packet_cycles((0, 0), 1980, True) == pytest.approx(max(
        -(-(LINK_OVERHEAD + 1980) // 8) / fig.framer_beats_per_cycle,
        (-(-1980 // 8) + fig.packet_header_cycles) / fig.router_beats_per_cycle,
        1 / fig.meta_records_per_cycle))


def _hop(link, cycles, latency, dest, parent=-1, first=None, last=None):
    first = cycles if first is None else first
    last = cycles if last is None else last
    return Hop(link, parent, cycles, first, last, latency, dest)


def test_events_overlap_and_wait():
    # node 0 emits at 100; its message (300 cycles, latency 50) lands at node 1 at 450, which
    # waits from 110 (JOB 100 + EMIT 10) and then runs ATTEND 20 + JOB 30
    ops = ((90, 10, 5, 5), (100, 10, 20, 30))
    r = Route(0, (_hop("a", 300, 50, 1),), (1,), COMPUTE, "emit")
    tl = simulate_step(StepInput(2, 1, ops, (r,)))
    assert tl.finish == [110, 500] and tl.last_landing == 450
    assert tl.waited == [0, 340] and tl.busy == [110, 160]
    assert tl.cycles == 500 and tl.exposed == 340
    # two layers: layer 1's message queues behind layer 0's on the link
    tl = simulate_step(StepInput(2, 2, ((10, 0, 0, 0), (10, 0, 0, 0)),
                                 (Route(0, (_hop("a", 100, 0, 1),), (1,), COMPUTE, "emit"),)))
    assert tl.finish == [20, 210] and tl.last_landing == 210


def test_events_classes_alternate_and_relays_pipeline():
    idle = ((0, 0, 0, 0),) * 3
    net = [Route(0, (_hop("a", 100, 0, 1),), (1,), NET, "start") for _ in range(2)]
    comp = Route(0, (_hop("a", 10, 0, 1),), (1,), COMPUTE, "emit")
    tl = simulate_step(StepInput(3, 1, idle, (*net, comp)))
    assert tl.last_landing == 210          # NET 0..100, then COMPUTE 100..110, NET 110..210
    # a ring hop 0 -> 1 -> 2: the relay starts once the first packet is across and cannot end
    # before its last packet has arrived
    first = Route(0, (_hop("a", 100, 5, 1, first=25, last=25),), (1,), NET, "start", (1,))
    relay = Route(1, (_hop("b", 40, 5, 2, first=10, last=10),), (2,), NET, "relay")
    tl = simulate_step(StepInput(3, 1, idle, (first, relay)))
    assert tl.last_landing == 100 + 5 + 10 + 5
    assert tl.link_busy == {"a": 100, "b": 40}


# --- validation against the RTL -------------------------------------------------------------

def test_model_predicts_the_layer_bench_within_15_percent(fig):
    v = validate(fig)
    assert len(v.predicted) == len(fig.layer.step_cycles)
    assert v.max_error < 0.15, v.to_dict()
    assert abs(v.busy_predicted - fig.layer.compute_busy_fraction) < 0.02
    # the step grows with the chunk at the attention bench's rate per pair
    grow = [b - a for a, b in zip(v.predicted, v.predicted[1:])]
    meas = [b - a for a, b in zip(v.measured, v.measured[1:])]
    for g, m in zip(grow, meas):
        assert g == pytest.approx(m, rel=0.15)


def test_engine_rates_alone_miss_the_layer_bench(fig):
    v = validate(fig, overheads=False)
    assert all(e < -0.3 for e in v.errors)       # the node program's overheads dominate tiny


def test_communication_only_steps(fig):
    v = validate_comm(fig)
    assert len(v.predicted) == len(fig.comm.step_cycles)
    # every step predicted low: the fixed start-up latency in DDR is not modelled
    assert all(-0.3 < e < 0 for e in v.errors), v.errors


# --- MARS and the baselines -----------------------------------------------------------------

def _run(fig, model, link, policy, n, seq=4096, chunk=1024, **kw):
    p = plan(model, cluster_for(link, n, 64, node_config="kr260"), seq, chunk, policy, 0.5,
             **kw)
    return p, simulate_plan(p, fig)


def test_qwen_mars_and_baselines(fig, qwen):
    res = {(link, pol): _run(fig, qwen, link, pol, 4)[1]
           for link in ("kr260-ring", "ideal") for pol in ("mars", "ring", "zigzag", "full")}
    for r in res.values():
        assert r.ttft_cycles >= r.compute_cycles > 0
        assert r.ttft_cycles == pytest.approx(r.compute_cycles + r.exposed_cycles)
        assert r.ttft_s == pytest.approx(r.ttft_cycles / ACLK_HZ)
    for pol in ("mars", "ring", "zigzag"):
        assert res[("ideal", pol)].exposed_cycles <= res[("kr260-ring", pol)].exposed_cycles
    ring = res[("kr260-ring", "mars")]
    best = min(res[("kr260-ring", f)].ttft_s for f in ("ring", "zigzag"))
    assert ring.ttft_s <= 1.02 * best
    # zigzag balances the causal work, contiguous ring does not
    z, r = res[("ideal", "zigzag")], res[("ideal", "ring")]
    assert min(z.busy_fraction()) > min(r.busy_fraction())
    assert simulate_plan(_run(fig, qwen, "ideal", "mars", 4)[0], fig).ttft_cycles == \
        res[("ideal", "mars")].ttft_cycles                              # deterministic


def test_scope_pd_and_unchunked(fig, qwen):
    p, whole = _run(fig, qwen, "switch10g", "zigzag", 2, seq=2048, chunk=512)
    att = simulate_plan(p, fig, SystemSpec(scope="attention"))
    assert 0 < att.compute_cycles < whole.compute_cycles
    p, pd = _run(fig, qwen, "switch10g", "pd", 4, seq=2048, chunk=512)
    assert len(pd.steps) == p.num_chunks + 1 and pd.steps[-1].timeline.cycles > 0
    assert sum(pd.steps[-1].timeline.busy) == 0                        # hand-off: links only
    p, un = _run(fig, qwen, "switch10g", "zigzag", 2, seq=2048, chunk=2048, streams=False)
    assert len(un.steps) == 1 and un.ttft_cycles > 0


# --- the command ----------------------------------------------------------------------------

def test_mcf_model_json(capsys):
    assert main(["model", "--nodes", "2", "--seq", "2048", "--chunk", "1024", "--link",
                 "switch10g", "--schemes", "mars,zigzag,ring,full", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["scheme"] for r in out["rows"]] == ["mars", "zigzag", "ring", "full"]
    assert out["speedups"][0]["nodes"] == 2
    assert out["clock_hz"] == ACLK_HZ and "kr260_macs_per_cycle" in out["calibration"]
    assert all(math.isfinite(r["ttft_s"]) for r in out["rows"])


def test_mcf_model_validate(capsys):
    assert main(["model", "--validate-only"]) == 0
    out = capsys.readouterr().out
    assert "calibrated" in out and "max |error|" in out and "communication only" in out


@pytest.mark.parametrize("argv, msg", [
    (["--nodes", "2,x"], "--nodes must be a comma-separated list"),
    (["--nodes", "0"], "--nodes must all be >= 1"),
    (["--link", "fiber"], "unknown --link 'fiber'"),
    (["--seq", "1000", "--chunk", "512"], "must be a positive multiple"),
    (["--schemes", "mars,nope"], "unknown scheme 'nope'"),
    (["--model", "tiny"], "does not fit the kr260 attention engine"),
    (["--scope", "all"], "unknown --scope"),
    (["--alpha", "nan"], "--alpha must be a finite number"),
])
def test_mcf_model_bad_arguments(capsys, argv, msg):
    assert main(["model", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]


def test_mcf_model_missing_results(tmp_path, capsys):
    assert main(["model", "--results-dir", str(tmp_path), "--nodes", "2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no node.json" in err[0]


# --- the clock (issue #35 §5) and the compute bound (issue #33) ------------------------------

def _sweep(fig, link, nodes=(2, 4), seq=4096):
    from mcf.mars.setting import paper_setting
    from mcf.sysmodel.sweep import ModelSweep, run_sweep
    st = paper_setting()
    return run_sweep(ModelSweep(st.alpha, st.kv_budget_mib, seq_len=seq, nodes=nodes,
                                schemes=("mars", "ring"), link=link), fig)


def test_at_clock_keeps_cycles_and_the_links_bit_rates(fig):
    from mcf.sysmodel.calibration import at_clock
    slow = at_clock(fig, 250e6)
    assert slow.clock_hz == 250e6 and fig.clock_hz == ACLK_HZ
    assert "250 MHz" in slow.sources["clock_hz"]
    for name in ("kr260_macs_per_cycle", "router_hop_cycles", "framer_beats_per_cycle",
                 "meta_records_per_cycle", "packet_latency_cycles"):
        assert getattr(slow, name) == getattr(fig, name)
    cl = cluster_for("kr260-ring", 4, 64, node_config="kr260")
    fast_net, slow_net = Network(cl.topology, fig), Network(cl.topology, slow)
    link = next(iter(cl.topology.link_params))
    rate = cl.topology.link_params[link].rate_bps
    assert slow_net.line_bytes_per_cycle(link) == pytest.approx(rate / 8 / 250e6)
    assert slow_net.line_bytes_per_cycle(link) == pytest.approx(
        fast_net.line_bytes_per_cycle(link) * ACLK_HZ / 250e6)
    nic = fig.router_hop_cycles + fig.packet_latency_cycles
    lat = cl.topology.link_params[link].latency_s
    assert slow_net.link_latency(link) == pytest.approx(lat * 250e6 + nic)
    assert at_clock(fig, ACLK_HZ) is fig
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite number > 0"):
            at_clock(fig, bad)


def test_seconds_at_250_mhz(fig):
    """The rule: a node's cycles do not depend on the clock, so its compute seconds are
    300/250 x the 300 MHz ones; on links that are not a bottleneck (``ideal``: the NIC alone,
    whose costs are cycles) the TTFT is too; on the KR260 ring the links keep their seconds, so
    the TTFT lies between the 300 MHz one and 300/250 x it."""
    from mcf.sysmodel.calibration import at_clock
    k = ACLK_HZ / 250e6
    slow = at_clock(fig, 250e6)
    for link in ("ideal", "kr260-ring"):
        fast_rows, slow_rows = _sweep(fig, link), _sweep(slow, link)
        for f, s in zip(fast_rows, slow_rows):
            assert (s["scheme"], s["nodes"]) == (f["scheme"], f["nodes"])
            assert s["clock_hz"] == 250e6 and f["clock_hz"] == ACLK_HZ
            assert s["compute_s"] == pytest.approx(k * f["compute_s"], rel=1e-12)
            assert s["compute_bound_s"] == pytest.approx(k * f["compute_bound_s"], rel=1e-12)
            if link == "ideal":
                assert s["ttft_s"] == pytest.approx(k * f["ttft_s"], rel=1e-12)
            else:
                assert f["ttft_s"] < s["ttft_s"] <= k * f["ttft_s"] * (1 + 1e-12)
                assert s["exposed_comm_s"] <= k * f["exposed_comm_s"] + 1e-12


def test_compute_bound_hand_computed(fig, qwen):
    """Qwen2.5-1.5B (28 layers, 12 query heads of 128, hidden 1536, 2 KV heads, MLP 8960),
    S = 1024 on N = 2 kr260 nodes (4 arrays x 16 x 16 = 1024 MACs/cycle) at 300 MHz."""
    from mcf.sysmodel.rates import peak_macs_per_cycle
    from mcf.sysmodel.work import compute_bound_s, prefill_ops
    attn = 4 * 28 * 12 * 128 * (1024 * 1025 // 2)                   # 90,282,393,600
    params = 1536 * 1536 * 2 + 2 * 1536 * 256 + 3 * 1536 * 8960      # 46,792,704 per layer
    linear = 2 * 28 * params * 1024                                  # 2,683,280,818,176
    assert prefill_ops(qwen, 1024, "attention") == attn == 90_282_393_600
    assert prefill_ops(qwen, 1024) == attn + linear == 2_773_563_211_776
    assert peak_macs_per_cycle(fig, "kr260")[0] == 1024 == KR260.macs_per_cycle
    want = 2_773_563_211_776 / (2 * 2 * 1024 * 300e6)                # 2.25713152 s
    assert compute_bound_s(qwen, 1024, 2, 1024, 300e6) == pytest.approx(want, rel=1e-15)
    assert want == pytest.approx(2.25713152, rel=1e-12)
    row = next(r for r in _sweep(fig, "kr260-ring", nodes=(2,), seq=1024)
               if r["scheme"] == "mars")
    assert row["compute_bound_s"] == pytest.approx(want * ACLK_HZ / 300e6, rel=1e-12)
    assert row["macs_per_cycle_peak"] == 1024
    assert row["compute_bound_s"] < row["ttft_s"]


def test_the_peak_has_one_source(tmp_path):
    from mcf.sysmodel.rates import peak_macs_per_cycle
    d = _copy_results(tmp_path)
    node = json.loads((d / "node.json").read_text())
    node["macs_per_cycle_peak"] = KR260.macs_per_cycle
    (d / "node.json").write_text(json.dumps(node))
    peak, src = peak_macs_per_cycle(load_figures([d]), "kr260")
    assert peak == KR260.macs_per_cycle and "node.json" in src
    node["macs_per_cycle_peak"] = KR260.macs_per_cycle + 512
    (d / "node.json").write_text(json.dumps(node))
    with pytest.raises(CalibrationError, match="GEMM peak"):
        peak_macs_per_cycle(load_figures([d]), "kr260")


def test_mcf_model_clock_mhz(capsys):
    argv = ["model", "--nodes", "2", "--prompt-tokens", "2048", "--schemes", "mars", "--quiet",
            "--json"]
    assert main(argv) == 0
    fast = json.loads(capsys.readouterr().out)
    assert main([*argv, "--clock-mhz", "250"]) == 0
    slow = json.loads(capsys.readouterr().out)
    assert fast["clock_hz"] == ACLK_HZ and slow["clock_hz"] == 250e6
    assert "250 MHz" in slow["calibration"]["clock_hz"]
    f, s = fast["rows"][0], slow["rows"][0]
    assert s["compute_s"] == pytest.approx(f["compute_s"] * ACLK_HZ / 250e6, rel=1e-12)
    assert s["compute_bound_s"] == pytest.approx(f["compute_bound_s"] * ACLK_HZ / 250e6)
    assert main(["model", "--nodes", "2", "--prompt-tokens", "2048", "--schemes", "mars",
                 "--quiet", "--clock-mhz", "250"]) == 0
    text = capsys.readouterr().out
    assert "every cycle at 250 MHz" in text and "bound s" in text


@pytest.mark.parametrize("argv, msg", [
    (["--clock-mhz", "0"], "--clock-mhz must be a finite number > 0"),
    (["--clock-mhz", "nan"], "--clock-mhz must be a finite number > 0"),
    (["--validate-only", "--clock-mhz", "250"], "does not apply with --validate-only"),
])
def test_mcf_model_bad_clock(capsys, argv, msg):
    assert main(["model", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]


def test_readme_headline_is_the_committed_model_run(capsys):
    """The README's headline block is rendered from docs/results/model*.json, and those are
    what `mcf model` gives today from the committed bench results (N = 2, MARS rows checked:
    a changed bench result means running the commands of HEADLINE_COMMANDS again)."""
    from mcf.commands.tables import render_readme
    from mcf.sysmodel.calibration import REPO
    from mcf.sysmodel.report import BLOCKS, HEADLINE_COMMANDS
    files, _ = BLOCKS["headline"]
    assert len(files) == len(HEADLINE_COMMANDS)
    for path, cmd in zip(files, HEADLINE_COMMANDS):
        assert cmd.endswith(path)
        doc = json.loads((REPO / path).read_text())
        row = next(r for r in doc["rows"] if r["scheme"] == "mars" and r["nodes"] == 2)
        argv = cmd.split()[1:-2] + ["--nodes", "2", "--schemes", "mars", "--quiet", "--json"]
        assert main(argv) == 0
        now = json.loads(capsys.readouterr().out)["rows"][0]
        for key in ("ttft_s", "compute_bound_s", "cost_model_ttft_s", "clock_hz"):
            assert now[key] == pytest.approx(row[key], rel=1e-9), (
                f"{path} is stale ({key}): run `{cmd}` (every command of "
                "mcf.sysmodel.report.HEADLINE_COMMANDS), then `mcf tables`")
    readme = (REPO / "README.md").read_text()
    assert "<!-- model:headline -->" in readme and "<!-- model:evaluation -->" in readme
    import os
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        new, missing = render_readme(readme, REPO / "docs" / "results")
    finally:
        os.chdir(cwd)
    assert not missing and new == readme


def _requant_stream_cycles(tokens: int, n: int, lanes: int) -> int:
    """amaranth.sim of the vector unit: cycles from the first ``a`` beat to the last result
    beat of ``tokens`` REQUANT tokens of ``n`` elements whose beats arrive back to back (one
    VEC entry), the result always taken."""
    def bench(dut, got):
        async def tb(ctx):
            ctx.set(dut.o.ready, 1)
            ctx.set(dut.op, VectorOp.REQUANT)
            ctx.set(dut.n_beats, n // lanes)
            total, ai, done, cyc, start = tokens * n // lanes, 0, 0, 0, None
            while done < tokens:
                ctx.set(dut.a.valid, ai < total)
                ctx.set(dut.a.payload, (ai * 7919 + 1) & 0xFFFF)
                _, _, ar, av, ov, p = await ctx.tick().sample(dut.a.ready, dut.a.valid,
                                                              dut.o.valid, dut.o.payload)
                if ar and av:
                    start = cyc if start is None else start
                    ai += 1
                cyc += 1
                done += int(ov and p.last)
            got.append(cyc - start)

        return tb
    return _vector_sim(lanes, n, bench)[0]


def test_requant_entries_take_one_pass_per_element():
    """The prefill rate of :func:`vector_passes` (``overlap``): over an entry of tokens back to
    back a :data:`RIDING_OPS` op takes one beat per cycle per element pass — ``tokens + 1``
    passes over ``n`` more elements (the entry's first token pays both), not ``2 · tokens``."""
    lanes, n0, n1, k = SIM.vec_lanes, 64, 128, 3
    grow = _requant_stream_cycles(k, n1, lanes) - _requant_stream_cycles(k, n0, lanes)
    assert VectorOp.REQUANT in RIDING_OPS
    assert grow == (k + 1) * (n1 - n0) / lanes / VECTOR_BEATS_PER_CYCLE
