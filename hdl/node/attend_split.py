"""The node's ATTEND records split between its two executors (issue #33; docs/node.md §3,
docs/attention.md "The executor: TileUnit"): PREFILL_TILE records to
:class:`~mcf.hdl.node.tile_unit.TileUnit`, every other mode to
:class:`~mcf.hdl.node.attend.AttendUnit`, one record at a time, so that the two share the KV
reader and the ``att_rd``/``att_wr`` ports by a select (:func:`steer`). Formats:
:mod:`mcf.abi.attend`; golden model: :func:`mcf.golden.attend_unit.attend_model` with
``max_chunk`` > 0 (both executors' counters are its one set).
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.attend import ATTEND_ARG, ATTEND_STATUS, AttendMode
from mcf.abi.node import CMD

__all__ = ["AttendSplit", "steer"]


class AttendSplit(wiring.Component):
    """ATTEND records → AttendUnit or TileUnit by ``arg.mode``, one record in work at a time.

    Members
    -------
    rec : In(stream.Signature(CMD))
        The COMPUTE sequencer's ATTEND records. Taken while no record is in work (or in the
        cycle of its ``done``) and the chosen executor is ready (both take records only when
        idle, and are idle in their ``done`` cycle): no cycle is added between records.
    attend, tile : Out(stream.Signature(CMD))
        To AttendUnit's ``rec`` (DECODE, PREFILL and the undefined mode 3, which it counts as
        a bad record) and TileUnit's ``rec`` (PREFILL_TILE); the record passes through
        combinationally (no latency).
    attend_done, tile_done : In(1) — the executors' ``done`` strobes.
    done : Out(1) — ``attend_done | tile_done``: one strobe per record, in order.
    attend_status, tile_status : In(ATTEND_STATUS)
    status : Out(ATTEND_STATUS) — the two summed field by field: the golden model counts
        every ATTEND record of the node in one set (``att_*``).
    tiled : Out(1) — the record in work (or, between records, the last one) is a PREFILL_TILE
        record: selects TileUnit's side of the shared KV reader and AXI ports. Changes only
        in the cycle a record is taken, when the previous record's executor has finished
        (``done``: its reads consumed, its writes answered).
    """

    def __init__(self):
        rec = stream.Signature(CMD)
        super().__init__({
            "rec": In(rec), "attend": Out(rec), "tile": Out(rec),
            "attend_done": In(1), "tile_done": In(1), "done": Out(1),
            "attend_status": In(ATTEND_STATUS), "tile_status": In(ATTEND_STATUS),
            "status": Out(ATTEND_STATUS), "tiled": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        busy, is_tile, free = Signal(), Signal(), Signal()
        arg = data.View(ATTEND_ARG, self.rec.payload.arg)
        m.d.comb += is_tile.eq(arg.mode == AttendMode.PREFILL_TILE)
        for s, mine in ((self.attend, ~is_tile), (self.tile, is_tile)):
            m.d.comb += [s.payload.eq(self.rec.payload), s.valid.eq(self.rec.valid & free & mine)]
        m.d.comb += [self.done.eq(self.attend_done | self.tile_done), free.eq(~busy | self.done)]
        m.d.comb += self.rec.ready.eq(free & Mux(is_tile, self.tile.ready, self.attend.ready))
        with m.If(self.rec.valid & self.rec.ready):
            m.d.sync += [busy.eq(1), self.tiled.eq(is_tile)]
        with m.Elif(self.done):
            m.d.sync += busy.eq(0)
        for name, _ in ATTEND_STATUS:
            m.d.comb += self.status[name].eq(self.attend_status[name] + self.tile_status[name])
        return m


def _at(obj, path):
    for p in path:
        obj = getattr(obj, p) if isinstance(p, str) else obj[p]
    return Value.cast(obj)


def steer(m: Module, sel, a, b, port) -> None:
    """Two interfaces ``a``, ``b`` of one signature onto ``port`` (seen from the same side as
    them) by ``sel``: ``port``'s members of ``a``'s ``Out`` flow are ``b``'s while ``sel``,
    else ``a``'s; the ``In`` members go to the selected one and are 0 at the other (its
    valids and readies low). Combinational. Used for two masters on one AXI port, two
    sources on one stream sink (``port`` the flipped sink) and one source on two sinks
    (``a``, ``b`` the sinks, ``port`` the flipped source). Safe to switch only while the
    unselected side has nothing in flight."""
    for path, member in a.signature.members.flatten():
        if member.is_signature:
            continue
        pa, pb, pp = _at(a, path), _at(b, path), _at(port, path)
        if member.flow == Out:
            m.d.comb += pp.eq(Mux(sel, pb, pa))
        else:
            m.d.comb += [pa.eq(Mux(sel, 0, pp)), pb.eq(Mux(sel, pp, 0))]
