"""INT4 × INT8 dot-product array with group scales and DSP48E2 packing (paper §5 compute engine;
formats in :mod:`mcf.abi.quant`, arithmetic mirrored by :mod:`mcf.golden.gemm`)."""

from __future__ import annotations

from amaranth import Array, Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.quant import (
    ACC_BITS,
    GROUP_SIZE,
    SCALE_MANT_BITS,
    WEIGHT,
    XQ,
    group_sum_bits,
    pack_shift,
)

__all__ = ["GemmArray", "step_layout", "result_layout"]


def step_layout(rows: int, lanes: int) -> data.StructLayout:
    """One k-step: ``rows × lanes`` INT4 weights (row r, lane l at nibble r·lanes + l),
    ``lanes`` INT8 activations, ``rows`` scale mantissas (used on ``glast`` steps), flags."""
    return data.StructLayout({
        "w": unsigned(rows * lanes * WEIGHT.width),
        "a": unsigned(lanes * XQ.width),
        "scale": unsigned(rows * SCALE_MANT_BITS),
        "glast": unsigned(1),
        "last": unsigned(1),
    })


def result_layout(rows: int) -> data.ArrayLayout:
    return data.ArrayLayout(signed(ACC_BITS), rows)


class GemmArray(wiring.Component):
    """Dot-product array: ``rows`` outputs × ``lanes`` K-elements per cycle.

    Rows are paired (2i, 2i+1); each pair and lane uses one multiplier computing
    ``(w[2i+1]·2^k + w[2i]) · a`` (``k = pack_shift(group)``), so one DSP48E2 does two
    INT4×INT8 MACs. A pipelined adder tree sums the lanes; the packed sum is accumulated over
    one group and split at the group end into two exact group sums. A shared scaler
    (``scalers`` multipliers, ``rows / scalers ≤ group / lanes`` cycles per group) multiplies
    group sums by the scale mantissas and accumulates them in 48 bits.

    Members
    -------
    i : In(stream.Signature(step_layout))
        k-steps. ``glast`` marks the last step of a group, ``last`` the last of a dot product
        (a ``last`` step must also be ``glast``). Groups are ``group / lanes`` steps long.
    o : Out(stream.Signature(result_layout))
        ``rows`` 48-bit accumulators per dot product.

    ``chain`` (a power of 2 dividing ``lanes``; default 1): lanes summed by a chain of
    ``chain`` post-adders instead of the first ``log2(chain)`` adder-tree levels — lane ``j``
    of a chain takes its inputs ``j`` cycles late and adds its product to the previous lane's
    registered sum, the form of a DSP48E2 ``P = A·B + PCIN`` cascade, so synthesis can put the
    sums into the DSPs that compute the products.

    Latency: ``3 + log2(lanes) + rows / scalers`` cycles from the ``last`` step to
    ``o.valid``, ``+ chain − log2(chain)`` with a chain. Throughput: one step per cycle. The
    whole pipeline stalls (``i.ready`` low) only while a result waits on ``o.ready``.
    """

    def __init__(self, rows: int = 16, lanes: int = 16, group: int = GROUP_SIZE,
                 chain: int = 1):
        if rows % 2 or group % lanes:
            raise ValueError("rows must be even and lanes must divide the group")
        if lanes % chain or chain & (chain - 1):
            raise ValueError("chain must be a power of 2 dividing lanes")
        self.rows, self.lanes, self.group, self.chain = rows, lanes, group, chain
        steps = group // lanes
        self.scalers = max(1, -(-rows // steps))
        while rows % self.scalers:
            self.scalers += 1
        self.k = pack_shift(group)
        self.tree_levels = (lanes - 1).bit_length()
        self.latency = (3 + self.tree_levels + rows // self.scalers +
                        (chain - (chain - 1).bit_length() if chain > 1 else 0))
        super().__init__({
            "i": In(stream.Signature(step_layout(rows, lanes))),
            "o": Out(stream.Signature(result_layout(rows))),
        })

    def elaborate(self, platform):
        m = Module()
        R, L, k = self.rows, self.lanes, self.k
        P = R // 2
        en = Signal()
        m.d.comb += [en.eq(~self.o.valid | self.o.ready), self.i.ready.eq(en)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)

        # stage 1: register the step
        s1 = Signal(self.i.payload.shape())
        v1 = Signal()
        with m.If(en):
            m.d.sync += [s1.eq(self.i.payload), v1.eq(self.i.valid)]

        C = self.chain
        # lane l's inputs delayed l mod chain cycles (the chain's skew)
        w_l, a_l = [], []
        for l_ in range(L):
            wv = Cat(*[s1.w[(r * L + l_) * 4:(r * L + l_) * 4 + 4] for r in range(R)])
            av = s1.a[l_ * 8:l_ * 8 + 8]
            for d in range(l_ % C):
                wd = Signal(len(wv), name=f"wskew{l_}_{d}", reset_less=True)
                ad = Signal(8, name=f"askew{l_}_{d}", reset_less=True)
                with m.If(en):
                    m.d.sync += [wd.eq(wv), ad.eq(av)]
                wv, av = wd, ad
            w_l.append(wv)
            a_l.append(av)

        def wnib(r, l_):
            if l_ % C == 0:
                return s1.w[(r * L + l_) * 4:(r * L + l_) * 4 + 4].as_signed()
            return w_l[l_][r * 4:r * 4 + 4].as_signed()

        def act(l_):
            return a_l[l_].as_signed() if l_ % C else s1.a[l_ * 8:l_ * 8 + 8].as_signed()

        # stage 2: packed products (DSP: multiplicand w1·2^k + w0, multiplier a)
        prod_w = k + 4 + XQ.width
        prods = [[Signal(signed(prod_w), name=f"p{p}_{l_}") for l_ in range(L)] for p in range(P)]
        v2, g2, l2 = Signal(), Signal(), Signal()
        sc2 = Signal(R * SCALE_MANT_BITS)
        with m.If(en):
            for p in range(P):
                for l_ in range(L):
                    # w1·2^k + w0 built as a concatenation (sext(w0) below, w1 − sign(w0)
                    # above) so synthesis sees one 24×8 multiply, not two distributed ones
                    w0, w1 = wnib(2 * p, l_), wnib(2 * p + 1, l_)
                    lo = Signal(signed(k), name=f"pk_lo{p}_{l_}")
                    hi = Signal(signed(WEIGHT.width + 1), name=f"pk_hi{p}_{l_}")
                    m.d.comb += [lo.eq(w0), hi.eq(w1 - w0[WEIGHT.width - 1])]
                    packed = Cat(lo, hi).as_signed()
                    m.d.sync += prods[p][l_].eq(packed * act(l_))
            m.d.sync += [v2.eq(v1), g2.eq(s1.glast & v1), l2.eq(s1.last & v1), sc2.eq(s1.scale)]

        level = prods
        vt, gt, lt, sct = v2, g2, l2, sc2
        width = prod_w

        def delay_flags(vt, gt, lt, sct):
            nv, ng, nl, nsc = Signal(), Signal(), Signal(), Signal(R * SCALE_MANT_BITS)
            with m.If(en):
                m.d.sync += [nv.eq(vt), ng.eq(gt), nl.eq(lt), nsc.eq(sct)]
            return nv, ng, nl, nsc

        if C > 1:
            # post-adder chains: sum_j = prod_j + sum_{j−1} (registered), chain output C
            # registers after lane 0's product
            width = prod_w + (C - 1).bit_length()
            nxt = []
            for p in range(P):
                outs = []
                for q in range(L // C):
                    prev = None
                    for j in range(C):
                        s_ = Signal(signed(width), name=f"ch{p}_{q}_{j}")
                        with m.If(en):
                            m.d.sync += s_.eq(level[p][q * C + j] if prev is None
                                              else level[p][q * C + j] + prev)
                        prev = s_
                    outs.append(prev)
                nxt.append(outs)
            level = nxt
            for _ in range(C):
                vt, gt, lt, sct = delay_flags(vt, gt, lt, sct)

        # adder tree over the remaining lanes (chain outputs), one register per level
        for lv in range((L // C - 1).bit_length()):
            width += 1
            nxt = []
            for p in range(P):
                row = level[p]
                out = []
                for j in range(0, len(row), 2):
                    s = Signal(signed(width), name=f"t{lv}_{p}_{j // 2}")
                    with m.If(en):
                        m.d.sync += s.eq(row[j] + row[j + 1] if j + 1 < len(row) else row[j])
                    out.append(s)
                nxt.append(out)
            level = nxt
            vt, gt, lt, sct = delay_flags(vt, gt, lt, sct)
        sums = [level[p][0] for p in range(P)]

        # packed group accumulator
        gbits = group_sum_bits(self.group)
        pacc_w = k + gbits + 1
        pacc = [Signal(signed(pacc_w), name=f"pacc{p}") for p in range(P)]
        fresh = Signal(init=1)   # next step starts a new group
        hold = [Signal(signed(gbits), name=f"gs{r}") for r in range(R)]
        hold_sc = Signal(R * SCALE_MANT_BITS)
        hold_last = Signal()
        hold_first = Signal()     # group is the first of its dot product
        dot_fresh = Signal(init=1)
        start_scale = Signal()
        with m.If(en):
            m.d.sync += start_scale.eq(0)
            with m.If(vt):
                for p in range(P):
                    new = Signal(signed(pacc_w), name=f"pnew{p}")
                    m.d.comb += new.eq(sums[p] + Mux0(fresh, pacc[p]))
                    m.d.sync += pacc[p].eq(new)
                    with m.If(gt):
                        low = new[:k].as_signed()
                        high = (new - low) >> k
                        m.d.sync += [hold[2 * p].eq(low), hold[2 * p + 1].eq(high)]
                m.d.sync += fresh.eq(gt)
                with m.If(gt):
                    m.d.sync += [hold_sc.eq(sct), hold_last.eq(lt), hold_first.eq(dot_fresh),
                                 start_scale.eq(1), dot_fresh.eq(lt)]

        # shared scaler: pass j (0 .. rows/scalers − 1) handles rows j·S .. j·S + S − 1;
        # pass 0 runs in the cycle after the group end, so a group of group/lanes steps
        # leaves enough cycles for all passes before ``hold`` is overwritten.
        S = self.scalers
        passes = R // S
        acc = [Signal(signed(ACC_BITS), name=f"acc{r}") for r in range(R)]
        busy = Signal()
        idx = Signal(range(max(passes, 2)))
        cur = Signal(range(max(passes, 2)))
        active = Signal()
        m.d.comb += [active.eq(start_scale | busy), cur.eq(Mux(start_scale, 0, idx))]
        # S shared multipliers; multiplier s serves rows j·S + s in pass j
        prods_s = []
        for sc in range(S):
            g_sel = Array(hold[j * S + sc] for j in range(passes))[cur]
            m_sel = Array(hold_sc[(j * S + sc) * SCALE_MANT_BITS:
                                  (j * S + sc + 1) * SCALE_MANT_BITS]
                          for j in range(passes))[cur]
            ps = Signal(signed(gbits + SCALE_MANT_BITS + 1), name=f"scaled{sc}")
            m.d.comb += ps.eq(g_sel * m_sel)
            prods_s.append(ps)
        newacc = []
        for r in range(R):
            na = Signal(signed(ACC_BITS), name=f"newacc{r}")
            m.d.comb += na.eq(prods_s[r % S] + Mux0(hold_first, acc[r]))
            newacc.append(na)
        with m.If(en & active):
            for r in range(R):
                with m.If(cur == r // S):
                    m.d.sync += acc[r].eq(newacc[r])
            with m.If(cur == passes - 1):
                m.d.sync += busy.eq(0)
                with m.If(hold_last):
                    m.d.sync += self.o.valid.eq(1)
                    for r in range(R):
                        m.d.sync += self.o.payload[r].eq(
                            newacc[r] if r // S == passes - 1 else acc[r])
            with m.Else():
                m.d.sync += [busy.eq(1), idx.eq(cur + 1)]
        return m


def Mux0(sel_zero, value):
    """``0`` when ``sel_zero`` else ``value`` (an accumulator restart)."""
    return Mux(sel_zero, 0, value)
