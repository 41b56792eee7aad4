"""Vector unit: the non-GEMM, non-attention ops of a Qwen2 layer in the ABI's fixed-point
formats — residual add, SiLU-gated multiply, RoPE, RMSNorm, requantisation to INT8, and the row
scale of tensor-parallel decode from the shards (ABSMAX, REQUANT_EXT) (paper §5
compute engine; formats :mod:`mcf.abi.quant`; arithmetic :mod:`mcf.golden.vector` bit for bit).
"""

from __future__ import annotations

from amaranth import Module, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.compute import VECTOR_STATUS
from mcf.abi.quant import ACT, VectorOp

from .vector_ctrl import VectorControl
from .vector_pipe import VectorBack, VectorFront, vector_out_layout

__all__ = ["VectorUnit", "vector_out_layout"]


class VectorUnit(wiring.Component):
    """Token-vector ops, ``lanes`` ACT elements per beat.

    Members
    -------
    op, n_beats, eps : In
        Sampled when a token's first ``a`` beat is offered (hold them stable until then):
        the :class:`mcf.abi.quant.VectorOp`, the token length in beats
        (``N = n_beats · lanes``), RMSNorm ε as a mean-square code
        (:func:`mcf.abi.quant.norm_eps_code`).
    a : In(stream.Signature(unsigned(lanes · 32)))
        First operand (ACT codes, lane ``l`` in bits ``32l``…).
    b : In(stream.Signature(unsigned(lanes · 32)))
        Second operand: ADD — ACT; SILU_MUL — ``up`` (ACT); ROPE — :func:`rope_words`;
        RMSNORM — γ as GAMMA codes in the low 16 bits of each lane; REQUANT, ABSMAX — unused;
        REQUANT_EXT — one beat per token, lanes 0 and 1 the MAX-reduced ABSMAX lanes of the
        row (:func:`mcf.abi.tp.lanes_absmax`; the other lanes are ignored).
    o : Out(stream.Signature(vector_out_layout))
        ``n_beats`` result beats per token, ``last`` on the token's final beat. REQUANT and
        REQUANT_EXT emit the INT8 codes densely packed (``4 · lanes`` per beat,
        ``ceil(n_beats / 4)`` beats, zero-padded), then one beat whose lane 0 is the scale word
        (:func:`mcf.quant.pack_token_scale`), flagged ``last``; REQUANT_EXT's absmax is the
        larger of the token's and the ``b`` lanes' (:func:`mcf.golden.vector.requantize_ext`).
        ABSMAX emits one beat, ``last``: lane 0 ``max x``, lane 1 ``max ~x``, the others 0
        (:func:`mcf.golden.vector.absmax`) — a shard's contribution to the row scale's MAX
        all-reduce in tensor-parallel decode.
    status : Out(:data:`mcf.abi.compute.VECTOR_STATUS`)
        Counters: tokens completed, operand beats taken (``a`` and ``b``), result beats.

    Latency: streaming ops (ADD, SILU_MUL, ROPE) 8 cycles, one beat per cycle, one bubble
    between tokens. RMSNORM and REQUANT buffer the token (``n_max`` elements), then run a
    sequential calculation — RMSNorm: ⌊Σ/N⌋ (73 cycles), integer square root (37), ⌊2^48/rms⌋
    (73); REQUANT, REQUANT_EXT: ⌊2^31/m⌋ (73) — then a second pass at one beat per cycle.
    REQUANT tokens whose ``a`` beats follow each other (one VEC entry's rows): the next token's
    first pass rides along this one's second pass, beat for beat, so a token of ``n_beats``
    costs ``n_beats`` + its calculation + a few cycles, the entry's first token ``2·n_beats``.
    ABSMAX: one pass at one beat per cycle, its beat 11 cycles after the last ``a`` beat.

    Structure: :class:`~.vector_ctrl.VectorControl` (operands, token buffer, per-token
    calculation, issue), :class:`~.vector_pipe.VectorFront` (S1–S2) and
    :class:`~.vector_pipe.VectorBack` (S3–S6, output register); this component wires them and
    keeps the counters.
    """

    def __init__(self, lanes: int = 8, n_max: int = 1536):
        if lanes % 2 or lanes & (lanes - 1) or n_max % lanes:
            raise ValueError("lanes must be a power of two ≥ 2 dividing n_max")
        self.lanes, self.n_max = lanes, n_max
        self.beats_max = n_max // lanes
        W = lanes * ACT.width
        super().__init__({
            "op": In(VectorOp), "n_beats": In(range(self.beats_max + 1)),
            "eps": In(32),
            "a": In(stream.Signature(unsigned(W))),
            "b": In(stream.Signature(unsigned(W))),
            "o": Out(stream.Signature(vector_out_layout(lanes))),
            "status": Out(VECTOR_STATUS),
        })

    def elaborate(self, platform):
        m = Module()
        st = self.status
        L = self.lanes
        m.submodules.ctrl = ctrl = VectorControl(L, self.n_max)
        m.submodules.front = front = VectorFront(L)
        m.submodules.back = back = VectorBack(L)
        en = ctrl.en
        m.d.comb += en.eq(~self.o.valid | self.o.ready)
        m.d.comb += [front.en.eq(en), back.en.eq(en),
                     ctrl.op.eq(self.op), ctrl.n_beats.eq(self.n_beats), ctrl.eps.eq(self.eps)]
        wiring.connect(m, wiring.flipped(self.a), ctrl.a)
        wiring.connect(m, wiring.flipped(self.b), ctrl.b)
        m.d.comb += [front.s0.eq(ctrl.s0), ctrl.acc.eq(front.acc), back.s2.eq(front.s2)]
        wiring.connect(m, back.o, wiring.flipped(self.o))

        with m.If(back.token_done):
            m.d.sync += st.tokens.eq(st.tokens + 1)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += st.beats_out.eq(st.beats_out + 1)
        a_in = self.a.valid & self.a.ready
        b_in = self.b.valid & self.b.ready
        m.d.sync += st.beats_in.eq(st.beats_in + a_in + b_in)
        return m
