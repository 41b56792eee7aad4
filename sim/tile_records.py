"""PREFILL_TILE records for the tiled prefill's measurements (issue #33): the memory they read
(KV blocks, query rows, lists) with what :func:`mcf.golden.attend_unit.attend_model` writes for
them, for the amaranth.sim executor (:func:`mcf.sim.perf.attention.tiled_records`) and the
Verilator runs of a node configuration's whole :class:`~mcf.hdl.node.compute.NodeCompute`
(:func:`rtl_build`, :func:`rtl_run`; the bench :mod:`mcf.sim.benches.tile_prefill_perf`).

A record is ``(block sizes, tokens)``: a chunk of ``tokens`` query tokens (``attn_heads`` query
heads each, one KV head) ending at the last key of its blocks — causal, the last block the
diagonal one. The MACs of a record are counted from the causal mask alone
(:func:`causal_macs`): ``2 · head_dim`` (QKᵀ and P·V) per visible (query row, key) pair.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from mcf.abi.node_config import NodeConfig

__all__ = ["TileRecords", "place_records", "causal_macs", "schedule_macs", "block_positions",
           "verilator_config", "rtl_build", "rtl_run", "compare_writes", "RTL_BENCH"]

RTL_BENCH = "mcf.sim.benches.tile_prefill_perf"
"""The cocotb bench of :func:`rtl_run`."""


@dataclass
class TileRecords:
    """PREFILL_TILE records in one memory image: ``mem`` (from address 0), the list region at
    ``list_base``, each record's ``args`` (``CMD.arg``) and ``records`` (block sizes, tokens);
    ``golden``: every byte the golden model writes (address → value), ``blocks``: the block
    requests it makes (``att_blocks``)."""
    mem: bytearray
    list_base: int
    args: list[int]
    records: list[tuple[list[int], int]]
    golden: dict[int, int] = field(default_factory=dict)
    blocks: int = 0


def place_records(cfg: NodeConfig, records, seed: int = 0, mem_bytes: int = 1 << 20,
                  max_chunk: int | None = None) -> TileRecords:
    """``records`` (``(block sizes, tokens)`` each) at ``cfg``'s attention shape in a memory of
    at least ``mem_bytes`` (more when they need it): random PER_TOKEN K/V blocks
    (:func:`mcf.golden.attention.random_blocks`, positions from 0), query rows (σ 1.5) at
    :func:`~mcf.abi.attend.prefill_query_address`, the rows' output region and the list; the
    golden model's writes with ``max_chunk`` (default
    ``cfg.tile_max_chunk``). Raises ``ValueError`` when the golden model refuses a record."""
    from mcf.abi.attend import (
        ATT_ENTRY_BYTES,
        AttendArg,
        AttendBlock,
        AttendHeader,
        AttendMode,
        AttendSoftmax,
        attend_list_bytes,
        prefill_out_bytes,
        prefill_query_address,
    )
    from mcf.abi.kv import pack_kv_block
    from mcf.abi.query import pack_query
    from mcf.golden.attend_unit import attend_model
    from mcf.golden.attention import random_blocks, random_query

    d, g = cfg.attn_head_dim, cfg.attn_heads
    rng = np.random.default_rng(seed)
    mem = bytearray(mem_bytes)
    top = [0x1000]

    def alloc(n):
        a = -(-top[0] // 64) * 64
        top[0] = a + n
        if top[0] > len(mem):                   # grown as needed (and a page beyond)
            mem.extend(bytes(top[0] + 4096 - len(mem)))
        return a

    lists, args = [], []
    for lens, n in records:
        ents = []
        for blk in random_blocks(rng, lens, d):
            raw = pack_kv_block(blk.k, blk.sk, blk.v, blk.sv)
            a = alloc(len(raw))
            mem[a:a + len(raw)] = raw
            ents.append(AttendBlock(a, len(blk), int(blk.pos[0])))
        q, sq = random_query(rng, n * g, d, sigma=1.5)
        q_addr = alloc(prefill_query_address(0, n, g, d))
        for i in range(n):
            raw = pack_query(q[i * g:(i + 1) * g], sq[i * g:(i + 1) * g], sum(lens) - n + i, 0)
            a = prefill_query_address(q_addr, i, g, d)
            mem[a:a + len(raw)] = raw
        stride = prefill_out_bytes(g, d)
        lists.append((attend_list_bytes(AttendHeader(q_addr, alloc(n * stride), n, stride),
                                        ents), len(ents)))
    list_base = alloc(sum(len(raw) for raw, _ in lists))
    at = 0
    for raw, nb in lists:
        mem[list_base + at:list_base + at + len(raw)] = raw
        args.append(AttendArg(at // ATT_ENTRY_BYTES, nb, AttendMode.PREFILL_TILE.value, g,
                              AttendSoftmax.SINGLE).pack())
        at += len(raw)
    out = TileRecords(mem, list_base, args, [(list(lens), n) for lens, n in records])
    chunk = cfg.tile_max_chunk if max_chunk is None else max_chunk
    for a in args:
        res = attend_model(a, list_base, lambda x, k: bytes(mem[x:x + k]), d, g, cfg.attn_block,
                           cfg.attn_max_list, max_chunk=chunk, kv_format=cfg.kv_format)
        if res.bad:
            raise ValueError(f"the golden model refuses a record ({res.bad})")
        out.blocks += res.blocks
        for addr, raw in res.writes:
            out.golden.update({addr + i: v for i, v in enumerate(raw)})
    return out


def causal_macs(lens, tokens: int, heads: int, head_dim: int) -> int:
    """QKᵀ + P·V multiply-accumulates of a record by the causal mask alone: the chunk's token
    ``i`` sits at position ``keys − tokens + i`` and sees the keys at positions ≤ its own, each
    seen key costing ``head_dim`` MACs for its score and ``head_dim`` for its P·V, per head."""
    keys = sum(lens)
    q_pos = np.arange(keys - tokens, keys)[:, None]
    k_pos = np.arange(keys)[None, :]
    return int((k_pos <= q_pos).sum()) * heads * 2 * head_dim


def schedule_macs(lens, tokens: int, heads: int, head_dim: int, q_tile: int) -> int:
    """The same count from the golden tiled schedule
    (:func:`mcf.golden.attention_tiled.tile_schedule`: the (query tile, block) pairs the
    hardware runs and each pair's visibility mask), ``2 · head_dim`` per visible pair."""
    from mcf.golden.attention_tiled import tile_schedule

    keys = sum(lens)
    q_pos = np.repeat(np.arange(keys - tokens, keys), heads)
    return sum(int(v.sum()) for *_, v in tile_schedule(q_pos, block_positions(lens),
                                                         q_tile)) * 2 * head_dim


def block_positions(lens) -> list:
    """Blocks of ``lens`` keys from position 0, as far as
    :func:`~mcf.golden.attention_tiled.tile_schedule` reads them (their ``pos``)."""
    starts = np.cumsum([0, *lens[:-1]])
    return [_Keys(np.arange(s, s + n)) for s, n in zip(starts, lens)]


@dataclass
class _Keys:
    """A block's key positions (all :func:`~mcf.golden.attention_tiled.tile_schedule` reads)."""
    pos: np.ndarray

    def __len__(self) -> int:
        return len(self.pos)


def verilator_config(cfg: NodeConfig) -> NodeConfig:
    """``cfg`` as Verilator builds it: the GEMM's ``DSP48E2`` primitives as the slice model
    (``gemm_dsp="model"``: the same cycles and bits), as :func:`mcf.sim.cluster.simulated_config`
    does for the named configurations."""
    return replace(cfg, gemm_dsp="model") if cfg.gemm_dsp == "primitive" else cfg


def rtl_build(cfg: NodeConfig):
    """The Verilator build (cached by the toolchain) of ``cfg``'s
    :class:`~mcf.hdl.node.compute.NodeCompute` with flat port names (``clk``, ``rst``): the
    node's whole compute half, so the tiled path's S and P·V run on the GEMM's real arrays
    through its share (``tile_on_gemm``), and the KV reader and the ATTEND DMA pair are the ones
    the node steers between its executors."""
    from mcf.hdl.convert import verilog_text
    from mcf.hdl.flat import FlatTop
    from mcf.hdl.node.compute import NodeCompute
    from mcf.sim.toolchain import build

    if not cfg.tiled:
        raise ValueError(f"{cfg.name}: no tiled prefill path (tile_keys 0)")
    vcfg = verilator_config(cfg)
    name, describe = f"tile_prefill_{cfg.name}", f"FlatTop(NodeCompute({vcfg!r}))"
    # the design is made only when its Verilog is not cached yet (else never elaborated, and
    # amaranth would warn about every unit of it); build() then finds the text in the cache
    verilog_text(name, lambda: FlatTop(NodeCompute(vcfg)), describe)
    return build(None, name, describe=describe)


def rtl_run(cfg: NodeConfig, recs: TileRecords, limit: int = 4_000_000) -> dict:
    """``recs`` on the Verilator build of ``cfg``'s NodeCompute (:func:`rtl_build`, the bench
    :data:`RTL_BENCH`), one record at a time. Returns ``{"records": [{"cycles", "busy",
    "timed_out"}, ...], "att_status", "kvr_status", "mismatch"}``: ``mismatch`` is ``None``
    when the bytes written are exactly the golden rows (no byte elsewhere, none missing, every
    value equal), else what differs. Raises ``AssertionError`` when the simulation fails."""
    from mcf.sim.toolchain import run

    built = rtl_build(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "image.bin").write_bytes(bytes(recs.mem))
        params = {"image": str(t / "image.bin"), "list_base": recs.list_base,
                  "args": recs.args, "limit": limit, "out": str(t / "out.json"),
                  "dump": str(t / "dump.npz")}
        run(built, RTL_BENCH, testcase="perf", params=params, test_dir=t / "run")
        out = json.loads((t / "out.json").read_text())
        dump = np.load(t / "dump.npz")
        out["mismatch"] = compare_writes(recs.golden, dump["mem"], dump["mask"])
    return out


def compare_writes(golden: dict[int, int], mem: np.ndarray, mask: np.ndarray) -> str | None:
    """What differs between the golden bytes and the bytes written (``None``: nothing)."""
    want = np.fromiter(golden, dtype=np.int64, count=len(golden))
    written = np.flatnonzero(mask)
    if len(written) != len(want) or not np.array_equal(np.sort(want), written):
        extra = np.setdiff1d(written, want)
        missing = np.setdiff1d(want, written)
        return (f"{len(extra)} byte(s) written outside the golden rows (first at "
                f"{hex(int(extra[0])) if len(extra) else '-'}), {len(missing)} golden byte(s) "
                f"not written (first at {hex(int(missing[0])) if len(missing) else '-'})")
    vals = np.fromiter(golden.values(), dtype=np.uint8, count=len(golden))
    bad = np.flatnonzero(mem[want] != vals)
    if len(bad):
        return f"{len(bad)} byte(s) differ from the golden rows (first at {hex(int(want[bad[0]]))})"
    return None
