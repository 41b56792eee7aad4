"""cocotb bench of the KV reader in front of the attention engine (docs/node.md §4–5; the flat top
``node_kv_reader``: ``KvReader`` → ``AttentionEngine``, built by ``tests/test_node_kv_reader.py``),
bit-exact against the golden model ``mcf.golden.attention``.

KV: per ``kv_id`` and KV head a slice of random INT4 records (:func:`mcf.abi.kv.pack_kv_block`),
cut into MARS's fragments (``MetaEncoder.fragments`` / ``fragment_tokens`` of the ``tiny``
model: d = 16, 2 KV heads) and written into an ``AxiRam`` at their landing addresses
(:func:`mcf.abi.landing.kv_address`, ``LAND_OFF`` from :func:`per_token_land_off`) — what the
landing engine leaves in DDR. A job's blocks are requested at
:func:`mcf.abi.kv_reader.block_address` (+ a token offset for partial blocks). Pauses on the
RAM's AR and R channels (``pause``) and on the output sink.

Tests: ``prefill_causal`` (chunk c's queries over the blocks of chunks 0..c, causal, ``o/l``),
``decode_states`` (states over several ``kv_id``s, partial and empty blocks), ``rate`` (the same
jobs through the reader and fed directly on ``k``/``v`` at one beat per cycle: cycles of the run
and engine ``busy`` cycles; JSON to ``out``). Params: ``seed``, ``pause``,
``tests``, ``out``, and the geometry ``head_dim``, ``lanes``, ``max_heads``, ``max_block``.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import (
    AxiRam,
    AxiStreamBus,
    AxiStreamFrame,
    AxiStreamSink,
    AxiStreamSource,
)

from mcf.abi.kv import AttnMode, attn_status_layout, pack_kv_block
from mcf.abi.kv_reader import KV_READER_STATUS, KvBlockReq, block_address
from mcf.abi.landing import LandingConfig, kv_address, per_token_land_off
from mcf.golden.attention import KVBlock, attend_max, random_blocks, random_query
from mcf.sim.attention_jobs import (
    Job,
    expected_ends,
    expected_words,
    job_word,
    k_words,
    q_words,
    v_words,
)
from mcf.sim.ddr import READ, ddr_ram
from mcf.sim.tb import pattern
from mcf.sim.toolchain import bench_params, skip_unless_selected

P = bench_params()
D, L, G, T = P["head_dim"], P["lanes"], P["max_heads"], P["max_block"]
MEM = 1 << 20
KV_BASE = 0x2_0040
SLICE = 32           # tokens per kv_id and KV head (one MARS slice of the tiny plan)


@dataclass
class Landed:
    """The KV region: configuration, slot layout and each ``(kv_id, head)``'s codes."""
    cfg: LandingConfig
    layout: object
    codes: dict          # (kv_id, head) → KVBlock of the whole slice (positions from pos0)

    def block(self, kv_id: int, head: int, t0: int, n: int) -> tuple[KvBlockReq, KVBlock]:
        blk = self.codes[(kv_id, head)].slice(t0, t0 + n)
        addr = block_address(self.cfg, kv_id, head, self.layout, t0, D)
        return KvBlockReq(addr, n, int(blk.pos[0]) if n else 0), blk


def land(ram: AxiRam, rng: np.random.Generator, kv_ids: int) -> Landed:
    """Random KV for ``kv_ids`` slices written fragment by fragment at the landing rule's
    addresses; ``kv_id`` k holds positions ``k·SLICE ..`` (chunk k of a prefill)."""
    from mcf.mars.metadata import MetaEncoder
    from mcf.mars.model import get_model

    model = get_model("tiny")
    assert model.head_dim == D
    enc = MetaEncoder(model, nodes=2, num_chunks=4, max_payload=2048)
    layout = per_token_land_off(enc, SLICE)
    cfg = LandingConfig(KV_BASE, layout.kv_slot, kv_ids)
    codes = {}
    for kv_id in range(kv_ids):
        for h in range(model.kv_heads):
            (codes[(kv_id, h)],) = random_blocks(rng, [SLICE], D, pos0=kv_id * SLICE)
    rec = enc.token_record_bytes
    for kv_id in range(kv_ids):
        for seq, length in enumerate(enc.fragments(SLICE)):
            head, t0 = enc.fragment_tokens(seq)
            b = codes[(kv_id, head)]
            payload = pack_kv_block(b.k, b.sk, b.v, b.sv)[t0 * rec:t0 * rec + length]
            ram.write(kv_address(cfg, kv_id, seq, layout.land_off), payload)
    return Landed(cfg, layout, codes)


class TB:
    def __init__(self, dut, seed: int, pause: float = 0.0):
        self.dut = dut
        cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
        rng = random.Random(seed)
        self.ram = ddr_ram(dut, "m_axi", dut.clk, dut.rst, size=MEM, fill=0x5A, pause=pause,
                           rng=rng, channels=READ)
        self.src = {}
        for name in ("blocks", "job", "q", "k", "v"):
            s = AxiStreamSource(AxiStreamBus.from_prefix(dut, f"s_axis_{name}"), dut.clk,
                                dut.rst, byte_lanes=1)
            s.log.setLevel(logging.WARNING)
            self.src[name] = s
        self.sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis"), dut.clk, dut.rst)
        self.sink.log.setLevel(logging.WARNING)
        if pause:
            self.sink.set_pause_generator(pattern(pause / 2, rng))
        dut.direct.value = 0

    async def reset(self):
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        await RisingEdge(self.dut.clk)

    def status(self) -> dict:
        lay = attn_status_layout()
        view = lay.from_bits(self.dut.status.value.to_unsigned())
        return {n: int(view[n]) for n, _ in lay}

    def reader_status(self) -> dict:
        raw = self.dut.kvr_status.value.to_unsigned()
        return {n: (raw >> f.offset) & ((1 << f.width) - 1) for n, f in KV_READER_STATUS}

    def submit(self, job: Job, reqs: list[KvBlockReq], direct: bool):
        self.src["job"].send_nowait(AxiStreamFrame([job_word(job, G)]))
        self.src["q"].send_nowait(AxiStreamFrame(q_words(job, L)))
        k_only = job.mode == AttnMode.MAX       # phase 1 needs only the K rows
        for n, (req, blk) in enumerate(zip(reqs, job.blocks)):
            if direct:
                self.src["k"].send_nowait(AxiStreamFrame(k_words(blk, L)))
                if not k_only:
                    self.src["v"].send_nowait(AxiStreamFrame(v_words(blk, L)))
            else:
                last = n == len(reqs) - 1
                self.src["blocks"].send_nowait(AxiStreamFrame([
                    KvBlockReq(req.addr, req.tokens, req.pos0, last, k_only).pack()]))

    async def run(self, jobs, direct: bool = False) -> dict:
        """Submit every job at once and check each output word against the golden model;
        returns the cycle counts of the run (first input beat to last output beat)."""
        self.dut.direct.value = int(direct)
        stats = {"cycles": 0, "busy": 0}
        done = [False]

        async def count():
            while not self.dut.s_axis_job_tvalid.value:
                await RisingEdge(self.dut.clk)
            while not done[0]:
                await RisingEdge(self.dut.clk)
                stats["cycles"] += 1
                stats["busy"] += int(self.dut.status.value.to_unsigned() >> (
                    attn_status_layout()["busy"].offset) & 1)
        counter = cocotb.start_soon(count())
        for job, reqs in jobs:
            self.submit(job, reqs, direct)
        for n, (job, _) in enumerate(jobs):
            words = []
            for end in expected_ends(job):
                frame = await self.sink.recv()
                data = bytes(frame.tdata)
                words += [int.from_bytes(data[i:i + 4], "little")
                          for i in range(0, len(data), 4)]
                assert len(words) == end, f"job {n}: payload ends after {len(words)} words"
            exp = expected_words(job)
            bad = [i for i, (a, b) in enumerate(zip(words, exp)) if a != b]
            assert len(words) == len(exp) and not bad, \
                f"job {n} ({job.mode.name}): first mismatch at word {bad[:1]}"
        done[0] = True
        await counter
        return stats


def prefill_jobs(landed: Landed, rng, chunks: int) -> list:
    """Chunk ``c``'s query tokens (first, last, one inside) of every query head group attend to
    KV head ``g``'s blocks of chunks ``0..c``, causal, normalised output."""
    jobs = []
    for c in range(chunks):
        for g in (0, 1):
            reqs_blocks = [landed.block(k, g, 0, SLICE) for k in range(c + 1)]
            reqs = [r for r, _ in reqs_blocks]
            blocks = [b for _, b in reqs_blocks]
            for q_pos in sorted({c * SLICE, c * SLICE + SLICE - 1,
                                 c * SLICE + int(rng.integers(SLICE))}):
                q, sq = random_query(rng, G, D, sigma=1.5)
                jobs.append((Job(AttnMode.SINGLE, q, sq, blocks, normalize=True, causal=True,
                                 q_pos=q_pos), reqs))
    return jobs


def decode_jobs(landed: Landed, rng, kv_ids: int) -> list:
    """Decode partial states: one query token over a shard of blocks — whole slices, partial
    ones (token ranges inside a slice) and empty shards; 1 or 2 query heads."""
    jobs = []
    for n_blocks in (3, 1, 0, 5, 2):
        reqs, blocks = [], []
        for _ in range(n_blocks):
            kv_id, g = int(rng.integers(kv_ids)), int(rng.integers(2))
            t0 = int(rng.integers(SLICE)) if rng.random() < 0.5 else 0
            n = int(rng.integers(1, SLICE - t0 + 1)) if t0 or rng.random() < 0.3 else SLICE
            r, b = landed.block(kv_id, g, t0, n)
            reqs.append(r)
            blocks.append(b)
        heads = int(rng.integers(1, G + 1))
        q, sq = random_query(rng, heads, D, sigma=1.5)
        jobs.append((Job(AttnMode.SINGLE, q, sq, blocks), reqs))
        if n_blocks == 3:       # the two-phase split on the same shard: K-only reads, then FIXED
            jobs.append((Job(AttnMode.MAX, q, sq, blocks), reqs))
            jobs.append((Job(AttnMode.FIXED, q, sq, blocks, m_fix=attend_max(q, sq, blocks)),
                         reqs))
    return jobs


@cocotb.test()
async def prefill_causal(dut):
    """Causal prefill over 3 chunks of 32 tokens, blocks read from the landed KV region."""
    skip_unless_selected("prefill_causal", P)
    seed = P.get("seed", 1)
    tb = TB(dut, seed, P.get("pause", 0.0))
    await tb.reset()
    rng = np.random.default_rng(seed)
    landed = land(tb.ram, rng, kv_ids=4)
    jobs = prefill_jobs(landed, rng, chunks=3)
    await tb.run(jobs)
    await ClockCycles(dut.clk, 20)
    st, rs = tb.status(), tb.reader_status()
    n_blocks = sum(len(j.blocks) for j, _ in jobs)
    assert st["jobs"] == len(jobs) and st["blocks"] == n_blocks and st["err_rows"] == 0
    assert rs == {"blocks": n_blocks, "tokens": n_blocks * SLICE, "jobs": len(jobs),
                  "rejects": 0, "bus_errors": 0}


@cocotb.test()
async def decode_states(dut):
    """Decode states over random shards (partial blocks, empty shards), the two-phase split
    (MAX over K-only reads, FIXED), then rejected requests (0 and max_block + 1 tokens) are
    counted and the next jobs still run."""
    skip_unless_selected("decode_states", P)
    seed = P.get("seed", 1) + 1
    tb = TB(dut, seed, P.get("pause", 0.0))
    await tb.reset()
    rng = np.random.default_rng(seed)
    landed = land(tb.ram, rng, kv_ids=4)
    jobs = decode_jobs(landed, rng, 4)
    await tb.run(jobs)
    assert any(j.mode == AttnMode.MAX for j, _ in jobs)
    n_blocks = sum(len(j.blocks) for j, _ in jobs)
    assert tb.reader_status()["blocks"] == n_blocks
    tb.src["blocks"].send_nowait(AxiStreamFrame([KvBlockReq(KV_BASE, 0).pack()]))
    tb.src["blocks"].send_nowait(AxiStreamFrame([KvBlockReq(KV_BASE, T + 1).pack()]))
    await tb.run(decode_jobs(landed, rng, 4)[:2])
    await ClockCycles(dut.clk, 20)
    assert tb.status()["err_rows"] == 0 and tb.reader_status()["rejects"] == 2


@cocotb.test()
async def rate(dut):
    """The same jobs (decode over whole 32-token blocks, 1 and 2 query heads per job) fed by
    the reader and directly: cycles of the run and engine busy cycles."""
    skip_unless_selected("rate", P)
    seed = P.get("seed", 1) + 2
    tb = TB(dut, seed)
    await tb.reset()
    rng = np.random.default_rng(seed)
    landed = land(tb.ram, rng, kv_ids=4)
    results = []
    for heads in (G, 1):
        jobs = []
        for _ in range(6):
            rb = [landed.block(int(rng.integers(4)), int(rng.integers(2)), 0, SLICE)
                  for _ in range(4)]
            q, sq = random_query(rng, heads, D, sigma=1.5)
            jobs.append((Job(AttnMode.SINGLE, q, sq, [b for _, b in rb]), [r for r, _ in rb]))
        for feed in ("direct", "reader"):
            stats = await tb.run(jobs, direct=feed == "direct")
            await ClockCycles(dut.clk, 10)
            keys = sum(len(b) for j, _ in jobs for b in j.blocks)
            results.append({"feed": feed, "heads": heads, "jobs": len(jobs), "keys": keys,
                            **stats, "busy_fraction": round(stats["busy"] / stats["cycles"], 4),
                            "cycles_per_key_head": round(stats["cycles"] / keys / heads, 3)})
            dut._log.info("kv reader rate: %s", results[-1])
    if P.get("out"):
        with open(P["out"], "w") as fh:
            json.dump(results, fh)
