"""Token control of the vector unit (paper §5 compute engine): takes the operands, buffers a
token for the two-pass ops (RMSNorm, requantisation), runs their per-token calculation with the
sequential helpers of :mod:`.vector_math` and issues beats into the datapath of
:mod:`.vector_pipe` (formats :mod:`mcf.abi.quant`, arithmetic :mod:`mcf.golden.vector`).
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.quant import (
    ACT,
    ACT_FRAC,
    NORM_RECIP_BITS,
    NORM_SQRT_SHIFT,
    QMAX_SHIFT,
    RECIP_BITS,
    RSQRT_MANT_BITS,
    SCALE_MANT_BITS,
    VectorOp,
)

from .vector_math import VectorDivider, VectorSqrt
from .vector_pipe import SS_BITS, VectorKind, vector_acc_layout, vector_issue_layout

__all__ = ["BUF_BANK_DEPTH", "VectorControl"]

BUF_BANK_DEPTH = 2048
"""The token buffer is split into banks of at most this depth: yosys' Xilinx memory mapping
fails on deeper 128-bit memories (e.g. 2240 × 128 for an 8960-element token)."""


def _lead(value):
    """``(nonzero, position of the leading one)`` of an unsigned value, as a balanced tree (the
    position is ``Cat(lower half's, 0)`` or ``Cat(upper half's, 1)``): log2 levels of 2:1
    multiplexers, not a priority chain as long as the value."""
    w = len(value)
    if w == 1:
        return value[0], Const(0, 0)
    k = (w - 1).bit_length() - 1          # the lower half: 2^k bits, the upper half the rest
    lo_nz, lo_pos = _lead(value[:1 << k])
    hi_nz, hi_pos = _lead(value[1 << k:])
    lo_pos = Cat(lo_pos, Const(0, k - len(lo_pos)))
    hi_pos = Cat(hi_pos, Const(0, k - len(hi_pos)))
    return lo_nz | hi_nz, Cat(Mux(hi_nz, hi_pos, lo_pos), hi_nz)


def _bitlen(m, value, name):
    """Comb bit length of an unsigned value (a balanced leading-one tree, :func:`_lead`)."""
    out = Signal(range(len(value) + 1), name=name)
    nz, pos = _lead(value)
    m.d.comb += out.eq(Mux(nz, pos + 1, 0))
    return out


class _Port:
    def __init__(self, width, addr_width):
        self.addr = Signal(addr_width, name="buf_addr")
        self.data = Signal(width, name="buf_data")
        self.en = Signal(name="buf_en")


def _token_buffer(m: Module, width: int, depth: int):
    """A ``depth`` × ``width`` buffer (one write, one synchronous read port, enable-held) in
    banks of :data:`BUF_BANK_DEPTH`; returns the write and read port records."""
    bank = min(depth, BUF_BANK_DEPTH)
    n_banks = -(-depth // bank)
    lg = (bank - 1).bit_length()
    abits = max(depth - 1, 1).bit_length()
    w, r = _Port(width, abits), _Port(width, abits)
    sel = Signal(range(n_banks), name="buf_sel")
    datas = []
    for i in range(n_banks):
        mem = memory.Memory(shape=unsigned(width), depth=bank, init=[])
        m.submodules[f"buf{i}"] = mem
        wp, rp = mem.write_port(), mem.read_port()
        m.d.comb += [wp.addr.eq(w.addr), wp.data.eq(w.data),
                     wp.en.eq(w.en & ((w.addr >> lg) == i)),
                     rp.addr.eq(r.addr), rp.en.eq(r.en)]
        datas.append(rp.data)
    with m.If(r.en):
        m.d.sync += sel.eq(r.addr >> lg)
    m.d.comb += r.data.eq(Array(datas)[sel])
    return w, r


class VectorControl(wiring.Component):
    """Operand intake, token buffer and per-token calculation of the vector unit.

    Members
    -------
    op, n_beats, eps : In
        As :class:`~mcf.hdl.compute.vector.VectorUnit`'s, sampled in IDLE.
    a, b : In(stream.Signature(unsigned(lanes · 32)))
        The operand streams (``ready`` only with ``en``).
    en : In(1)
        Pipeline enable; a beat is issued only with it, and ``s0`` holds while it is low.
    acc : In(vector_acc_layout())
        The pass-1 contribution of the beat in S1 (:class:`~.vector_pipe.VectorFront`), added
        to the token's sum of squares or lane maxima with ``en``.
    s0 : Out(vector_issue_layout(lanes))
        The issued beat (the S0 register; ``x`` comes from the token buffer in pass 2).

    Latency: a streaming beat is in ``s0`` 1 cycle after its handshake. RMSNORM / REQUANT:
    pass 1 takes a beat per cycle into the buffer, then (after pass 1 has left S1) ⌊Σ/N⌋
    (73 cycles), integer square root (37), ⌊2^48/rms⌋ (73), or ⌊2^31/m⌋ (73), then pass 2
    issues a beat per cycle (REQUANT adds its scale beat). During REQUANT's pass 2 the next
    token's ``a`` beats ride along, one with each pass-2 beat, into the buffer behind the
    reads and into the lane maxima; after the scale beat that token's pass 1 goes on where it
    stands. REQUANT_EXT: as REQUANT (no riding), with one more cycle once pass 1 has left S1
    and the ``b`` beat is there. ABSMAX: pass 1 (no second pass), then its one beat is in
    ``s0`` 2 cycles after pass 1 has left S1.
    """

    def __init__(self, lanes: int, n_max: int):
        self.lanes, self.n_max = lanes, n_max
        self.beats_max = n_max // lanes
        W = lanes * ACT.width
        super().__init__({
            "op": In(VectorOp), "n_beats": In(range(self.beats_max + 1)), "eps": In(32),
            "a": In(stream.Signature(unsigned(W))), "b": In(stream.Signature(unsigned(W))),
            "en": In(1), "acc": In(vector_acc_layout()),
            "s0": Out(vector_issue_layout(lanes)),
        })

    def elaborate(self, platform):
        m = Module()
        L, en, acc = self.lanes, self.en, self.acc
        lb = (L - 1).bit_length()
        bw, br = _token_buffer(m, L * 32, self.beats_max)
        op = Signal(VectorOp)
        nb = Signal.like(self.n_beats)
        eps = Signal(32)
        cnt = Signal(range(self.beats_max + 1))      # beats issued in this pass
        p1cnt = Signal(range(self.beats_max + 1))    # REQUANT: the next token's beats in P2
        p1_seen = Signal(range(self.beats_max + 1))  # pass-1 beats through the pipeline
        ss = Signal(SS_BITS)
        amax = Signal(32)
        smax = Signal(signed(32))                    # ABSMAX lanes: max x, max ~x
        nmax = Signal(signed(32))
        tok_k = Signal(RSQRT_MANT_BITS + 1)          # multiplier of pass 2 (rm or r)
        tok_sh = Signal(6)
        scale_word = Signal(32)

        # S0 register; in pass 2 its operand comes from the buffer's read port
        s0 = Signal(vector_issue_layout(L))
        from_buf0 = Signal()
        m.d.comb += [self.s0.eq(s0), self.s0.x.eq(Mux(from_buf0, br.data, s0.x))]

        m.submodules.div = div = VectorDivider(SS_BITS, 40)
        m.submodules.sqrt = sq = VectorSqrt(SS_BITS)
        waddr = Signal.like(cnt)
        m.d.comb += [waddr.eq(cnt), bw.addr.eq(waddr), bw.data.eq(self.a.payload),
                     br.addr.eq(cnt), br.en.eq(en)]

        def issue(kind, last, from_buf=0, x=None, b=None, ride=0):
            m.d.sync += [s0.valid.eq(1), s0.kind.eq(kind), s0.last.eq(last), s0.ride.eq(ride),
                         s0.rx.eq(self.a.payload),
                         from_buf0.eq(from_buf), s0.k.eq(tok_k), s0.sh.eq(tok_sh)]
            if x is not None:
                m.d.sync += s0.x.eq(x)
            if b is not None:
                m.d.sync += s0.b.eq(b)

        with m.If(en):
            m.d.sync += s0.valid.eq(0)
        stream_kind = Signal(VectorKind)
        m.d.comb += stream_kind.eq(Mux(op == VectorOp.ADD, VectorKind.ADD,
                                       Mux(op == VectorOp.SILU_MUL, VectorKind.SILU,
                                           VectorKind.ROPE)))
        final = Signal()
        m.d.comb += final.eq(cnt == nb - 1)
        norm = Signal()
        m.d.comb += norm.eq(op == VectorOp.RMSNORM)
        n_elems = Signal(range(self.n_max + 1))
        m.d.comb += n_elems.eq(nb << lb)
        # the normalisations below, x -> x shifted to B mantissa bits by its bit length L, are
        # one right shift, (x << B) >> L (= x >> (L - B) or x << (B - L), exactly): no compare
        # or subtract before the shifter; both lengths are formed outside the FSM, and RMSNorm's
        # is the divider's q_len register (q <= 2^NORM_RECIP_BITS as root >= 1: rinv is all of q)
        rinv = div.q[:NORM_RECIP_BITS + 1]
        rinv_len = Signal(range(64))
        t_len = Signal(range(64))
        m.d.comb += [rinv_len.eq(div.q_len), t_len.eq(_bitlen(m, amax, "amax_len"))]
        rinv_mant = Signal.like(tok_k)
        mant = Signal(SCALE_MANT_BITS)
        m.d.comb += [rinv_mant.eq((rinv << RSQRT_MANT_BITS) >> rinv_len),
                     mant.eq((amax << SCALE_MANT_BITS) >> t_len)]

        with m.FSM():
            with m.State("IDLE"):
                m.d.sync += [op.eq(self.op), nb.eq(self.n_beats), eps.eq(self.eps), cnt.eq(0),
                             p1_seen.eq(0), ss.eq(0), amax.eq(0),
                             smax.eq(-(1 << 31)), nmax.eq(-(1 << 31))]
                with m.If(self.a.valid & (self.n_beats != 0)):
                    with m.If((self.op == VectorOp.RMSNORM) | (self.op == VectorOp.REQUANT) |
                              (self.op == VectorOp.ABSMAX) | (self.op == VectorOp.REQUANT_EXT)):
                        m.next = "P1"
                    with m.Elif(self.op.as_value() <= VectorOp.ROPE.value):
                        m.next = "STREAM"
            with m.State("STREAM"):
                go = Signal()
                m.d.comb += [go.eq(en & self.a.valid & self.b.valid),
                             self.a.ready.eq(go), self.b.ready.eq(go)]
                with m.If(go):
                    issue(stream_kind, final, x=self.a.payload, b=self.b.payload)
                    m.d.sync += cnt.eq(cnt + 1)
                    with m.If(final):
                        m.next = "IDLE"
            with m.State("P1"):
                go = Signal()
                m.d.comb += [go.eq(en & self.a.valid), self.a.ready.eq(en),
                             bw.en.eq(go)]
                with m.If(go):
                    issue(Mux(norm, VectorKind.SQ, VectorKind.MAX), 0, x=self.a.payload)
                    m.d.sync += cnt.eq(cnt + 1)
                    with m.If(final):
                        m.next = "DRAIN"
            with m.State("DRAIN"), m.If(p1_seen == nb):
                m.d.sync += cnt.eq(0)
                with m.If(norm):
                    m.d.comb += [div.start.eq(1), div.n.eq(ss), div.d.eq(n_elems)]
                    m.next = "NORM_DIV"
                with m.Elif(op == VectorOp.ABSMAX):
                    m.next = "LANES"
                with m.Elif(op == VectorOp.REQUANT_EXT):
                    m.next = "EXT"
                with m.Else():
                    m.next = "REQ_NORMALISE"
                # the token's absmax max |x| = max(max x, max ~x + 1) (≤ 2^31)
                tok_amax = Signal(signed(34))
                m.d.comb += tok_amax.eq(Mux(nmax + 1 > smax, nmax + 1, smax))
                m.d.sync += amax.eq(tok_amax[:32])
            with m.State("LANES"), m.If(en):
                issue(VectorKind.SCALE, 1, x=Cat(smax, nmax))
                m.next = "IDLE"
            with m.State("EXT"):
                # the MAX-reduced ABSMAX lanes: absmax = max(l0, l1 + 1), at least 0
                l0 = self.b.payload[:32].as_signed()
                l1 = self.b.payload[32:64].as_signed()
                ext = Signal(signed(34))
                m.d.comb += [ext.eq(Mux(l1 + 1 > l0, l1 + 1, l0)), self.b.ready.eq(1)]
                with m.If(self.b.valid):
                    with m.If(ext > amax):                  # amax ≥ 0: a negative ext is 0
                        m.d.sync += amax.eq(ext[:32])
                    m.next = "REQ_NORMALISE"
            with m.State("NORM_DIV"), m.If(div.done):
                m.d.comb += [sq.start.eq(1),
                             sq.x.eq((div.q + eps) << NORM_SQRT_SHIFT)]
                m.next = "NORM_SQRT"
            with m.State("NORM_SQRT"), m.If(sq.done):
                m.d.comb += [div.start.eq(1), div.n.eq(1 << NORM_RECIP_BITS),
                             div.d.eq(Mux(sq.root == 0, 1, sq.root))]
                m.next = "NORM_RECIP"
            with m.State("NORM_RECIP"), m.If(div.done):
                tr = rinv_len - RSQRT_MANT_BITS   # may be negative
                m.d.sync += tok_k.eq(rinv_mant)
                m.d.sync += tok_sh.eq(NORM_RECIP_BITS - ACT_FRAC - tr)
                m.next = "P2"
            with m.State("REQ_NORMALISE"):
                # the token's maxima are in amax: the accumulators now take the next token's
                # pass-1 beats, which ride along pass 2 (P2)
                m.d.sync += [p1cnt.eq(0), p1_seen.eq(0),
                             smax.eq(-(1 << 31)), nmax.eq(-(1 << 31))]
                t = t_len - SCALE_MANT_BITS
                e = t - QMAX_SHIFT - ACT_FRAC
                m.d.sync += [tok_sh.eq(RECIP_BITS - QMAX_SHIFT + t),
                             scale_word.eq(Mux(amax == 0, 0,
                                               Cat(mant, e[:8], Const(0, 8))))]
                with m.If(amax == 0):
                    m.d.sync += tok_k.eq(0)
                    m.next = "P2"
                with m.Else():
                    m.d.comb += [div.start.eq(1), div.n.eq(1 << RECIP_BITS), div.d.eq(mant)]
                    m.next = "REQ_RECIP"
            with m.State("REQ_RECIP"), m.If(div.done):
                m.d.sync += tok_k.eq(div.q)
                m.next = "P2"
            with m.State("P2"):
                go = Signal()
                # REQUANT: the next token's pass-1 beats ride along in rx — written behind the
                # reads (p1cnt <= cnt; a write in the cycle of its address' read reads first)
                ride_ok, ride = Signal(), Signal()
                m.d.comb += [go.eq(en & (~norm | self.b.valid)),
                             self.b.ready.eq(en & norm),
                             ride_ok.eq((op == VectorOp.REQUANT) & (p1cnt != nb)),
                             ride.eq(go & ride_ok & self.a.valid),
                             self.a.ready.eq(go & ride_ok),
                             waddr.eq(p1cnt), bw.en.eq(ride)]
                with m.If(go):
                    issue(Mux(norm, VectorKind.NORM, VectorKind.REQ), final, from_buf=1,
                          b=self.b.payload, ride=ride)
                    m.d.sync += cnt.eq(cnt + 1)
                    with m.If(ride):
                        m.d.sync += p1cnt.eq(p1cnt + 1)
                    with m.If(final):
                        with m.If(norm):
                            m.next = "IDLE"
                        with m.Else():
                            m.next = "SCALE"
            with m.State("SCALE"), m.If(en):
                issue(VectorKind.SCALE, 1, x=scale_word)
                # a next token begun in P2 goes on where it stands (op, n_beats unchanged: the
                # walker changes them only with the unit idle)
                m.d.sync += cnt.eq(p1cnt)
                with m.If(p1cnt == 0):
                    m.next = "IDLE"
                with m.Elif(p1cnt == nb):
                    m.next = "DRAIN"
                with m.Else():
                    m.next = "P1"

        # pass-1 reductions straight into the token accumulators
        with m.If(en & acc.valid):
            with m.If(acc.kind == VectorKind.SQ):
                m.d.sync += [ss.eq(ss + acc.sq), p1_seen.eq(p1_seen + 1)]
            with m.If(acc.kind == VectorKind.MAX):
                m.d.sync += [smax.eq(Mux(acc.smax > smax, acc.smax, smax)),
                             nmax.eq(Mux(acc.nmax > nmax, acc.nmax, nmax)),
                             p1_seen.eq(p1_seen + 1)]
        return m
