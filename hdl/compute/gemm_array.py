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

from .dsp48 import Dsp48MulAdd

__all__ = ["GemmArray", "step_layout", "result_layout"]


def step_layout(rows: int, lanes: int) -> data.StructLayout:
    """One k-step: ``rows × lanes`` INT4 weights (row r, lane l at nibble r·lanes + l),
    ``lanes`` 8-bit activations, ``rows`` scale mantissas (used on ``glast`` steps), flags.
    ``ua``: the step's activations are unsigned (0..255, :data:`mcf.abi.attn_tile.P8`, the P
    rows of the packed P·V), not INT8 — zero-extended instead of sign-extended."""
    return data.StructLayout({
        "w": unsigned(rows * lanes * WEIGHT.width),
        "a": unsigned(lanes * XQ.width),
        "scale": unsigned(rows * SCALE_MANT_BITS),
        "glast": unsigned(1),
        "last": unsigned(1),
        "ua": unsigned(1),
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
        (a ``last`` step must also be ``glast``). Groups are ``group / lanes`` steps long; a
        shorter group is exact too, but consecutive group ends must be at least ``rows /
        scalers`` cycles apart in which the pipeline moves (``i.ready`` high; the shared
        scaler's passes: ``group / lanes`` at 16 × 16, group 128), so a short group is padded
        with zero steps or its end is preceded by idle cycles.
        ``ua`` per step: unsigned activations (P8, 0..255) enter the multipliers zero-extended
        to 9 bits; every field's group sum still fits ``pack_shift(group)`` bits (``255 · 8 <
        2 · 128 · 8``), so the split stays exact — prefill attention's P·V on these arrays
        (docs/attention.md).
    o : Out(stream.Signature(result_layout))
        ``rows`` 48-bit accumulators per dot product.

    ``chain`` (a power of 2 dividing ``lanes``; default 1): lanes summed by a chain of
    ``chain`` post-adders instead of the first ``log2(chain)`` adder-tree levels — lane ``j``
    of a chain takes its inputs ``j`` cycles late and adds its product to the previous lane's
    registered sum, the form of a DSP48E2 ``P = A·B + PCIN`` cascade, so synthesis can put the
    sums into the DSPs that compute the products.

    ``dsp`` (with ``chain > 1``): ``"fabric"`` (default) writes products and chain adders as
    logic; ``"model"`` and ``"primitive"`` build each chain from :class:`~.dsp48.Dsp48MulAdd`
    slices (``(D + A)·B + PCIN``: the pre-adder forms ``w1·2^k + w0`` from ``A = w1·2^k``,
    ``D = w0``), modelled in logic or instantiated as ``DSP48E2`` (the ``kr260`` bitstream).
    All three are cycle- and bit-identical; the slice's input register takes the place of the
    step register, so the latency does not change.

    Latency: ``3 + log2(lanes) + rows / scalers`` cycles from the ``last`` step to
    ``o.valid``, ``+ chain − log2(chain)`` with a chain. Throughput: one step per cycle. The
    whole pipeline stalls (``i.ready`` low) only while a result waits on ``o.ready``.
    """

    def __init__(self, rows: int = 16, lanes: int = 16, group: int = GROUP_SIZE,
                 chain: int = 1, dsp: str = "fabric"):
        if rows % 2 or group % lanes:
            raise ValueError("rows must be even and lanes must divide the group")
        if lanes % chain or chain & (chain - 1):
            raise ValueError("chain must be a power of 2 dividing lanes")
        if dsp not in ("fabric", "model", "primitive") or (dsp != "fabric" and chain < 2):
            raise ValueError("dsp must be 'fabric', or 'model'/'primitive' with chain > 1")
        self.rows, self.lanes, self.group, self.chain = rows, lanes, group, chain
        self.dsp = dsp
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
        prod_w = k + 4 + XQ.width + 1             # 9-bit activations (``ua``)
        v2, g2, l2 = Signal(), Signal(), Signal()
        sc2 = Signal(R * SCALE_MANT_BITS)
        with m.If(en):
            m.d.sync += [v2.eq(v1), g2.eq(s1.glast & v1), l2.eq(s1.last & v1), sc2.eq(s1.scale)]
        gbits = group_sum_bits(self.group)
        pacc_w = k + gbits + 1
        # one chain per row pair in DSP slices: its last slice also keeps the packed group
        # accumulator (P ← M + PCIN + P), so the fabric adds nothing per step
        fold = self.dsp != "fabric" and C == L
        acc_slices = []
        if self.dsp == "fabric":
            level = self._fabric_products(m, en, s1, prod_w)
        else:
            level = self._dsp_chains(m, en, prod_w, acc_slices if fold else None, pacc_w)
        vt, gt, lt, sct = v2, g2, l2, sc2
        width = prod_w + (C - 1).bit_length()

        def delay_flags(vt, gt, lt, sct):
            nv, ng, nl, nsc = Signal(), Signal(), Signal(), Signal(R * SCALE_MANT_BITS)
            with m.If(en):
                m.d.sync += [nv.eq(vt), ng.eq(gt), nl.eq(lt), nsc.eq(sct)]
            return nv, ng, nl, nsc

        if C > 1:
            for _ in range(C):
                v_pre, g_pre = vt, gt          # the flags of the step in the last P stage
                vt, gt, lt, sct = delay_flags(vt, gt, lt, sct)
        if fold:
            fresh_p = Signal(init=1)           # the step in the last P stage starts a group
            with m.If(en & v_pre):
                m.d.sync += fresh_p.eq(g_pre)
            for sl in acc_slices:
                m.d.comb += [sl.ce_p.eq(en & v_pre), sl.acc.eq(~fresh_p)]

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

        # packed group accumulator (in the chains' last slices when ``fold``)
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
                    if fold:
                        m.d.comb += new.eq(sums[p])
                    else:
                        m.d.comb += new.eq(sums[p] + Mux0(fresh, pacc[p]))
                        m.d.sync += pacc[p].eq(new)
                    with m.If(gt):
                        # new = high·2^k + low with low = sext(new[:k]): high = ⌊new / 2^k⌋
                        # + the sign bit of low (an increment, not a full-width subtraction)
                        low = new[:k].as_signed()
                        high = new[k:].as_signed() + new[k - 1]
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

    def _skewed(self, m, en, src, l_):
        """Lane ``l_``'s weight nibbles (rows 0..R−1) and 9-bit activation (sign- or, with
        ``ua``, zero-extended) from the step ``src``, delayed ``l_ mod chain`` cycles (a
        chain's skew). The skew stages stay flip-flops (``keep``, ``shreg_extract = "no"``),
        not SRL shift registers: LUTs bind on the K26, flip-flops do not (docs/node.md §11)."""
        R, L = self.rows, self.lanes
        wv = Cat(*[src.w[(r * L + l_) * 4:(r * L + l_) * 4 + 4] for r in range(R)])
        a8 = src.a[l_ * 8:l_ * 8 + 8]
        av = Cat(a8, a8[7] & ~src.ua)             # 9 bits: sign- or zero-extended (``ua``)
        ff = {"keep": 1, "shreg_extract": "no"}
        for d in range(l_ % self.chain):
            wd = Signal(len(wv), name=f"wskew{l_}_{d}", reset_less=True, attrs=ff)
            ad = Signal(9, name=f"askew{l_}_{d}", reset_less=True, attrs=ff)
            with m.If(en):
                m.d.sync += [wd.eq(wv), ad.eq(av)]
            wv, av = wd, ad
        return wv, av

    def _fabric_products(self, m, en, s1, prod_w):
        """Stage 2 in logic: packed products ``(w1·2^k + w0)·a`` (one 24×8 multiply each, which
        synthesis maps to a DSP), then, with a chain, the registered post-adder chains
        ``sum_j = prod_j + sum_{j−1}``. Returns per row pair the chain outputs (or the lanes)."""
        R, L, k, C = self.rows, self.lanes, self.k, self.chain
        P = R // 2
        lanes = [self._skewed(m, en, s1, l_) for l_ in range(L)]
        prods = [[Signal(signed(prod_w), name=f"p{p}_{l_}") for l_ in range(L)] for p in range(P)]
        with m.If(en):
            for p in range(P):
                for l_, (wv, av) in enumerate(lanes):
                    # w1·2^k + w0 built as a concatenation (sext(w0) below, w1 − sign(w0)
                    # above) so synthesis sees one 24×8 multiply, not two distributed ones
                    w0 = wv[2 * p * 4:2 * p * 4 + 4].as_signed()
                    w1 = wv[(2 * p + 1) * 4:(2 * p + 1) * 4 + 4].as_signed()
                    lo = Signal(signed(k), name=f"pk_lo{p}_{l_}")
                    hi = Signal(signed(WEIGHT.width + 1), name=f"pk_hi{p}_{l_}")
                    m.d.comb += [lo.eq(w0), hi.eq(w1 - w0[WEIGHT.width - 1])]
                    m.d.sync += prods[p][l_].eq(Cat(lo, hi).as_signed() * av.as_signed())
        if C == 1:
            return prods
        width = prod_w + (C - 1).bit_length()

        def link(p, q, j, prev):
            s_ = Signal(signed(width), name=f"ch{p}_{q}_{j}")
            with m.If(en):
                m.d.sync += s_.eq(prods[p][q * C + j] if prev is None
                                  else prods[p][q * C + j] + prev)
            return s_
        return self._chains(link, lambda p, q, last: last)

    def _chains(self, link, tail):
        """Per row pair ``p`` and chain ``q``: ``link(p, q, j, prev)`` builds lane ``j`` of the
        chain from the previous lane's result (``None`` for the first); ``tail(p, q, last)``
        gives the chain's output. Returns ``[[output of chain q] for each row pair p]``."""
        C = self.chain
        out = []
        for p in range(self.rows // 2):
            outs = []
            for q in range(self.lanes // C):
                prev = None
                for j in range(C):
                    prev = link(p, q, j, prev)
                outs.append(tail(p, q, prev))
            out.append(outs)
        return out

    def _dsp_chains(self, m, en, prod_w, acc_slices=None, acc_w=0):
        """Stage 2 in DSP slices: lane ``l`` of a chain takes the step straight from ``i``
        (skewed ``l mod chain`` cycles; the slice's input register is the step register),
        ``A = w1·2^k``, ``D = w0``, ``B = a``; ``PCIN`` from the previous lane. Returns per row
        pair the chain outputs, ``prod_w + log2(chain)`` bits of the last slice's P. With
        ``acc_slices`` (a list, filled here) each chain's last slice accumulates (the caller
        drives its ``acc``/``ce_p``) and ``acc_w`` bits of its P are returned."""
        L, k, C = self.lanes, self.k, self.chain
        width = acc_w if acc_slices is not None else prod_w + (C - 1).bit_length()
        lanes = [self._skewed(m, en, self.i.payload, l_) for l_ in range(L)]

        def link(p, q, j, prev):
            wv, av = lanes[q * C + j]
            last = acc_slices is not None and j == C - 1
            sl = Dsp48MulAdd(cascade=prev is not None, primitive=self.dsp == "primitive",
                             accumulate=last)
            if last:
                acc_slices.append(sl)
            m.submodules[f"dsp{p}_{q * C + j}"] = sl
            m.d.comb += [sl.ce.eq(en),
                         sl.a.eq(wv[(2 * p + 1) * 4:(2 * p + 2) * 4].as_signed() << k),
                         sl.d.eq(wv[2 * p * 4:2 * p * 4 + 4].as_signed()),
                         sl.b.eq(av.as_signed())]
            if prev is not None:
                m.d.comb += sl.pcin.eq(prev.pcout)
            return sl

        def tail(p, q, last):
            out = Signal(signed(width), name=f"ch{p}_{q}")
            m.d.comb += out.eq(last.pcout[:width].as_signed())
            return out
        return self._chains(link, tail)


def Mux0(sel_zero, value):
    """``0`` when ``sel_zero`` else ``value`` (an accumulator restart)."""
    return Mux(sel_zero, 0, value)
