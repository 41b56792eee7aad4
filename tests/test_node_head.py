"""The LM head as a JOB on the node (mcf.node.head; issue #34 item 2, docs/cluster.md "Who runs
what"): the vocabulary slices under the STRIPE pitch bound, the head templates as the walker's
golden model (:func:`mcf.abi.jobs.walk`) issues them — RMSNORM of the right row with the final
norm, REQUANT, one GEMM job per slice whose stripe image is the slice's weights and whose rows
land at the slice's logits — the sliced head equal to ``IntModel.head`` bit for bit, and the
records: the decode root's program ends with the head, the head phase's JOB only at the node
that computed the prompt's last row. The RTL run is tests/test_cluster_run.py."""

from __future__ import annotations

import numpy as np
import pytest

from mcf.abi.compute import DmaDesc, GemmJob, StripeJob
from mcf.abi.jobs import JOB_ARG, STRIPE_JOB, VEC_CFG, walk
from mcf.abi.node import RecordClass
from mcf.abi.node_config import AXI_WIDTH, NODE_CONFIGS, SIM
from mcf.abi.quant import GAMMA, VectorOp, requantize
from mcf.cluster import RunSpec
from mcf.cluster.setup import RunSetup
from mcf.golden import vector as V
from mcf.golden.gemm import gemm
from mcf.golden.model import IntModel
from mcf.model.config import QWEN25_1P5B_MODEL
from mcf.node.decode import decode_program
from mcf.node.head import (
    MAX_PITCH,
    HeadImage,
    head_slices,
    head_weight_bytes,
    slice_weight,
)
from mcf.quant import QuantWeight, gemm_stripe_image


@pytest.fixture(scope="module")
def setup():
    return RunSetup.prepare(RunSpec(decode_tokens=2))


def _image(s: RunSetup, max_pitch: int = MAX_PITCH) -> HeadImage:
    base = s.image(0x1000)
    return HeadImage(base.cfg, base.layers, base.config, base.layout, tokens=base.tokens,
                     decode_blocks=base.decode_blocks, max_blocks=base.max_blocks,
                     softmax=base.softmax, lm_head=s.quantized.lm_head,
                     norm=s.quantized.norm, max_pitch=max_pitch)


def _memory(img) -> bytearray:
    mem = bytearray(img.alloc.at)
    for a, raw in img.image.items():
        mem[a:a + len(raw)] = raw
    return mem


def test_slices_keep_every_stripe_within_the_pitch():
    k, group = 1536, 128
    vocab = QWEN25_1P5B_MODEL.vocab_size
    kr = NODE_CONFIGS["kr260"]
    sl = head_slices(vocab, k, group, kr)
    assert sl[0][0] == 0 and sl[-1][1] == vocab
    assert all(a[1] == b[0] for a, b in zip(sl, sl[1:], strict=False))
    assert all((r1 - r0) % kr.gemm_rows == 0 for r0, r1 in sl)
    total = head_weight_bytes(vocab, k, group, kr)
    assert total >= vocab * k // 2                 # codes, plus the scales
    tiles = vocab // kr.gemm_rows
    tile_stripe = total // tiles // kr.hp_ports          # one 16-row tile's bytes per stripe
    assert tile_stripe * tiles * kr.hp_ports == total
    per = MAX_PITCH // tile_stripe                       # whole tiles per slice
    assert len(sl) == -(-tiles // per) and sl[0][1] == per * kr.gemm_rows
    assert len(sl) > 1                                   # the Qwen2.5-1.5B head is several jobs
    with pytest.raises(ValueError, match="multiple of 16"):
        head_slices(100, k, group, kr)
    with pytest.raises(ValueError, match="longer than"):
        head_slices(vocab, 4096, group, kr, max_pitch=4096)   # 16 x 4096 / 2 / 4 > 4 KiB
    with pytest.raises(ValueError, match="a multiple of 4096"):
        head_slices(vocab, k, group, kr, max_pitch=1024)


@pytest.mark.parametrize("max_pitch", [MAX_PITCH, 4096])
def test_head_templates_issue_the_sliced_head(setup, max_pitch):
    """Each head template walks without a bad entry; its first VEC is RMSNORM of its row with
    the final norm; every slice is one GEMM job whose STRIPE job points at the slice's stripe
    image and whose result descriptors tile the slice's logits exactly once."""
    img = _image(setup, max_pitch)
    h, vocab = img.cfg.hidden, img.vocab
    assert (len(img.slices) == 1) == (max_pitch == MAX_PITCH)
    if max_pitch == 4096:       # a 16 x 128 tile is 288 B per stripe: 14 tiles a slice, then 2
        assert img.slices == [(0, 224), (224, 256)]
    ends = sorted((a, a + len(raw)) for a, raw in img.image.items())
    assert all(e <= a for (_, e), (a, _) in zip(ends, ends[1:], strict=False))   # no overlap
    assert ends[-1][1] <= img.alloc.at                 # the template table inside the image
    mem = _memory(img)

    def read(a, n):
        return bytes(mem[a:a + n])

    assert bytes(mem[img.head_gamma:img.head_gamma + 4 * h]) == \
        (np.asarray(setup.quantized.norm) & 0xFFFF).astype("<u4").tobytes()
    rows = [img.dbufs[-1].buf["y"]] + [img.bufs[-1].buf["y"] + r * h * 4
                                       for r in range(img.tokens)]
    assert img.head_template(None) == img.head_template0 == img.table_len - len(rows)
    for t, x in zip([None, *range(img.tokens)], rows, strict=True):
        acts, counts = walk(read, img.table, img.table_len,
                            JOB_ARG.const({"template": img.head_template(t)}).as_bits(),
                            SIM.gemm_limits)
        assert counts["bad_entries"] == counts["bad_gemm"] == counts["bad_index"] == 0
        vecs = [VEC_CFG.from_bits(v) for _, tgt, v in acts if tgt == "vec"]
        assert [v.op for v in vecs] == [VectorOp.RMSNORM, VectorOp.REQUANT]
        rd0 = [DmaDesc.unpack(v) for _, tgt, v in acts if tgt == "rd_desc0"]
        rd1 = [DmaDesc.unpack(v) for _, tgt, v in acts if tgt == "rd_desc1"]
        assert (rd0[0].addr, rd0[0].length) == (x, h * 4)
        assert (rd1[0].addr, rd1[0].length) == (img.head_gamma, h * 4)
        jobs = [GemmJob.unpack(v) for _, tgt, v in acts if tgt == "gemm_job"]
        stripes = [StripeJob.unpack(v, STRIPE_JOB) for _, tgt, v in acts if tgt == "w_job"]
        assert len(jobs) == len(stripes) == len(img.slices)
        covered = bytearray(vocab * 4)
        gi = [i for i, (_, tgt, _) in enumerate(acts) if tgt == "gemm_job"] + [len(acts)]
        for j, ((r0, r1), job, sj) in enumerate(zip(img.slices, jobs, stripes, strict=True)):
            assert (job.m_count, job.k_steps * SIM.gemm_lanes, job.n_tiles * SIM.gemm_rows) == \
                (1, h, r1 - r0)
            raw, want = gemm_stripe_image(slice_weight(setup.quantized.lm_head, r0, r1),
                                          SIM.gemm_rows, SIM.gemm_lanes, ports=SIM.hp_ports,
                                          beat_bytes=AXI_WIDTH // 8)
            assert sj.pitch <= max_pitch and (sj.length, sj.pitch) == (want.length, want.pitch)
            assert read(sj.addr, len(raw)) == raw
            for _, tgt, v in acts[gi[j]:gi[j + 1]]:
                if tgt == "wr_desc":
                    d = DmaDesc.unpack(v)
                    off = d.addr - img.logits
                    assert r0 * 4 <= off and off + d.length <= r1 * 4 and d.count == 1
                    assert not any(covered[off:off + d.length])
                    covered[off:off + d.length] = b"\1" * d.length
        assert all(covered)


def test_sliced_head_is_the_golden_head_bit_for_bit(setup):
    """RMSNORM, REQUANT and the GEMM over each slice, concatenated, are ``IntModel.head``."""
    qm = setup.quantized
    rng = np.random.default_rng(3)
    x = rng.integers(-(1 << 14), 1 << 14, (3, qm.cfg.hidden_size))
    want = IntModel(qm).head(x)
    n = V.rmsnorm(x, qm.norm, qm.cfg.rms_norm_eps)
    xq, xm, xe = requantize(n)
    for sl in ([(0, qm.cfg.vocab_size)], head_slices(qm.cfg.vocab_size, qm.cfg.hidden_size,
                                                     qm.lm_head.group, SIM, 4096)):
        got = np.concatenate([gemm(xq, xm, xe, w.q, w.m, w.e, None, w.group)
                              for w in (slice_weight(qm.lm_head, r0, r1) for r0, r1 in sl)],
                             axis=1)
        assert np.array_equal(got, want)
    assert qm.cfg.layer.eps == qm.cfg.rms_norm_eps and qm.norm.dtype.kind == "i"
    assert GAMMA.quantize(GAMMA.to_float(qm.norm)).tolist() == qm.norm.tolist()


def test_records_run_the_head_where_the_row_is(setup):
    img = setup.image(0x1000)
    owner, row = setup.last_row_owner()
    for v in range(setup.nodes):
        net, compute = setup.head_program(v, img)
        assert [c.cls for c in net] == [RecordClass.MARK]
        assert [c.cls for c in compute] == \
            ([RecordClass.JOB] if v == owner else []) + [RecordClass.MARK]
        if v == owner:
            assert JOB_ARG.from_bits(compute[0].arg).template == img.head_template(row)
    for k in range(2):
        for v in range(setup.nodes):
            prog = decode_program(setup.plan, k, v, img)
            jobs = [JOB_ARG.from_bits(c.arg).template for c in prog.compute
                    if c.cls is RecordClass.JOB]
            assert prog.compute[-1].cls is RecordClass.MARK
            if v == prog.root:
                assert jobs[-1] == img.head_template() and prog.compute[-2].cls is \
                    RecordClass.JOB
            else:
                assert img.head_template() not in jobs


def test_a_head_image_needs_its_weights(setup):
    base = setup.image(0x1000)
    with pytest.raises(ValueError, match="head weights"):
        HeadImage(base.cfg, base.layers, base.config, base.layout, tokens=base.tokens)
    bad = QuantWeight(setup.quantized.lm_head.q[:, :64], setup.quantized.lm_head.m[:, :0], 0,
                      128)
    with pytest.raises(ValueError, match="K = 64"):
        HeadImage(base.cfg, base.layers, base.config, base.layout, tokens=base.tokens,
                  lm_head=bad, norm=setup.quantized.norm)
