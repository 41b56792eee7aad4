"""A PREFILL_TILE record's inputs laid out in a flat byte memory, shared by the tests of its
golden model (tests/test_attend_tile_record.py) and of its RTL executor (tests/test_tile_unit.py):
KV blocks with their list entries, a chunk's query slots, the list (formats:
:mod:`mcf.abi.attend`)."""

from __future__ import annotations

from mcf.abi.attend import AttendBlock, AttendHeader, attend_list_bytes, prefill_query_address
from mcf.abi.kv import pack_kv_block, pack_kv_channel_block
from mcf.abi.query import pack_query
from mcf.golden.attention import KVChannelBlock


class Mem:
    """A flat byte memory from address 0 (zeros where nothing was written)."""

    def __init__(self, size: int):
        self.raw = bytearray(size)

    def write(self, addr: int, raw: bytes):
        self.raw[addr:addr + len(raw)] = raw

    def read(self, addr: int, n: int) -> bytes:
        assert addr >= 0 and addr + n <= len(self.raw), f"read outside the memory at {addr:#x}"
        return bytes(self.raw[addr:addr + n])


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

