"""The output side of the attention engine on the arrays (issue #33;
:class:`~.array_engine.ArrayEngine`): a job's merged head states, as
:class:`~.tile_merge.TileMerge` emits them, kept until the job's last head is in, then emitted
by :class:`~.attn_out.OutputStage` — the words and payloads of
:class:`~.attention.AttentionEngine`.
"""

from __future__ import annotations

from amaranth import Array, Module, Mux, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.attn_tile import merge_beat_layout
from mcf.abi.framing import beat_layout
from mcf.abi.kv import AttnMode
from mcf.abi.softmax import LANE_BITS, M_EMPTY, STATE_L, STATE_M

from .attn_out import OutputStage
from .engine_query import out_job_layout

__all__ = ["StateOut"]


class StateOut(wiring.Component):
    """Per kept job (``ojob``, in job order) its ``heads`` merged rows (``i``, ``row`` = head)
    into a state store, then the job out through an :class:`~.attn_out.OutputStage`; a job
    without blocks (``empty``) goes out at once with every head's empty state (``M_EMPTY``, or
    FIXED's ``m_fix``, ``l`` and ``o`` 0).

    Members
    -------
    ojob : In(stream.Signature(out_job_layout(max_heads))) — taken when the job is out.
    i : In(stream.Signature(merge_beat_layout(lanes, max_heads)))
        A head's merged ``(m, l, o)`` beats (TileMerge's, built with the same ``lanes``), each
        written into the state store as it comes (``m``, ``l`` from the head's last).
    o : Out(stream.Signature(beat_layout(data_width))) — the payload beats.
    job : Out(1) — a job out (its last word in the packer).
    busy : Out(1)

    Latency: a job starts one cycle after its last head is written (an empty job one cycle
    after ``ojob`` is valid), then :class:`~.attn_out.OutputStage`'s.
    """

    def __init__(self, head_dim: int, lanes: int, max_heads: int, data_width: int,
                 fifo_depth: int = 16):
        self.head_dim, self.lanes, self.max_heads = head_dim, lanes, max_heads
        self.data_width, self.fifo_depth = data_width, fifo_depth
        super().__init__({
            "ojob": In(stream.Signature(out_job_layout(max_heads))),
            "i": In(stream.Signature(merge_beat_layout(lanes, max_heads))),
            "o": Out(stream.Signature(beat_layout(data_width))),
            "job": Out(1), "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        D, L, G = self.head_dim, self.lanes, self.max_heads
        NB = D // L
        W = L * LANE_BITS
        m.submodules.out = out = OutputStage(D, L, G, self.data_width, self.fifo_depth)
        wiring.connect(m, out.o, wiring.flipped(self.o))
        m.submodules.omem = omem = Memory(shape=unsigned(W), depth=G * NB, init=[])
        o_wr, o_rd = omem.write_port(), omem.read_port()
        m_reg = Array(Signal(STATE_M.width, name=f"m{n}") for n in range(G))
        l_reg = Array(Signal(STATE_L.width, name=f"l{n}") for n in range(G))
        jb, ip = self.ojob.payload, self.i.payload
        w = Signal(range(NB))
        got = Signal(range(G + 1))

        m.d.comb += [out.mode.eq(jb.mode), out.normalize.eq(jb.normalize), out.heads.eq(jb.heads)]
        fixed = jb.mode == AttnMode.FIXED
        m_fix = Array(jb.m_fix[n] for n in range(G))
        m.d.comb += [
            out.m_word.eq(Mux(jb.empty, Mux(fixed, m_fix[out.h], M_EMPTY), m_reg[out.h])),
            out.l_word.eq(Mux(jb.empty, 0, l_reg[out.h])),
            o_rd.addr.eq(out.addr), out.o_lanes.eq(Mux(jb.empty, 0, o_rd.data)),
        ]
        m.d.comb += [o_wr.addr.eq(ip.row * NB + w), o_wr.data.eq(ip.state.o.as_value())]
        with m.FSM() as fsm:
            with m.State("IDLE"), m.If(self.ojob.valid):
                m.d.sync += [got.eq(0), w.eq(0)]
                m.next = "COLLECT"
                with m.If(jb.empty):
                    m.next = "START"
            with m.State("COLLECT"):
                with m.If(got == jb.heads):
                    m.next = "START"
                with m.Elif(self.i.valid):
                    m.d.comb += [o_wr.en.eq(1), self.i.ready.eq(1)]
                    m.d.sync += w.eq(w + 1)
                    with m.If(ip.last):
                        m.d.sync += [w.eq(0), got.eq(got + 1), m_reg[ip.row].eq(ip.state.m),
                                     l_reg[ip.row].eq(ip.state.l)]
            with m.State("START"):
                m.d.comb += out.start.eq(1)
                m.next = "RUN"
            with m.State("RUN"), m.If(~out.busy):
                m.d.comb += [self.ojob.ready.eq(1), self.job.eq(1)]
                m.next = "IDLE"
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE") | self.ojob.valid)
        return m
