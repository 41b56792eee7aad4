"""The layer program's host side (mcf.node.layer, docs/node.md §3 "The layer program as built"):
record order per layer, the EMIT tee against MARS's store phase, block barriers and ATTEND lists,
the model image's regions and templates, and the golden model's agreement with the float-attention
layer. The RTL run of the same program is tests/test_node_cluster.py (``layer``)."""

from __future__ import annotations

import numpy as np
import pytest

from mcf.abi.attend import ATT_ENTRY_BYTES, ATTEND_ARG, ATTEND_BLOCK, ATTEND_HEADER
from mcf.abi.emit import EmitArg
from mcf.abi.jobs import ENTRY_BYTES, JOB_ARG, TEMPLATE_REF
from mcf.abi.meta import Meta
from mcf.abi.node import Cmd, PayloadSource, Queue, RecordClass, cmd_malformed
from mcf.abi.node_config import SIM
from mcf.golden.node_prefill import golden_prefill
from mcf.golden.qwen_layer import TINY, layer_fixed, quantize_layer, random_layer
from mcf.mars import ClusterSpec, make_topology, plan
from mcf.mars.model import ModelSpec
from mcf.node.layer import ModelImage, read_set, slice_positions
from mcf.node.layout import NodeLayout
from mcf.node.program import configure, step_program
from mcf.quant import from_act

SPEC = ModelSpec("tiny", layers=2, q_heads=TINY.heads, kv_heads=TINY.kv_heads,
                 head_dim=TINY.head_dim, hidden=TINY.hidden, intermediate=TINY.intermediate)


@pytest.fixture(scope="module")
def setup():
    cl = ClusterSpec(2, 1 << 20, 1 << 20, make_topology("kr260-ring", 2))
    p = plan(SPEC, cl, 64, 32, "mars", alpha=0.5)
    layout = NodeLayout.for_plan(p, SIM, base=0x1000)
    qls = [quantize_layer(random_layer(TINY, s), TINY) for s in range(SPEC.layers)]
    return p, layout, qls, ModelImage(TINY, qls, SIM, layout, tokens=16)


def test_model_image_regions(setup):
    p, layout, _, model = setup
    spans = sorted((a, a + len(raw)) for a, raw in model.image.items())
    assert spans[0][0] >= layout.base + layout.size
    assert all(a1 <= b0 for (_, a1), (b0, _) in zip(spans, spans[1:]))
    assert max(b for _, b in spans) <= layout.base + model.size
    # the template table: one row per template, each row pointing at its entries
    raw = model.image[model.table]
    assert model.table_len == 2 * SPEC.layers
    end = model.table + len(raw)
    for i in range(model.table_len):
        row = TEMPLATE_REF.from_bits(int.from_bytes(raw[i * 16:(i + 1) * 16], "little"))
        assert model.table < int(row.addr) and int(row.addr) + int(row.count) * ENTRY_BYTES <= end
    writes = {w.reg: w.value for w in configure(p, layout, 0, model=model)}
    assert writes["JOBS_TABLE_LO"] == model.table & 0xFFFF_FFFF
    assert writes["ATT_LIST_BASE_LO"] == model.lists & 0xFFFF_FFFF


@pytest.mark.parametrize("index", [1, 2])
@pytest.mark.parametrize("node", [0, 1])
def test_layer_program_order_and_tee(setup, index, node):
    p, layout, _, model = setup
    enc = p.encoder
    prog = step_program(p, index, node, 0, model=model)
    for c in prog.compute:
        assert not cmd_malformed(int.from_bytes(c.pack(), "little"), Queue.COMPUTE)
    store = [r.meta for r in p.step_records(index) if r.node == node and r.phase == "store"]
    # the KV sends the node makes are MARS's store sends: teed (SEND src=EMIT) or from DDR
    sent = [Meta.unpack(c.meta) for c in prog.compute if c.cls is RecordClass.SEND]
    assert sorted(map(Meta.pack, sent)) == sorted(map(Meta.pack, store))
    blocks = read_set(p, index, node)
    m = model.tokens
    cmds = list(prog.compute)
    for layer in range(SPEC.layers):
        job = cmds.pop(0)
        assert job.cls is RecordClass.JOB and JOB_ARG.from_bits(job.arg).template == 2 * layer
        kv_id = enc.kv_id(layer, index, node)
        for seq in range(len(enc.fragments(m))):
            emit = cmds.pop(0)
            meta = Meta.unpack(emit.meta)
            assert emit.cls is RecordClass.EMIT and (meta.kv_id, meta.seq) == (kv_id, seq)
            head, t0 = enc.fragment_tokens(seq)
            assert EmitArg.unpack(emit.arg) == EmitArg(layer * m + t0, head,
                                                       meta.length // enc.token_record_bytes)
            if emit.replicate:
                tee = cmds.pop(0)
                assert tee.cls is RecordClass.SEND and tee.src is PayloadSource.EMIT
                assert tee.meta == emit.meta
            else:
                assert not any(s.kv_id == kv_id and s.seq == seq for s in store)
        while cmds[0].cls is RecordClass.SEND:            # the layer's other store records
            assert enc.kv_key(Meta.unpack(cmds.pop(0).meta).kv_id)[0] == layer
        for b, s in blocks:
            nop = cmds.pop(0)
            assert nop.cls is RecordClass.NOP
            assert Meta.unpack(nop.meta).kv_id == enc.kv_id(layer, b, s)
            assert nop.wait == len(enc.fragments(slice_positions(p, b, s)[1]))
        p0, _ = slice_positions(p, index, node)
        for t in range(m):
            for g in range(SPEC.kv_heads):
                att = cmds.pop(0)
                assert att.cls is RecordClass.ATTEND
                arg = ATTEND_ARG.from_bits(att.arg)
                base = model.lists + int(arg.list) * ATT_ENTRY_BYTES
                raw = prog.lists[base]
                hdr = ATTEND_HEADER.from_bits(int.from_bytes(raw[:16], "little"))
                assert int(hdr.q_addr) == model.query_address(model.bufs[layer], t, g)
                ents = [ATTEND_BLOCK.from_bits(int.from_bytes(raw[i:i + 16], "little"))
                        for i in range(16, len(raw), 16)]
                assert len(ents) == int(arg.blocks) >= 1
                assert all(int(e.pos0) <= p0 + t for e in ents)
                assert [int(e.pos0) for e in ents] == sorted(int(e.pos0) for e in ents)
        job = cmds.pop(0)
        assert JOB_ARG.from_bits(job.arg).template == 2 * layer + 1
    assert [c.cls for c in cmds][-1] is RecordClass.MARK


def test_golden_partition_and_error():
    """The golden model follows the block partition (the online softmax is not associative in
    fixed point), and stays close to the float-attention fixed layer."""
    qls = [quantize_layer(random_layer(TINY, 3), TINY)]
    x = np.random.default_rng(4).standard_normal((32, TINY.hidden)).astype(np.float32)
    a = golden_prefill(x, qls, TINY, [(0, 16), (16, 16)])
    b = golden_prefill(x, qls, TINY, [(0, 8), (8, 8), (16, 16)])
    assert (a[0].att != b[0].att).any()
    ref = from_act(layer_fixed(x, qls[0], TINY))
    err = np.linalg.norm(from_act(a[0].y) - ref) / np.linalg.norm(ref)
    assert err < 0.1, err          # measured 0.03-0.07 (INT4 KV, integer softmax)


def test_records_round_trip(setup):
    p, _, _, model = setup
    for c in step_program(p, 2, 1, 0, model=model).compute:
        assert Cmd.unpack(c.pack()) == c
