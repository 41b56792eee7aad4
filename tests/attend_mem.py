"""A PREFILL_TILE record's inputs laid out in a flat byte memory, shared by the tests of its
golden model (tests/test_attend_tile_record.py) and of its RTL executors (tests/test_tile_unit.py,
tests/test_node_compute_tile.py): KV blocks with their list entries, a chunk's query slots, the
list (formats: :mod:`mcf.abi.attend`), and the AXI slaves an executor reads and writes them
through."""

from __future__ import annotations

from mcf.abi.attend import AttendBlock, AttendHeader, attend_list_bytes, prefill_query_address
from mcf.abi.kv import pack_kv_block
from mcf.abi.kv_channel import pack_kv_channel_block
from mcf.abi.query import pack_query
from mcf.golden.attention import KVChannelBlock
from mcf.sim.axi_slave import read_slave, write_slave


class Mem:
    """A flat byte memory from address 0 (zeros where nothing was written)."""

    def __init__(self, size: int):
        self.raw = bytearray(size)

    def write(self, addr: int, raw: bytes):
        self.raw[addr:addr + len(raw)] = raw

    def read(self, addr: int, n: int) -> bytes:
        assert addr >= 0 and addr + n <= len(self.raw), f"read outside the memory at {addr:#x}"
        return bytes(self.raw[addr:addr + n])

    def beat(self, addr: int, n: int = 16) -> bytes:
        """The ``n`` bytes at ``addr`` (zeros past the end): one AXI read beat."""
        return bytes(self.raw[addr:addr + n]).ljust(n, b"\0")


def memory_slaves(mem: Mem, rng, rd_bus, kv_bus, wr_bus, wmem: dict, aws: list, *,
                  bad_reads=(), bad_beats=()) -> list:
    """The three AXI slave testbenches an ATTEND executor runs against, answering from ``mem``:
    its record, list and slot reads on ``rd_bus`` (R pauses 0.2, SLVERR at ``bad_reads``), the
    KV reader's on ``kv_bus`` (first beat 4..20 cycles after AR, R pauses 0.2) and its row
    writes into ``wmem`` on ``wr_bus`` (W pauses 0.3, SLVERR for a burst with a beat in
    ``bad_beats``, the AWs in ``aws``); their random draws from ``rng``."""
    return [read_slave(rd_bus, rng, mem.beat, r_pause=0.2, is_error=lambda a: a in bad_reads),
            read_slave(kv_bus, rng, mem.beat, latency=(4, 20), r_pause=0.2),
            write_slave(wr_bus, rng, wmem, aws, bad_beats=bad_beats, wpause=0.3)]


def place_block(mem: Mem, addr: int, blk) -> tuple[AttendBlock, int]:
    """``blk`` (per-token K, or a :class:`~mcf.golden.attention.KVChannelBlock`) packed at
    ``addr``: its list entry and its size in bytes."""
    if isinstance(blk, KVChannelBlock):
        raw = pack_kv_channel_block(blk.k, blk.groups(), blk.v, blk.sv, sk=blk.sk)
    else:
        raw = pack_kv_block(blk.k, blk.sk, blk.v, blk.sv)
    mem.write(addr, raw)
    return AttendBlock(addr, len(blk), int(blk.pos[0])), len(raw)


def place_slot(mem: Mem, q_addr: int, i: int, g: int, q, sq, pos: int) -> int:
    """Query slot ``i`` of a chunk of ``g``-head slots at ``q_addr``: the codes ``q`` and scales
    ``sq`` of its heads (``g`` of them, or fewer for a bad slot) at ``pos``; returns the end of
    its bytes."""
    at = prefill_query_address(q_addr, i, g, q.shape[-1])
    raw = pack_query(q, sq, pos, 0)
    mem.write(at, raw)
    return at + len(raw)


def place_list(mem: Mem, at: int, header: AttendHeader, ents: list[AttendBlock]) -> None:
    """A block list (``header``, then ``ents``) at ``at``."""
    mem.write(at, attend_list_bytes(header, ents))

