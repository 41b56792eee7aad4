"""The layer program on a node with the tiled path (issue #33; docs/attention.md "In the node",
docs/model.md): one ATTEND PREFILL_TILE record per (chunk, KV head) instead of one PREFILL record
per token, and the goldens' P8 prefill attention that follows it (``golden_prefill(...,
tiled=True)``, ``ClusterGolden(..., tiled=True)``, ``IntModel(prefill_mode="tiled")``).

The records a tiny-model step's program issues, run by the executor's golden model
(:func:`mcf.golden.attend_unit.attend_model`) over the DDR the program addresses (its lists, the
query slots and landed KV blocks the node's other engines write, taken from the golden layer),
write the golden layer's attention rows byte for byte; numpy only."""

from __future__ import annotations

import numpy as np
import pytest

from mcf.abi.attend import (
    ATT_ENTRY_BYTES,
    ATTEND_ARG,
    AttendHeader,
    AttendMode,
    AttendSoftmax,
    prefill_out_bytes,
)
from mcf.abi.kv import KV_SCALE, dequantize, dequantize_q, kv_token_bytes
from mcf.abi.kv_reader import block_address
from mcf.abi.node import RecordClass
from mcf.abi.node_config import KR260, KR260_ENGINE, SIM, NodeConfig
from mcf.abi.quant import requantize, rope_pair_order
from mcf.abi.query import QUERY_HEADER_BYTES, pack_query
from mcf.abi.softmax import NORM_OUT
from mcf.cluster import RunSpec, make_plan, prompt_tokens
from mcf.driver.node_map import node_limits
from mcf.golden.attend_unit import attend_model
from mcf.golden.attention import dequantize_k, random_blocks, random_query
from mcf.golden.cluster import ClusterGolden, golden_run, plan_slices
from mcf.golden.model import IntModel, quantize_model
from mcf.golden.node_prefill import golden_prefill, prefill_attention
from mcf.golden.qwen_layer import TINY, layer_fixed, quantize_layer, random_layer
from mcf.mars import ClusterSpec, make_topology, plan
from mcf.mars.model import ModelSpec
from mcf.model import model_from_spec
from mcf.node.layer import ModelImage, prefill_tile_chunk, slice_positions
from mcf.node.layout import NodeLayout
from mcf.node.program import step_program
from mcf.quant import to_act

SPEC = ModelSpec("tiny", layers=2, q_heads=TINY.heads, kv_heads=TINY.kv_heads,
                 head_dim=TINY.head_dim, hidden=TINY.hidden, intermediate=TINY.intermediate)
PAGE = 1 << 12


class SparseMem:
    """Byte memory by pages (zeros where nothing was written)."""

    def __init__(self):
        self.pages: dict[int, bytearray] = {}

    def write(self, addr: int, raw: bytes):
        for i, b in enumerate(raw):
            a = addr + i
            self.pages.setdefault(a // PAGE, bytearray(PAGE))[a % PAGE] = b

    def read(self, addr: int, n: int) -> bytes:
        return bytes(self.pages.get((addr + i) // PAGE, bytes(PAGE))[(addr + i) % PAGE]
                     for i in range(n))


@pytest.fixture(scope="module")
def step():
    """A 2-node MARS plan of the tiny model (64 tokens, chunk 32: slices of 16), its layers, the
    prompt's embedding rows and both goldens (per-token PREFILL and PREFILL_TILE)."""
    cl = ClusterSpec(2, 1 << 20, 1 << 20, make_topology("kr260-ring", 2))
    p = plan(SPEC, cl, 64, 32, "mars", alpha=0.5)
    qls = [quantize_layer(random_layer(TINY, s), TINY) for s in range(SPEC.layers)]
    x = to_act(np.random.default_rng(7).standard_normal((64, TINY.hidden)))
    slices = [slice_positions(p, b, s) for b in (1, 2) for s in (0, 1)]
    gold = {tiled: golden_prefill(x, qls, TINY, slices, act_in=True, tiled=tiled)
            for tiled in (False, True)}
    return p, qls, x, gold


def _queries(gold, qls, x, layer: int):
    """Layer ``layer``'s query heads as the vector unit writes them: INT8 codes in RoPE pair
    order ``[S, heads, d]`` and scales ``[S, heads, 2]`` (the golden layer's input)."""
    got = {}

    def capture(q, k, v, pos):
        got["q"] = q
        return np.zeros_like(q)

    xin = x if layer == 0 else gold[layer - 1].y
    layer_fixed(xin, qls[layer], TINY, attn=capture, act_in=True)
    S, hd = len(xin), TINY.head_dim
    qc, qm, qe = requantize(got["q"].reshape(S, TINY.heads, hd))
    return qc[..., rope_pair_order(hd, hd)], np.stack([qm, qe], axis=-1)


def _run_program(p, qls, x, gold, index: int, node: int, tile_chunk: int):
    """Node ``node``'s step ``index``: its ATTEND records run by ``attend_model`` over the DDR
    its program addresses; returns the records' modes and headers, and the attention rows of
    every layer read back from the node's buffers (``[layer][slice token]``, bytes)."""
    layout = NodeLayout.for_plan(p, SIM, base=0x1000)
    p0, m = slice_positions(p, index, node)
    model = ModelImage(TINY, qls, SIM, layout, tokens=m, tile_chunk=tile_chunk)
    prog = step_program(p, index, node, 0, model=model)
    mem = SparseMem()
    for at, raw in prog.lists.items():
        mem.write(at, raw)
    for at, raw in model.step_writes(np.arange(p0, p0 + m)).items():
        mem.write(at, raw)
    rep, hd, rec = TINY.heads // TINY.kv_heads, TINY.head_dim, kv_token_bytes(TINY.head_dim)
    enc = p.encoder
    for layer, lb in enumerate(model.bufs):
        qc, sq = _queries(gold, qls, x, layer)
        for t in range(m):                          # the query slots (headers: step_writes')
            for g in range(TINY.kv_heads):
                hs = slice(g * rep, (g + 1) * rep)
                raw = pack_query(qc[p0 + t, hs], sq[p0 + t, hs], p0 + t, 0)
                at = model.query_address(lb, t, g)
                mem.write(at, mem.read(at, QUERY_HEADER_BYTES) + raw[QUERY_HEADER_BYTES:])
        for b in (1, 2):                            # the landed KV blocks
            for s in (0, 1):
                q0, qn = slice_positions(p, b, s)
                for g in range(TINY.kv_heads):
                    mem.write(block_address(layout.kv, enc.kv_id(layer, b, s), g,
                                            layout.kv_layout),
                              gold[layer].kv[g][q0 * rec:(q0 + qn) * rec])
    records = []
    for c in prog.compute:
        if c.cls is not RecordClass.ATTEND:
            continue
        a = ATTEND_ARG.from_bits(c.arg)
        hdr = AttendHeader.unpack(mem.read(model.lists + int(a.list) * ATT_ENTRY_BYTES, 16))
        records.append((int(a.mode), AttendSoftmax(a.softmax), hdr))
        res = attend_model(c.arg, model.lists, mem.read, hd, SIM.attn_heads, SIM.attn_block,
                           SIM.attn_max_list, max_chunk=SIM.tile_max_chunk)
        assert res.bad is None and res.writes
        for at, raw in res.writes:
            mem.write(at, raw)
    row = TINY.heads * prefill_out_bytes(1, hd)
    rows = [[mem.read(lb.buf["att"] + t * row, row) for t in range(m)] for lb in model.bufs]
    return records, rows, (p0, m)


def _golden_rows(gl, p0: int, m: int) -> list[bytes]:
    return [(gl.att[p0 + t] & 0xFFFF_FFFF).astype("<u4").tobytes() for t in range(m)]


@pytest.mark.parametrize("index, node, chunk", [(1, 0, 32), (2, 1, 32), (2, 0, 8)])
def test_tile_records_write_the_tiled_golden_rows(step, index, node, chunk):
    """PREFILL_TILE records (chunks of ``chunk`` ≤ ``tile_max_chunk`` tokens, one per chunk and
    KV head, SINGLE) write, over every layer, the tiled golden's attention rows byte for byte —
    rows that differ from the per-token PREFILL golden's."""
    p, qls, x, gold = step
    records, rows, (p0, m) = _run_program(p, qls, x, gold[True], index, node, chunk)
    per_layer = TINY.kv_heads * -(-m // chunk)
    assert len(records) == SPEC.layers * per_layer
    for mode, softmax, hdr in records:
        assert (mode, softmax) == (AttendMode.PREFILL_TILE.value, AttendSoftmax.SINGLE)
        assert 1 <= hdr.tokens <= chunk and hdr.out_stride == TINY.heads * TINY.head_dim * 4
    assert sum(h.tokens for _, _, h in records) == SPEC.layers * TINY.kv_heads * m
    for layer in range(SPEC.layers):
        assert rows[layer] == _golden_rows(gold[True][layer], p0, m)
        assert rows[layer] != _golden_rows(gold[False][layer], p0, m)


def test_per_token_records_keep_the_per_token_golden(step):
    """Without ``tile_chunk`` the program is today's: PREFILL records, the PREFILL golden's
    rows (``attend_model`` with ``max_chunk`` = 0 would also run them)."""
    p, qls, x, gold = step
    records, rows, (p0, m) = _run_program(p, qls, x, gold[False], 2, 1, 0)
    assert len(records) == SPEC.layers * TINY.kv_heads * m
    assert {r[0] for r in records} == {AttendMode.PREFILL.value}
    for layer in range(SPEC.layers):
        assert rows[layer] == _golden_rows(gold[False][layer], p0, m)


def test_who_issues_prefill_tile():
    """A single run on a tiled node (``sim``, ``kr260``) issues PREFILL_TILE in chunks of its
    ``tile_max_chunk``; a two_phase run (N-invariance) or a node without the tiled path
    (``KR260_ENGINE``) keeps PREFILL records; the driver reads the chunk limit from CAPS."""
    assert prefill_tile_chunk(SIM, "single") == SIM.tile_max_chunk == 32
    assert prefill_tile_chunk(SIM, "two_phase") == 0
    assert prefill_tile_chunk(KR260, "single") == KR260.tile_max_chunk == 256
    assert prefill_tile_chunk(KR260, "two_phase") == 0
    assert prefill_tile_chunk(KR260_ENGINE, "single") == 0
    assert node_limits(SIM.caps(), SIM).tile_max_chunk == 32
    assert node_limits(KR260.caps(), KR260).tile_max_chunk == 256
    assert node_limits(KR260_ENGINE.caps(), KR260_ENGINE).tile_max_chunk == 0
    small = NodeConfig(**{**SIM.__dict__, "name": "small", "tile_max_chunk": 16})
    assert node_limits(SIM.caps(), small).tile_max_chunk == 16
    qls = [quantize_layer(random_layer(TINY, 0), TINY)]
    cl = ClusterSpec(2, 1 << 20, 1 << 20, make_topology("kr260-ring", 2))
    lay = NodeLayout.for_plan(plan(SPEC, cl, 64, 32, "mars", alpha=0.5), SIM, base=0x1000)
    for kw in ({"tile_chunk": 8, "softmax": "two_phase"}, {"tile_chunk": 64}):
        with pytest.raises(ValueError, match="tile_chunk"):
            ModelImage(TINY, qls, SIM, lay, tokens=16, **kw)
    with pytest.raises(ValueError, match="two_phase"):
        golden_prefill(np.zeros((4, TINY.hidden)), qls, TINY, [(0, 4)], exact=True, tiled=True)


@pytest.fixture(scope="module")
def tiny():
    cfg, tensors = model_from_spec("tiny", seed=0)
    return cfg, quantize_model(cfg, tensors)


def test_cluster_golden_tiled_is_the_model_golden(tiny):
    """The run's golden with the tiled prefill equals ``IntModel(prefill_mode="tiled")`` (block
    length = the slice), differs from the per-token one, and a run on the ``sim`` nodes turns
    it on (a two_phase run does not)."""
    cfg, qm = tiny
    spec = RunSpec(nodes=2, prompt_tokens=64, chunk=32, decode_tokens=1)
    p, prompt = make_plan(spec, cfg), prompt_tokens(cfg, 64, 3)
    g = ClusterGolden(qm, p, tiled=True)
    run = g.prefill(prompt)
    g.decode_token(0)
    ref = IntModel(qm, block_tokens=16, prefill_mode="tiled", decode_mode="single")
    want = ref.generate(prompt, 2)
    assert np.array_equal(run.logits[0], want.prompt_logits[-1])
    assert run.tokens == want.tokens.tolist()
    plain = golden_run(qm, p, prompt, 0)
    assert any(not np.array_equal(a.att, b.att) for a, b in zip(run.prefill, plain.prefill))
    from mcf.cluster.setup import RunSetup
    assert RunSetup.prepare(spec).golden.tiled
    assert not RunSetup.prepare(RunSpec(nodes=2, prompt_tokens=64, chunk=32, decode_tokens=0,
                                        softmax="two_phase")).golden.tiled
    assert plan_slices(p) == [(0, 16), (16, 16), (32, 16), (48, 16)]


def test_p8_prefill_error_vs_float():
    """The tiled prefill attention (P8) against float64 on the same quantised inputs, at the
    tiny model's shape (head_dim 32, GQA 2:1, 64 causal tokens over MARS's 16-token slices):
    within test_attend_tile_record's bound, max |o/l − float| ≤ 8e-3 · max|v| and relative L2
    ≤ 3 %."""
    d, g, S = TINY.head_dim, TINY.heads // TINY.kv_heads, 64
    rng = np.random.default_rng(339)
    blocks = random_blocks(rng, [16] * 4, d)
    pos = np.arange(S)
    q, sq = random_query(rng, S * g, d)
    out = prefill_attention(q.reshape(S, g, d), sq.reshape(S, g, 2), blocks, pos, tiled=True)
    out = NORM_OUT.to_float(out.reshape(S * g, d))
    qf = dequantize_q(q, sq)
    kf = np.concatenate([dequantize_k(b) for b in blocks])
    vf = np.concatenate([dequantize(b.v, b.sv, KV_SCALE) for b in blocks])
    rp = np.repeat(pos, g)
    t = np.where(pos[None, :] <= rp[:, None], qf @ kf.T / np.sqrt(d) * np.log2(np.e), -np.inf)
    pr = np.exp2(t - t.max(axis=1, keepdims=True))
    ref = pr @ vf / pr.sum(axis=1, keepdims=True)
    err_max = np.abs(out - ref).max() / np.abs(vf).max()
    err_l2 = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert 0 < err_max <= 8e-3 and err_l2 <= 0.03, (err_max, err_l2)


@pytest.mark.slow
def test_two_sim_nodes_run_prefill_tile_end_to_end(tmp_path):
    """``mcf run`` on two ``sim`` node tops (the tiled path, a single run): the prefill's
    ATTENDs are PREFILL_TILE records, every step bit-exact against the tiled golden, the
    nodes' logits the tiled golden's and not the per-token golden's (so the tiled path ran)."""
    import json

    from mcf.cli import main
    from mcf.cluster import run_prompt

    out = tmp_path / "run.json"
    assert main(["run", "--quiet", "--nodes", "2", "--prompt-tokens", "64",
                 "--decode-tokens", "2", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert all(got["checks"].values()) and got["tokens"] == got["golden_tokens"]
    spec = RunSpec(nodes=2, prompt_tokens=64, decode_tokens=2)
    cfg, tensors = model_from_spec("tiny", seed=spec.seed)
    qm = quantize_model(cfg, tensors)
    plain = golden_run(qm, make_plan(spec, cfg), run_prompt(spec, cfg)[0], 2)
    assert not np.array_equal(np.asarray(got["logits"][0]), plain.logits[0])
