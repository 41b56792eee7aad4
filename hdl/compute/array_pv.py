"""P·V of prefill attention on the GEMM's arrays (issue #33; paper §3.1, §5;
docs/attention.md "The arrays' attention products"): :class:`~.tile_pv.TilePV`'s P rows and
output, computed by ``arrays`` token-parallel :class:`~.gemm_array.GemmArray` (an
:class:`~.array_bank.ArrayBank`) on V as weight words — four P rows against one V word per step,
their unsigned P8 activations zero-extended (``ua``)."""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.attn_tile import (
    P8,
    PV_LIMB_BITS,
    PV_LIMBS,
    PV_SPLIT_KEYS,
    p8_beat_layout,
    pv_out_layout,
    pv_pack_shift,
    pv_sum_bits,
    pv_word_layout,
)
from mcf.abi.kv import KV_ELEM
from mcf.abi.quant import SCALE_MANT_BITS, pack_shift

from .array_bank import ArrayBank
from .array_quads import QuadFlow, at, client_members, client_ports

__all__ = ["ArrayPV"]


class ArrayPV(wiring.Component):
    """``acc = Σ w8·v`` of P8 rows against a KV block's V on ``arrays`` GEMM arrays of
    ``array_rows`` channels × ``lanes`` keys: one beat per row, TilePV's, in the same order.

    Rows run in **quads** of up to ``arrays`` consecutive rows of a block (the block's last
    quad may be short): array ``i`` takes row ``i``'s ``w8`` (``ua`` steps), all take the same V
    word. Per channel group of ``array_rows`` channels one dot product over the block's keys,
    ``lanes`` keys per step, packed groups of ``group`` keys (the arrays' group; scale
    mantissas 1), padded to whole groups with ``w8`` = 0: each array returns its row's exact
    sums of ``array_rows`` channels.

    Buffers: V in two banks of ``max_block`` keys (the next block loads while rows run against
    the current one; a bank is freed when its last quad's results are in); two quad buffers for
    the P rows (a quad fills while the other is issued; freed at its last result) and two for
    the sums (a quad's results while the other is emitted; each array's rows as ``head_dim /
    array_rows`` words of one channel group, read one a cycle into the output beat — a narrow
    memory rather than a row-wide one). Results are never refused.

    Parameters
    ----------
    keys, head_dim, max_block, max_rows : as :class:`~.tile_pv.TilePV`.
    arrays : rows per step; array_rows : channels per dot product (even, divides
    ``head_dim``); lanes : keys per step (a multiple of ``keys``); group : the arrays' group
    (a multiple of ``lanes`` dividing ``max_block``, whose packed P·V sums split exactly:
    ``pv_pack_shift(group) ≤ pack_shift(group)``); chain, dsp : the arrays' lane sums;
    own_arrays : as :class:`~.array_score.ArrayScore`; p_format : :data:`~mcf.abi.attn_tile.P8`
    (``w8`` rows, the default) or :data:`~mcf.abi.attn_tile.PV_W` (today's ``w``: each channel
    group's dot product over one pass per byte ``j`` = 0, 1, 2, the byte's groups with the
    arrays' group scale ``2^(8j)`` — the top byte (4 bits) entered shifted up to 8 bits, its
    scale ``2^12`` — so the arrays' accumulator returns ``Σ 2^(8j)·acc_j``, the exact
    :func:`~mcf.abi.attn_tile.pv_w_acc_bits`-bit sum — today's bits,
    :data:`~mcf.abi.attn_tile.PV_LIMBS` times the steps; a quad whose rows carry ``p8`` runs
    byte 0 only: its ``w8``, P8's steps and sums, ``s`` passed on).

    Members
    -------
    v : In(stream.Signature(pv_word_layout(array_rows, lanes, max_block, max_rows)))
        A block's V words in (key step, channel group) order, ``ceil(n / lanes)·head_dim /
        array_rows`` of them, ``n`` and ``rows`` on the last; ready while a bank is free.
    p : In(stream.Signature(p8_beat_layout(keys)))
        P8 rows (TileSoftmax's ``o``), ``ceil(n / keys)`` beats each, against the oldest
        loaded block whose rows are not all taken.
    o : Out(stream.Signature(pv_out_layout(array_rows, max_block)))
        Per row ``head_dim / array_rows`` beats, one per channel group in channel order:
        ``(m_b, l_b, s)`` on each, the group's ``acc``, ``last`` on the row's final one. Rows in
        order; the payload holds until taken.
    st, res : ``own_arrays = False`` only, as :class:`~.array_score.ArrayScore`.

    Rate: a quad takes ``head_dim / array_rows · ceil(n / group) · group / lanes`` array
    cycles (``arrays · array_rows · lanes`` MACs each) and leaves at one beat per cycle (a
    row's ``head_dim / array_rows`` words read asynchronously; 8 at the kr260 shape, against
    the merge's 32 cycles a row at 4 lanes); P rows are taken at one beat per cycle.
    Latency: a quad's first beat leaves the cycle after its last result is in (its steps and
    the arrays' latency after its last P beat).
    """

    def __init__(self, keys: int = 4, head_dim: int = 128, max_block: int = 256,
                 max_rows: int = 64, arrays: int = 4, array_rows: int = 16, lanes: int = 16,
                 group: int = PV_SPLIT_KEYS, chain: int = 1, dsp: str = "fabric",
                 own_arrays: bool = True, p_format=P8):
        pv_sum_bits(1, p_format)
        if array_rows % 2 or head_dim % array_rows:
            raise ValueError("array_rows must be even and divide head_dim")
        if lanes % keys or group % lanes or max_block % group:
            raise ValueError("keys must divide lanes, lanes the group, the group max_block")
        if pv_pack_shift(group) > pack_shift(group):
            raise ValueError(f"a packed P·V group of {group} keys does not split exactly")
        self.keys, self.head_dim, self.max_block, self.max_rows = keys, head_dim, max_block, \
            max_rows
        self.n_arrays, self.array_rows, self.lanes, self.group = arrays, array_rows, lanes, group
        self.own_arrays, self.p_format = own_arrays, p_format
        self.limbs = 1 if p_format == P8 else PV_LIMBS
        self.bank = ArrayBank(arrays, array_rows, lanes, group, chain, dsp) \
            if own_arrays else None
        sig = {
            "v": In(stream.Signature(pv_word_layout(array_rows, lanes, max_block, max_rows))),
            "p": In(stream.Signature(p8_beat_layout(keys, p_format))),
            "o": Out(stream.Signature(pv_out_layout(array_rows, max_block, p_format))),
        }
        if not own_arrays:
            sig.update(client_members(arrays, array_rows, lanes))
        super().__init__(sig)

    def elaborate(self, platform):
        m = Module()
        K, D, A, AR, L, G = (self.keys, self.head_dim, self.n_arrays, self.array_rows,
                             self.lanes, self.group)
        CG = D // AR                                  # channel groups (dot products per row)
        KS = self.max_block // L                      # key steps of a bank
        NWB = KS * CG                                 # V words of a bank
        spg = G // L                                  # steps per packed group
        KPS = L // K                                  # P beats per step
        CB = pv_sum_bits(self.max_block, self.p_format)   # the row's sum
        J, FW = self.limbs, self.p_format.width       # passes per channel group; P bits
        # PV_W: byte j of w enters the arrays with group scale 2^(8j), the top byte (its
        # FW − top bits) shifted up to 8 bits and its scale down as much
        top = PV_LIMB_BITS * (J - 1)
        limb_scales = [1 << (PV_LIMB_BITS * j) for j in range(J - 1)] + [
            1 << (top - (PV_LIMB_BITS - (FW - top)))]
        if J > 1 and (FW - top > PV_LIMB_BITS or max(limb_scales) >> SCALE_MANT_BITS):
            raise ValueError("PV_W's bytes do not fit the arrays' 16-bit group scales")
        st, res = client_ports(m, self)
        p, o = self.p, self.o
        meta_l = data.StructLayout({"m": p.payload.m.shape(), "l": p.payload.l.shape(),
                                    "s": p.payload.s.shape()})
        # PV_W: a quad in P8 (its rows' p8: the tiled prefill) takes byte 0 only
        qf = QuadFlow(m, A, self.max_rows, self.max_block, meta_l,
                      {"p8": 1} if J > 1 else None)

        # ---- V banks: words in arrival order, (key step, channel group) -----------------------
        wlay = data.ArrayLayout(data.ArrayLayout(signed(KV_ELEM.width), L), AR)
        m.submodules.vmem = vmem = Memory(shape=wlay, depth=2 * NWB, init=[])
        v_wr, v_rd = vmem.write_port(), vmem.read_port()
        qf.load(m, self.v, v_wr, NWB)
        m.d.comb += v_wr.data.eq(self.v.payload.v)

        # ---- quad buffers: the P rows of up to A rows ----------------------------------------
        pmems = []
        for i in range(A):
            pm = Memory(shape=unsigned(L * FW), depth=2 * KS, init=[])
            m.submodules[f"pmem{i}"] = pm
            pmems.append(pm)
        fbeat = Signal(range(self.max_block // K + 1))
        m.d.comb += p.ready.eq(qf.fill_ready)
        take = p.valid & p.ready
        for i, pm in enumerate(pmems):
            wp = pm.write_port(granularity=K * FW)
            m.d.comb += [wp.addr.eq(at(qf.fh, KS, fbeat // KPS if KPS > 1 else fbeat)),
                         wp.data.eq(Cat(*([p.payload.w8.as_value()] * KPS))),
                         wp.en.eq(Mux(take & (qf.fi == i),
                                      1 << (fbeat % KPS) if KPS > 1 else 1, 0))]
        qf.set_meta(m, take & (fbeat == 0), m=p.payload.m, l=p.payload.l, s=p.payload.s)
        with m.If(take):
            m.d.sync += fbeat.eq(Mux(p.payload.last, 0, fbeat + 1))
        qf.fill(m, take, p.payload.last, **({"p8": p.payload.p8} if J > 1 else {}))

        # ---- issue: per channel group and byte of w, the block's key steps (whole groups) -----
        cg = Signal(range(CG))
        jb = Signal(range(max(J, 2)))                       # the byte of w (PV_W), else 0
        ks = Signal(range(KS))
        tag_l = data.StructLayout({"qh": 1, "sh": 1, "cg": range(max(CG, 2)), "qlast": 1})
        m.submodules.tags = tags = fifo.SyncFIFOBuffered(width=tag_l.size, depth=8)
        qi = qf.qinfo[qf.ih]
        nbeats = Signal(range(self.max_block // K + 1))     # P beats of a row
        nsteps = Signal(range(KS + 1))                      # whole groups of steps
        m.d.comb += [nbeats.eq((qi.nkeys + K - 1) // K),
                     nsteps.eq((qi.nkeys + G - 1) // G * spg)]
        qf.start(m, cg, jb, ks)
        adv, go = Signal(), Signal()
        m.d.comb += [adv.eq(~st.valid | st.ready), go.eq(adv & qf.issuing & tags.w_rdy)]
        dend = ks == nsteps - 1
        jlast = (jb == J - 1) | qi.p8 if J > 1 else 1
        jend = dend & jlast
        qend = jend & (cg == CG - 1)
        g_reg, l_reg = Signal(), Signal()
        j_reg = Signal.like(jb)
        live = Signal(KPS)                                  # the step's P beats of the row
        # PV_W: a channel group's bytes are one dot product of the arrays, each byte's groups
        # scaled by its weight 2^(8j) (the arrays' group scales: their accumulator adds the
        # bytes, no adder here); the top byte (W_BITS − 16 bits) goes in shifted up to fill 8
        # bits, its scale down as much, so every scale is a 16-bit mantissa. A P8 quad's one
        # pass is byte 0 (scale 1).
        byte = Mux(qi.p8, 0, jb) if J > 1 else jb
        with m.If(adv):
            m.d.sync += [st.valid.eq(go), l_reg.eq(jend), j_reg.eq(byte),
                         g_reg.eq((ks % spg == spg - 1) if spg > 1 else 1)]
            m.d.sync += [live[q].eq(ks * KPS + q < nbeats) for q in range(KPS)]
        tag_w = Signal(tag_l)
        m.d.comb += [v_rd.en.eq(adv), v_rd.addr.eq(at(qi.bank, NWB, ks * CG + cg)),
                     st.payload.w.eq(v_rd.data), st.payload.glast.eq(g_reg),
                     st.payload.last.eq(l_reg), st.payload.ua.eq(1),
                     tag_w.qh.eq(qf.ih), tag_w.sh.eq(qf.ish), tag_w.cg.eq(cg),
                     tag_w.qlast.eq(qend), tags.w_en.eq(go & jend), tags.w_data.eq(tag_w)]
        scale = Signal(SCALE_MANT_BITS)
        m.d.comb += scale.eq(Array(Const(s_, SCALE_MANT_BITS) for s_ in limb_scales)[j_reg]
                             if J > 1 else 1)
        for r in range(AR):
            m.d.comb += st.payload.scale[r].eq(scale)
        for i, pm in enumerate(pmems):
            rp = pm.read_port()
            m.d.comb += [rp.en.eq(adv), rp.addr.eq(at(qf.ih, KS, ks))]
            lanes_ = []
            for ln in range(L):                       # lane ln's byte j_reg of w (P8: w8)
                wl = rp.data.word_select(ln, FW)
                if J > 1:                             # the top byte shifted up to 8 bits
                    wl = Cat(wl[:top], Const(0, PV_LIMB_BITS - (FW - top)), wl[top:]) \
                        .word_select(j_reg, PV_LIMB_BITS)
                lanes_.append(Mux(live[ln // K], wl, 0))
            m.d.comb += st.payload.a[i].eq(Cat(*lanes_))
        with m.If(go):
            m.d.sync += ks.eq(ks + 1)
            with m.If(dend):
                m.d.sync += [ks.eq(0), jb.eq(jb + 1)]
                with m.If(jend):
                    m.d.sync += [jb.eq(0), cg.eq(cg + 1)]
                    with m.If(qend):
                        m.d.sync += cg.eq(0)
                        qf.issued(m)

        # ---- results: each row's channel group into its sum buffer ---------------------------
        tag = data.View(tag_l, tags.r_data)
        got = res.valid & res.ready
        m.d.comb += [res.ready.eq(1), tags.r_en.eq(got)]
        omems = []
        for i in range(A):
            # a row's sums as CG words of one channel group each (a narrow, deeper memory:
            # LUT-RAM by depth, not by the row's width)
            om = Memory(shape=unsigned(AR * CB), depth=2 * CG, init=[])
            m.submodules[f"omem{i}"] = om
            omems.append(om)
            wo = om.write_port()
            # the group's exact sum (PV_W: Σ_j 2^(8j)·acc_j, added in the arrays), CB bits
            m.d.comb += [wo.addr.eq(at(tag.sh, CG, tag.cg)),
                         wo.data.eq(Cat(*[res.payload[i][r][:CB] for r in range(AR)])),
                         wo.en.eq(got)]
        with m.If(got & tag.qlast):
            qf.resulted(m, tag.qh, tag.sh)
            qi_r = qf.qinfo[tag.qh]
            with m.If(qi_r.blast):                    # V is read at issue only
                m.d.sync += qf.full.bit_select(qi_r.bank, 1).eq(0)

        # ---- emit: a row's CG words, one beat each (read asynchronously) ---------------------
        rc = Signal(range(CG))                        # the row's word (channel group) next out
        rdo = []
        for om in omems:
            ro = om.read_port(domain="comb")
            m.d.comb += ro.addr.eq(at(qf.eh, CG, rc))
            rdo.append(ro.data)
        rgo = qf.sready.bit_select(qf.eh, 1) & (~o.valid | o.ready)
        with m.If(o.valid & o.ready):
            m.d.sync += o.valid.eq(0)
        meta = Signal(meta_l)
        m.d.comb += meta.eq(qf.emit_meta)
        with m.If(rgo):
            m.d.sync += [o.valid.eq(1), o.payload.acc.as_value().eq(Array(rdo)[qf.ei]),
                         o.payload.m.eq(meta.m), o.payload.l.eq(meta.l), o.payload.s.eq(meta.s),
                         o.payload.last.eq(rc == CG - 1), rc.eq(rc + 1)]
            with m.If(rc == CG - 1):
                m.d.sync += rc.eq(0)
                qf.emitted(m)
        return m
