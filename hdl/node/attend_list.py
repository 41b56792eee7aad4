"""What the node's two ATTEND executors (:class:`~mcf.hdl.node.attend.AttendUnit`,
:class:`~mcf.hdl.node.tile_unit.TileUnit`; docs/node.md §3, §7) do alike, as FSM code they both
call from ``elaborate``: the record's arg check and the block list read (``LIST_REQ``,
``LIST_RX``). Formats: :mod:`mcf.abi.attend`.
"""

from __future__ import annotations

from collections.abc import Callable

from amaranth import Module
from amaranth.lib import data

from mcf.abi.attend import ATT_ALIGN, ATT_ENTRY_BYTES, ATTEND_BLOCK

from ..mem.dma import align_down, off_align
from .fsm import dma_read

__all__ = ["arg_check", "list_states"]


def arg_check(m: Module, rin: data.View, mode_bad, sm_ok, max_heads: int, max_list: int, *,
              status, done) -> None:
    """In the cycle a record is taken, its ATTEND arg ``rin`` checked: a bad record
    (``mode_bad``: the executor does not run its mode; ``heads`` outside 1..``max_heads``;
    ``blocks`` outside 1..``max_list``; not ``sm_ok``: a softmax its mode does not allow) is
    counted in ``status.bad_record`` and retired (``done`` strobed); a good one goes on to
    ``LIST_REQ``."""
    with m.If(mode_bad | (rin.heads == 0) | (rin.heads > max_heads) | (rin.blocks == 0)
              | (rin.blocks > max_list) | ~sm_ok):
        m.d.sync += status.bad_record.eq(status.bad_record + 1)
        m.d.comb += done.eq(1)
    with m.Else():
        m.next = "LIST_REQ"


def list_states(m: Module, desc, rx, *, list_base, arg, hdr, idx, bad, max_block: int,
                entry: Callable[[data.View], None], nxt: str) -> None:
    """FSM states ``LIST_REQ`` and ``LIST_RX``: the record ``arg``'s list (its header and
    ``arg.blocks`` entries, ``ATT_ENTRY_BYTES`` each from ``list_base + arg.list ·
    ATT_ENTRY_BYTES``) read through a DmaReader's ``desc`` and ``rx`` (its ``o``), one entry
    per beat. The header goes to ``hdr``;
    each block entry (a ``ATTEND_BLOCK`` view of the beat) to ``entry``, called in the
    beat's cycle with ``idx`` = its index + 1. ``bad`` is set on a read error, an entry's
    ``tokens`` outside 1..``max_block`` or its ``addr`` off ``ATT_ALIGN`` (``list_base``'s low
    bits are taken as 0). ``idx`` counts the beats and is 0 again, the state
    ``nxt``, after the last. One cycle for the descriptor (more while the reader is busy), then
    one per beat as the reader delivers them."""
    beat = rx.payload
    with m.State("LIST_REQ"):
        dma_read(m, desc, align_down(list_base, ATT_ALIGN) + arg.list * ATT_ENTRY_BYTES,
                 (arg.blocks + 1) * ATT_ENTRY_BYTES, "LIST_RX")
    with m.State("LIST_RX"):
        m.d.comb += rx.ready.eq(1)
        bent = data.View(ATTEND_BLOCK, beat.data)
        with m.If(rx.valid):
            m.d.sync += idx.eq(idx + 1)
            with m.If(beat.err):
                m.d.sync += bad.eq(1)
            with m.If(idx == 0):
                m.d.sync += hdr.eq(beat.data)
            with m.Else():
                entry(bent)
                with m.If((bent.tokens == 0) | (bent.tokens > max_block)
                          | off_align(bent.addr, ATT_ALIGN)):
                    m.d.sync += bad.eq(1)
            with m.If(beat.last):
                m.d.sync += idx.eq(0)
                m.next = nxt
