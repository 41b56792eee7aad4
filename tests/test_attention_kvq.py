"""Prefill KV emitter (amaranth.sim): ACT K/V rows → INT4 block payload, bit-exact against
mcf.abi.kv.quantize_kv_rows + pack_kv_block (PER_TOKEN) and quantize_kv_channel +
pack_kv_channel_block (PER_CHANNEL_K), with backpressure, zero rows/channels and saturating
scales."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from mcf.abi.fixed import round_shift
from mcf.abi.kv import (
    KV_SCALE,
    KVQ_SCALE_SHIFT,
    kv_token_bytes,
    kvq_scale_mult,
    pack_kv_block,
    quantize_kv_rows,
    to_act,
)
from mcf.abi.kv_channel import (
    KV_GROUP,
    KVFormat,
    kv_channel_block_bytes,
    kvq_status_layout,
    pack_kv_channel_block,
    prescale_k,
    quantize_k_open,
    quantize_kv_channel,
)
from mcf.abi.meta import Collective, Meta, Op
from mcf.hdl.compute.attention_kvq import KVQ_LANES, KVQuantizer, kvq_in_layout
from mcf.sim.amsim import send

D, DW = 32, 64


def _beats(k, v, lay, header=None):
    out = []
    if header is not None:                               # open group: header beats first
        for c in range(0, D, KVQ_LANES):
            word = sum(int(x) << (32 * i) for i, x in enumerate(header[c:c + KVQ_LANES]))
            out.append(lay.const({"data": word, "last": 0, "hdr": 1}).as_bits())
    n = k.shape[0]
    for t in range(n):
        for r, rowv in enumerate((k[t], v[t])):
            for c in range(0, D, KVQ_LANES):
                word = 0
                for i, x in enumerate(rowv[c:c + KVQ_LANES]):
                    word |= (int(x) & 0xFFFFFFFF) << (32 * i)
                last = t == n - 1 and r == 1 and c + KVQ_LANES >= D
                out.append(lay.const({"data": word, "last": int(last)}).as_bits())
    return out


def run_kvq(blocks, metas, backpressure=0.0, seed=0, dut=None):
    dut = KVQuantizer(head_dim=D, data_width=DW) if dut is None else dut
    lay = kvq_in_layout(dut.kv_format)
    rng = np.random.default_rng(seed)
    words = [w for blk in blocks for w in _beats(blk[0], blk[1], lay, *blk[2:])]
    frames, cur = [], bytearray()
    counters = {}
    metas_out = []

    async def meta_src(ctx):
        await send(ctx, dut.i_meta, [meta.pack() for meta in metas])

    async def meta_sink(ctx):
        while len(metas_out) < len(metas):
            ctx.set(dut.o_meta.ready, int(rng.random() > backpressure))
            raw, valid, ready = (await ctx.tick().sample(
                dut.o_meta.payload.as_value(), dut.o_meta.valid, dut.o_meta.ready))[2:]
            if valid and ready:
                metas_out.append(Meta.unpack(raw))

    async def src(ctx):
        await send(ctx, dut.i, words)

    async def sink(ctx):
        nonlocal cur
        while len(frames) < len(blocks):
            ready = not (backpressure and rng.random() < backpressure)
            ctx.set(dut.o.ready, int(ready))
            data, keep, last, valid = (await ctx.tick().sample(
                dut.o.payload.data, dut.o.payload.keep, dut.o.payload.last, dut.o.valid))[2:]
            if valid and ready:
                nbytes = bin(keep).count("1")
                assert keep == (1 << nbytes) - 1
                cur += int(data).to_bytes(DW // 8, "little")[:nbytes]
                if last:
                    frames.append(bytes(cur))
                    cur = bytearray()
        for _ in range(8):
            await ctx.tick()
        counters.update(tokens=ctx.get(dut.tokens), blocks=ctx.get(dut.blocks),
                        scale_sat=ctx.get(dut.scale_sat), len_err=ctx.get(dut.len_err))
        if dut.kv_format == KVFormat.PER_CHANNEL_K:
            counters["groups"] = ctx.get(dut.groups)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(src, background=True)
    sim.add_testbench(meta_src, background=True)
    sim.add_testbench(meta_sink, background=True)
    sim.add_testbench(sink)
    sim.run()
    return frames, counters, metas_out


def test_kvq_bit_exact():
    rng = np.random.default_rng(1)
    blocks = []
    for n in (3, 1, 5):
        k = to_act(rng.normal(0, 2, (n, D)) * rng.uniform(0.001, 10, (n, 1)))
        v = to_act(rng.normal(0, 1, (n, D)))
        blocks.append((k, v))
    blocks[1][0][0] = 0                                   # an all-zero K row
    blocks[2][1][2] = to_act(rng.normal(0, 300, D))       # V beyond the scale range
    metas = [Meta(op=Op.KV_REPLICA, collective=Collective.MULTICAST, src=1, route_id=3,
                  kv_id=100 + i, length=k.shape[0] * kv_token_bytes(D), seq=0)
             for i, (k, _) in enumerate(blocks)]
    metas[2] = metas[2].replace(length=metas[2].length + 4)     # MARS got the length wrong
    frames, counters, metas_out = run_kvq(blocks, metas, backpressure=0.4, seed=2)
    assert metas_out == metas
    assert len(frames) == len(blocks)
    for (k, v), got in zip(blocks, frames):
        k4, sk = quantize_kv_rows(k)
        v4, sv = quantize_kv_rows(v)
        exp = pack_kv_block(k4, sk, v4, sv)
        assert len(got) == k.shape[0] * kv_token_bytes(D)
        assert got == exp
    assert counters == {"tokens": 9, "blocks": 3, "scale_sat": 1, "len_err": 1}


def _saturating(absmax):
    """Rows/channels whose scale code saturates (the hardware counts them)."""
    s = round_shift(np.asarray(absmax, dtype=np.int64) * kvq_scale_mult(), KVQ_SCALE_SHIFT)
    return int((s > KV_SCALE.max_int).sum())


@pytest.mark.parametrize("group,sizes,bp", [(8, (3, 8, 19, 1), 0.4), (KV_GROUP, (40,), 0.2)])
def test_kvq_per_channel_bit_exact(group, sizes, bp):
    """PER_CHANNEL_K: group headers + records bit-exact with the golden quantiser, partial last
    groups, outlier channels (one saturating), an all-zero channel, counters."""
    rng = np.random.default_rng(3 + group)
    blocks = []
    for n in sizes:
        kf = rng.normal(0, 1, (n, D)) + rng.normal(0, 1, D)
        kf[:, [3, 17]] *= 8                               # outlier channels
        k = to_act(kf)
        k[:, 5] = 0                                       # an all-zero channel
        v = to_act(rng.normal(0, 1, (n, D)) * rng.uniform(0.01, 3, (n, 1)))
        blocks.append((k, v))
    blocks[0][0][:, 9] = to_act(rng.normal(0, 400, sizes[0]))   # K channel beyond the range
    blocks[-1][1][0] = to_act(rng.normal(0, 300, D))            # V row beyond the range
    metas = [Meta(op=Op.KV_REPLICA, collective=Collective.MULTICAST, src=1, route_id=3,
                  kv_id=200 + i, length=kv_channel_block_bytes(k.shape[0], D, group), seq=0)
             for i, (k, _) in enumerate(blocks)]
    dut = KVQuantizer(head_dim=D, data_width=DW, kv_format=KVFormat.PER_CHANNEL_K, group=group)
    frames, counters, metas_out = run_kvq(blocks, metas, backpressure=bp, seed=4, dut=dut)
    assert metas_out == metas
    assert len(frames) == len(blocks)
    sat = groups = 0
    for (k, v), got in zip(blocks, frames):
        k4, ks, v4, sv = quantize_kv_channel(k, v, group)
        assert got == pack_kv_channel_block(k4, ks, v4, sv, group)
        assert not k4[:, 5].any() and np.all(ks[:, 5] == 1)
        groups += ks.shape[0]
        sat += _saturating(np.abs(v).max(axis=1))
        for lo in range(0, k.shape[0], group):
            sat += _saturating(np.abs(k[lo:lo + group]).max(axis=0))
    assert sat >= 2
    assert counters == {"tokens": sum(sizes), "blocks": len(sizes), "groups": groups,
                        "scale_sat": sat, "len_err": 0}
    assert set(counters) == set(kvq_status_layout().members)


def test_kvq_open_group_bit_exact():
    """PER_CHANNEL_K open groups (decode residual): header beats, then tokens; K prescaled by the
    header and quantised per token (quantize_k_open), records with their own sk; mixed with
    closed blocks; an open block longer than a group repeats the header."""
    group = 8
    rng = np.random.default_rng(11)
    blocks, expect = [], []
    for n, is_open in ((5, True), (8, False), (11, True), (1, True)):
        kf = rng.normal(0, 1, (n, D)) + rng.normal(0, 1, D)
        kf[:, [2, 29]] *= 8
        k, v = to_act(kf), to_act(rng.normal(0, 1, (n, D)))
        if is_open:
            hdr = rng.integers(300, 30000, D)
            hdr[[2, 29]] *= 2
            if n == 1:
                hdr[:4] = (1, 4096, 65535, 3)            # extreme codes (the K scale saturates)
            blocks.append((k, v, hdr))
            k4, sk = quantize_k_open(k, hdr)
            v4, sv = quantize_kv_rows(v)
            ks = np.repeat(hdr[None], -(-n // group), axis=0)
            expect.append(pack_kv_channel_block(k4, ks, v4, sv, group, sk=sk))
        else:
            blocks.append((k, v))
            expect.append(pack_kv_channel_block(*quantize_kv_channel(k, v, group), group))
    blocks[0][0][0, 7] = 1 << 30                          # a K row whose scale saturates
    k4, sk = quantize_k_open(blocks[0][0], blocks[0][2])
    expect[0] = pack_kv_channel_block(k4, blocks[0][2][None], *quantize_kv_rows(blocks[0][1]),
                                      group, sk=sk)
    metas = [Meta(op=Op.KV_REPLICA, collective=Collective.MULTICAST, src=2, route_id=1,
                  kv_id=300 + i, length=len(e), seq=0) for i, e in enumerate(expect)]
    dut = KVQuantizer(head_dim=D, data_width=DW, kv_format=KVFormat.PER_CHANNEL_K, group=group)
    frames, counters, metas_out = run_kvq(blocks, metas, backpressure=0.3, seed=5, dut=dut)
    assert metas_out == metas
    assert frames == expect
    sat = 0
    for blk in blocks:
        k, v = blk[0], blk[1]
        sat += _saturating(np.abs(v).max(axis=1))
        if len(blk) == 3:
            sat += _saturating(np.abs(prescale_k(k, blk[2])).max(axis=1))
        else:
            sat += _saturating(np.abs(k).max(axis=0))
    assert sat >= 2
    assert counters == {"tokens": 25, "blocks": 4, "groups": 1 + 1 + 2 + 1, "scale_sat": sat,
                        "len_err": 0}
