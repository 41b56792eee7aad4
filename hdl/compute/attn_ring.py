"""The attention engine's hand-over from the QK side to the PV side (paper §5): a ring of two
job contexts (the PV side works on a job while the QK side takes the next) and a ring of
``score_slots`` score-slot records (the PV side consumes a block while the QK side scores the
next ones). The QK side writes the entry at the write pointer and publishes it; the PV side reads
the entry at the read pointer and releases it. The scores of a slot and its per-row record
(:func:`score_row_layout`) live in two memories of the engine, written by the QK side and read by
the PV side (:func:`score_mem_depth`, :func:`row_mem_depth`)."""

from __future__ import annotations

from amaranth import Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.kv import KV_SCALE, attn_job_layout
from mcf.abi.softmax import SCORE

from .attn_score import bits_for

__all__ = [
    "JOB_CTX_ENTRIES", "JobRing", "SlotRing", "job_ctx_hdr_layout", "job_ctx_layout",
    "job_read_signature", "job_write_signature", "row_mem_depth", "score_mem_depth",
    "score_row_layout", "score_slot_layout", "slot_read_signature", "slot_write_signature",
]

JOB_CTX_ENTRIES = 2
"""Job contexts in flight: one on the PV side, one being loaded by the QK side."""


def job_ctx_hdr_layout(max_heads: int) -> data.StructLayout:
    """A job context's descriptor part, written when the QK side takes the job: its fields of
    :func:`mcf.abi.kv.attn_job_layout` and ``drop`` (the job is rejected: consume, emit
    nothing)."""
    job = attn_job_layout(max_heads)
    return data.StructLayout({
        "mode": job["mode"].shape, "normalize": job["normalize"].shape,
        "heads": job["heads"].shape, "n_blocks": job["n_blocks"].shape, "drop": unsigned(1),
    })


def job_ctx_layout(max_heads: int) -> data.StructLayout:
    """A job context: the descriptor part and FIXED mode's per-head maximum ``mfix`` (from the
    query beats)."""
    return data.StructLayout({
        **dict(job_ctx_hdr_layout(max_heads).members),
        "mfix": data.ArrayLayout(signed(SCORE.width), max_heads),
    })


def score_slot_layout(max_heads: int, max_block: int) -> data.StructLayout:
    """A scored block: its K row count ``nk`` and per-head block maximum ``m``."""
    return data.StructLayout({"nk": unsigned(bits_for(max_block) + 2),
                              "m": data.ArrayLayout(signed(SCORE.width), max_heads)})


def score_row_layout() -> data.StructLayout:
    """A K row's record in a slot: its V scale ``sv`` and ``kvalid`` (not causally masked)."""
    return data.StructLayout({"sv": unsigned(KV_SCALE.width), "kvalid": unsigned(1)})


def score_mem_depth(max_heads: int, max_block: int, slots: int) -> int:
    """Words of the score memory: address ``(slot·max_heads + head, row)``, the row in the low
    ``bits_for(max_block)`` bits."""
    return (slots * max_heads) << bits_for(max_block)


def row_mem_depth(max_block: int, slots: int) -> int:
    """Words of the row-record memory: address ``(slot, row)``."""
    return slots << bits_for(max_block)


def job_write_signature(max_heads: int) -> wiring.Signature:
    """The QK side's (writer's) view of :class:`JobRing`: ``hdr_en`` writes ``hdr`` and
    ``mfix_en`` writes ``mfix`` of head ``mfix_h`` into the entry at the write pointer; ``pub``
    publishes it (the write pointer moves on); ``count`` = published, unreleased entries."""
    return wiring.Signature({
        "hdr_en": Out(1), "hdr": Out(job_ctx_hdr_layout(max_heads)),
        "mfix_en": Out(1), "mfix_h": Out(bits_for(max_heads)),
        "mfix": Out(signed(SCORE.width)),
        "pub": Out(1), "count": In(range(JOB_CTX_ENTRIES + 1)),
    })


def job_read_signature(max_heads: int) -> wiring.Signature:
    """The ring's side towards the PV side (reader): ``head`` = the entry at the read pointer
    (valid while ``count`` ≠ 0); ``rel`` releases it."""
    return wiring.Signature({
        "count": Out(range(JOB_CTX_ENTRIES + 1)), "head": Out(job_ctx_layout(max_heads)),
        "rel": In(1),
    })


def slot_write_signature(max_heads: int, max_block: int, slots: int) -> wiring.Signature:
    """The QK side's (writer's) view of :class:`SlotRing`: ``pub`` stores ``rec`` in slot
    ``slot`` (the write pointer, the slot the QK side scores into) and moves on; ``count`` =
    published, unreleased slots."""
    return wiring.Signature({
        "pub": Out(1), "rec": Out(score_slot_layout(max_heads, max_block)),
        "slot": In(range(slots)), "count": In(range(slots + 1)),
    })


def slot_read_signature(max_heads: int, max_block: int, slots: int) -> wiring.Signature:
    """The ring's side towards the PV side: ``head`` = the record of slot ``slot`` (the read
    pointer; valid while ``count`` ≠ 0); ``rel`` releases it."""
    return wiring.Signature({
        "count": Out(range(slots + 1)), "slot": Out(range(slots)),
        "head": Out(score_slot_layout(max_heads, max_block)), "rel": In(1),
    })


class JobRing(wiring.Component):
    """:data:`JOB_CTX_ENTRIES` job contexts between the QK and the PV side.

    Members
    -------
    w : In(:func:`job_write_signature`)
        Writes into the entry at the write pointer, ``pub`` moves it on.
    r : Out(:func:`job_read_signature`)
        The entry at the read pointer (combinational), ``rel`` moves it on.

    Latency: a write or ``pub`` shows the next cycle (``count``, ``head``); a ``pub`` and a
    ``rel`` in one cycle leave ``count`` unchanged. No overflow check: the writer publishes only
    while ``count`` < :data:`JOB_CTX_ENTRIES`.
    """

    def __init__(self, max_heads: int):
        self.max_heads = max_heads
        super().__init__({"w": In(job_write_signature(max_heads)),
                          "r": Out(job_read_signature(max_heads))})

    def elaborate(self, platform):
        m = Module()
        w, r = self.w, self.r
        ctx = [Signal(job_ctx_layout(self.max_heads), name=f"ctx{n}")
               for n in range(JOB_CTX_ENTRIES)]
        wp, rp = Signal(range(JOB_CTX_ENTRIES)), Signal(range(JOB_CTX_ENTRIES))
        m.d.sync += r.count.eq(r.count + w.pub - r.rel)
        m.d.comb += w.count.eq(r.count)
        with m.If(w.pub):
            m.d.sync += wp.eq(~wp)
        with m.If(r.rel):
            m.d.sync += rp.eq(~rp)
        for n in range(JOB_CTX_ENTRIES):
            with m.If(wp == n):
                with m.If(w.hdr_en):
                    m.d.sync += [getattr(ctx[n], f).eq(getattr(w.hdr, f))
                                 for f in job_ctx_hdr_layout(self.max_heads).members]
                with m.If(w.mfix_en):
                    m.d.sync += ctx[n].mfix[w.mfix_h].eq(w.mfix)
            with m.If(rp == n):
                m.d.comb += r.head.eq(ctx[n])
        return m


class SlotRing(wiring.Component):
    """``slots`` score-slot records (:func:`score_slot_layout`) between the QK and the PV side;
    slot ``n``'s scores live in the engine's score memory at ``(n·max_heads + head, row)``.

    Members
    -------
    w : In(:func:`slot_write_signature`)
        ``pub`` stores ``rec`` in the slot at the write pointer and moves it on.
    r : Out(:func:`slot_read_signature`)
        The record at the read pointer (combinational), ``rel`` moves it on.

    Latency: as :class:`JobRing`; the writer publishes only while ``count`` < ``slots``.
    """

    def __init__(self, max_heads: int, max_block: int, slots: int):
        self.max_heads, self.max_block, self.slots = max_heads, max_block, slots
        super().__init__({"w": In(slot_write_signature(max_heads, max_block, slots)),
                          "r": Out(slot_read_signature(max_heads, max_block, slots))})

    def elaborate(self, platform):
        m = Module()
        NS = self.slots
        w, r = self.w, self.r
        slot = [Signal(score_slot_layout(self.max_heads, self.max_block), name=f"slot{n}")
                for n in range(NS)]
        m.d.sync += r.count.eq(r.count + w.pub - r.rel)
        m.d.comb += w.count.eq(r.count)
        with m.If(w.pub):
            m.d.sync += w.slot.eq(Mux(w.slot == NS - 1, 0, w.slot + 1))
        with m.If(r.rel):
            m.d.sync += r.slot.eq(Mux(r.slot == NS - 1, 0, r.slot + 1))
        for n in range(NS):
            with m.If(w.pub & (w.slot == n)):
                m.d.sync += slot[n].eq(w.rec)
            with m.If(r.slot == n):
                m.d.comb += r.head.eq(slot[n])
        return m
