"""The node's PREFILL_TILE executor for ``amaranth.sim`` runs — a
:class:`~mcf.hdl.node.tile_unit.TileUnit` in front of a :class:`~mcf.hdl.node.kv_reader.KvReader`
and a :class:`~mcf.hdl.compute.tile_prefill.TilePrefill` (in
:class:`~mcf.hdl.node.compute.NodeCompute` the reader is shared with the DECODE/PREFILL
executor; here it serves the tile unit alone) — built in one place for the unit tests
(tests/test_tile_unit.py) and the tiled-prefill rate measurement
(:func:`mcf.sim.perf.attention.tiled_records`)."""

from __future__ import annotations

from dataclasses import dataclass

from amaranth import Module
from amaranth.lib import wiring

from mcf.abi.kv_channel import KVFormat
from mcf.hdl.compute.tile_prefill import TilePrefill
from mcf.hdl.node.kv_reader import KvReader
from mcf.hdl.node.tile_unit import TileUnit

__all__ = ["TileTop", "tile_top"]


@dataclass
class TileTop:
    """The module to simulate and its three units: ``unit`` (records in on ``rec``, its AXI
    ``rd_bus`` / ``wr_bus``, ``done``, ``status``), ``reader`` (its AXI ``bus``, ``status``) and
    ``prefill``."""
    m: Module
    unit: TileUnit
    reader: KvReader
    prefill: TilePrefill


def tile_top(*, head_dim: int, max_heads: int, max_block: int, max_list: int, max_chunk: int,
             rows: int, keys: int, lanes: int, in_lanes: int,
             kv_format: KVFormat = KVFormat.PER_TOKEN, **prefill_kw) -> TileTop:
    """TileUnit(``head_dim``, ``max_heads``, ``max_block``, ``max_list``, ``max_chunk``,
    ``rows``) → KvReader (``in_lanes`` channels a beat) → TilePrefill (``keys`` keys, ``lanes``
    lanes, ``kv_format``; ``prefill_kw`` its other parameters): the unit's chunk, query and
    descriptor streams and the reader's K and V beats into the prefill, its rows back to the
    unit."""
    m = Module()
    m.submodules.unit = u = TileUnit(head_dim, max_heads, max_block, max_list=max_list,
                                     max_chunk=max_chunk, rows=rows)
    m.submodules.kvr = kvr = KvReader(head_dim, in_lanes, max_block)
    m.submodules.tp = tp = TilePrefill(keys=keys, head_dim=head_dim, lanes=lanes,
                                       in_lanes=in_lanes, max_block=max_block, rows=rows,
                                       max_rows=u.max_rows, max_heads=max_heads,
                                       kv_format=kv_format, **prefill_kw)
    for name in ("chunk", "q", "desc"):
        wiring.connect(m, getattr(u, name), getattr(tp, name))
    wiring.connect(m, u.blocks, kvr.blocks)
    wiring.connect(m, kvr.k, tp.k)
    wiring.connect(m, kvr.v, tp.v)
    wiring.connect(m, tp.o, u.o)
    return TileTop(m, u, kvr, tp)
