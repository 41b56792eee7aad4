"""KV emitter of the prefill path (paper §5: "the compute engine outputs KV-cache chunks"):
requantises a new chunk's K/V rows (ACT codes from the QKV projection) to INT4 and serialises
them as a KV block payload of :mod:`mcf.abi.kv` for the packetizer.

PER_TOKEN (default): :func:`mcf.abi.kv.quantize_kv_rows` bit for bit (row absmax, reciprocal by
:class:`~mcf.hdl.compute.recip.Recip`, no divider); payload :func:`mcf.abi.kv.pack_kv_block`.
PER_CHANNEL_K (issue #10 §5): K per channel over groups of ``KV_GROUP`` tokens
(:func:`mcf.abi.kv.quantize_k_channels`, the same arithmetic on columns), V per token; payload
:func:`mcf.abi.kv.pack_kv_channel_block`.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.framing import beat_layout
from mcf.abi.kv import KV_ELEM, KV_SCALE, KVQ_SCALE_SHIFT, kv_token_bytes, kvq_scale_mult
from mcf.abi.kv_channel import KV_GROUP, KVFormat, kv_group_header_bytes
from mcf.abi.meta import META
from mcf.abi.quant import ACT
from mcf.abi.softmax import RECIP_FRAC, RECIP_IN_BITS

from .attn_out import WordPacker
from .kvq_emit import KvqGroupEmit
from .kvq_scale import HALF, KVQ_LANES, KvqChannelParams, KvqScaleUnit, kvq_par_layout
from .recip import Recip

__all__ = ["KVQuantizer", "kvq_in_layout", "KVQ_LANES"]


def kvq_in_layout(kv_format: KVFormat = KVFormat.PER_TOKEN) -> data.StructLayout:
    """Input beat: :data:`KVQ_LANES` ACT codes (element ``i`` in bits ``[32i, 32i+32)``);
    ``last`` on the final beat of the block's last token. PER_CHANNEL_K adds ``hdr``: a block
    that starts with ``head_dim / 4`` beats with ``hdr = 1`` (four KV_SCALE codes each, in the
    low 16 bits of the lanes, channel ``4j + i`` in lane ``i`` of beat ``j``) is an **open
    group** against that header (:func:`mcf.abi.kv.quantize_k_open`)."""
    fields = {"data": unsigned(KVQ_LANES * ACT.width), "last": unsigned(1)}
    if KVFormat(kv_format) == KVFormat.PER_CHANNEL_K:
        fields["hdr"] = unsigned(1)
    return data.StructLayout(fields)


class KVQuantizer(wiring.Component):
    """ACT K/V rows → INT4 KV block payload, in one of the two KV formats
    (:class:`mcf.abi.kv.KVFormat`, a construction parameter; PER_TOKEN is the default).

    Members
    -------
    i : In(stream.Signature(kvq_in_layout(kv_format)))
        Per token its K row, then its V row, ``head_dim / 4`` beats each; ``last`` on the final
        beat of the block's last token. PER_CHANNEL_K: a block may start with ``head_dim / 4``
        ``hdr`` beats (the previous closed group's channel scales): it is then an **open
        group** (decode residual, :func:`mcf.abi.kv.quantize_k_open`).
    i_meta : In(stream.Signature(META))
        The block's packet metadata from MARS (``length`` = :func:`mcf.abi.kv.kv_token_bytes`
        · tokens, or :func:`mcf.abi.kv.kv_channel_block_bytes` in PER_CHANNEL_K), one word per
        block, taken before the block's first token.
    o_meta : Out(stream.Signature(META))
        The same word, forwarded unchanged to the packetizer's metadata stream, so metadata and
        payload stay paired in order.
    o : Out(stream.Signature(beat_layout(data_width)))
        The block payload, ``keep`` on the final beat, ``last`` at the end of the block.
        PER_TOKEN: token-major records ``sk, sv, K, V`` (:func:`mcf.abi.kv.pack_kv_block`).
        PER_CHANNEL_K: per group of ``group`` tokens (the last one of a block may be shorter) a
        header of ``head_dim`` K-channel scales, then the group's records ``KV_ONE, sv, K, V``
        (:func:`mcf.abi.kv.pack_kv_channel_block`).
    tokens, blocks : Out(32); groups : Out(32), PER_CHANNEL_K only
        Counters (token records, blocks, per-channel groups).
        ``scale_sat`` : Out(16): rows (V; K too in PER_TOKEN) or K channels (PER_CHANNEL_K)
        whose scale saturated (absmax > 7 · max scale). ``len_err`` : Out(16): blocks whose
        payload length differs from ``meta.length`` (the packet is still sent; the NIC parser
        drops and counts a malformed packet). The CSR view is
        :func:`mcf.abi.kv.kvq_status_layout` (same names, zero-extended).

    Throughput, PER_TOKEN: ``head_dim/2`` cycles to take a token's two rows, ~12 cycles for the
    two scales, then its ``2 + head_dim/2`` 16-bit units: a scale unit per cycle, a code unit
    per 4 cycles (one code per cycle through one multiplier and one rounding shift: ``2 +
    2·head_dim`` cycles a token); the next token is taken after the current one is emitted.
    PER_CHANNEL_K: the group's rows are buffered (``head_dim/2`` cycles per token, channel
    absmax updated per K beat), then ``head_dim + 4`` cycles for the channel scales (one
    channel per cycle through the shared :class:`~mcf.hdl.compute.recip.Recip`), ``head_dim``
    header units, and per token ~5 cycles
    for its V scale plus ``2 + head_dim/2`` units; the next group is taken after the current
    one is emitted. An open group adds ``head_dim/4`` header beats, ``head_dim + 4`` cycles for
    the header's reciprocals, ``head_dim/4`` cycles per token for the in-place prescale and ~5
    for its K scale. Output stream rules as the engine's.

    Structure (PER_CHANNEL_K): this component receives the group and sequences the channel
    scales; :class:`~.kvq_scale.KvqScaleUnit` (absmax → scale, reciprocal),
    :class:`~.kvq_scale.KvqChannelParams` (per-channel parameter pipeline) and
    :class:`~.kvq_emit.KvqGroupEmit` (header, token scales, records, open-group prescale).
    """

    def __init__(self, head_dim: int = 128, data_width: int = 64, out_fifo_depth: int = 16,
                 kv_format: KVFormat = KVFormat.PER_TOKEN, group: int = KV_GROUP):
        if head_dim % (2 * KVQ_LANES):
            raise ValueError("head_dim must be a multiple of 8")
        if data_width % 32:
            raise ValueError("data_width must be a multiple of 32")
        if group < 1:
            raise ValueError("group must be at least 1")
        self.head_dim, self.data_width, self.out_fifo_depth = head_dim, data_width, out_fifo_depth
        self.kv_format, self.group = KVFormat(kv_format), group
        ports = {
            "i_meta": In(stream.Signature(META)),
            "o_meta": Out(stream.Signature(META)),
            "i": In(stream.Signature(kvq_in_layout(kv_format))),
            "o": Out(stream.Signature(beat_layout(data_width))),
            "tokens": Out(32),
            "blocks": Out(32),
            "scale_sat": Out(16),
            "len_err": Out(16),
        }
        if self.kv_format == KVFormat.PER_CHANNEL_K:
            ports["groups"] = Out(32)
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        if self.kv_format == KVFormat.PER_CHANNEL_K:
            pk = self._elaborate_channel(m)
        else:
            pk = self._elaborate_token(m)
        wiring.connect(m, pk.o, wiring.flipped(self.o))
        return m

    def _elaborate_token(self, m):
        """PER_TOKEN: one token at a time (the format of :mod:`mcf.abi.kv`)."""
        D, NL = self.head_dim, KVQ_LANES
        RB = D // NL                     # beats per row
        AW = ACT.width
        m.submodules.buf = buf = Memory(shape=unsigned(NL * AW), depth=2 * RB, init=[])
        wr, rd = buf.write_port(), buf.read_port()
        m.submodules.recip = recip = Recip()

        absmax = Array(Signal(AW, name=f"absmax{r}") for r in range(2))
        scale = Array(Signal(KV_SCALE.width, name=f"scale{r}") for r in range(2))
        rmul = Array(Signal(RECIP_IN_BITS + 4, name=f"rmul{r}") for r in range(2))
        rsh = Array(Signal(range(64), name=f"rsh{r}") for r in range(2))
        cnt = Signal(range(2 * RB + 1))
        blk_last = Signal()
        row = Signal()                   # 0: K, 1: V (scale computation / emission)
        wait = Signal(3)

        ip = self.i.payload
        beat_max = Signal(AW)
        mags = [Mux(e.as_signed() < 0, -e.as_signed(), e.as_signed())[:AW]
                for e in (ip.data[k * AW:(k + 1) * AW] for k in range(NL))]
        cur = Mux(cnt >= RB, absmax[1], absmax[0])
        m.d.comb += beat_max.eq(cur)
        for mag in mags:
            mx = Signal(AW)
            m.d.comb += mx.eq(Mux(mag > beat_max, mag, beat_max))
            beat_max = mx

        # scale and reciprocal of the current row's absmax
        a = absmax[row]
        lead = Signal(range(AW + 1))
        for b in range(AW):
            with m.If(a[b]):
                m.d.comb += lead.eq(b + 1)            # bit length
        norm = ((a << RECIP_IN_BITS) >> lead)[:RECIP_IN_BITS]    # truncating normalisation
        m.d.comb += recip.x.eq(Mux(a == 0, 1 << (RECIP_IN_BITS - 1), norm))
        s_full = (a * kvq_scale_mult() + (1 << (KVQ_SCALE_SHIFT - 1))) >> KVQ_SCALE_SHIFT

        # emission pipeline: issue → e1 (buffer word) → e2 (a lane's product) → e3 (halfword)
        # → FIFO. A code unit (a buffer word: NL codes) is issued NL times, one lane each: one
        # product and one rounding shift, its codes gathered in ``asm`` (the NL shifters of a
        # unit per cycle were ~3.8k LUT; the emitter's rate is far above what it serves)
        m.submodules.packer = pk = WordPacker(self.data_width, self.out_fifo_depth, HALF)
        unit = Signal(range(2 + 2 * RB + 1))
        ln = Signal(range(NL))                        # the lane of a code unit issued
        e_issue = Signal()
        e1 = Signal()
        e1_kind = Signal(2)
        e1_row = Signal()
        e1_last = Signal()
        e1_ln = Signal.like(ln)
        e1_done = Signal()                            # the issue completes its unit
        e2 = Signal()
        e2_kind = Signal(2)
        e2_last = Signal()
        e2_ln = Signal.like(ln)
        e2_done = Signal()
        e2_p = Signal(signed(AW + RECIP_IN_BITS + 5))
        e2_sh = Signal(range(64))
        e2_zero = Signal()
        e2_sc = Signal(HALF)
        e3 = Signal()
        e3_val = Signal(HALF)
        e3_last = Signal()
        asm = Signal(HALF)                            # the unit's codes of lanes 0 .. NL−2
        space = pk.level <= self.out_fifo_depth - 4
        last_unit = unit == 2 + 2 * RB - 1
        unit_done = Signal()
        m.d.comb += unit_done.eq((unit < 2) | (ln == NL - 1))
        # unit 0: sk, 1: sv, 2..: K row words then V row words (one buffer word = 4 codes)
        m.d.comb += rd.addr.eq(unit - 2)
        m.d.sync += [
            e1.eq(e_issue), e1_kind.eq(Mux(unit < 2, unit, 2)),
            e1_row.eq(unit >= 2 + RB), e1_last.eq(last_unit & blk_last & unit_done),
            e1_ln.eq(ln), e1_done.eq(unit_done),
        ]
        e1_rm = rmul[e1_row]
        m.d.sync += [e2.eq(e1), e2_kind.eq(e1_kind), e2_last.eq(e1_last),
                     e2_ln.eq(e1_ln), e2_done.eq(e1_done),
                     e2_sh.eq(rsh[e1_row]), e2_zero.eq(absmax[e1_row] == 0),
                     e2_sc.eq(Mux(e1_kind == 0, scale[0], scale[1])),
                     e2_p.eq(rd.data.word_select(e1_ln, AW).as_signed() * e1_rm)]
        q = (e2_p + ((Const(1, 64) << e2_sh) >> 1)) >> e2_sh
        lo, hi = KV_ELEM.min_int, KV_ELEM.max_int
        code = Signal(KV_ELEM.width)
        m.d.comb += code.eq(Mux(e2_zero, 0, Mux(q > hi, hi, Mux(q < lo, lo, q))))
        with m.If(e2 & (e2_kind == 2)):
            m.d.sync += asm.word_select(e2_ln, KV_ELEM.width).eq(code)
        m.d.sync += [e3.eq(e2 & e2_done), e3_last.eq(e2_last),
                     e3_val.eq(Mux(e2_kind == 2,
                                   Cat(asm[:HALF - KV_ELEM.width], code), e2_sc))]
        m.d.comb += [pk.i.payload.eq(Cat(e3_val, e3_last)), pk.i.valid.eq(e3)]
        busy = e1 | e2 | e3

        blk_len, blk_bytes = self._blk_counters()
        with m.FSM(name="kvq"):
            self._meta_state(m, blk_len, blk_bytes)
            with m.State("RECV"):
                m.d.comb += [self.i.ready.eq(1), wr.addr.eq(cnt), wr.data.eq(ip.data)]
                with m.If(self.i.valid):
                    m.d.comb += wr.en.eq(1)
                    with m.If(cnt >= RB):
                        m.d.sync += absmax[1].eq(beat_max)
                    with m.Else():
                        m.d.sync += absmax[0].eq(beat_max)
                    m.d.sync += cnt.eq(cnt + 1)
                    with m.If(cnt == 2 * RB - 1):
                        m.d.sync += [blk_last.eq(ip.last), row.eq(0), wait.eq(0), cnt.eq(0)]
                        m.next = "SCALE"
            with m.State("SCALE"):
                m.d.sync += wait.eq(wait + 1)
                with m.If(wait == Recip.LATENCY):
                    over = s_full > KV_SCALE.max_int
                    m.d.sync += [
                        scale[row].eq(Mux(over, KV_SCALE.max_int, Mux(s_full < 1, 1, s_full))),
                        rmul[row].eq(recip.r * KV_ELEM.max_int),
                        rsh[row].eq(RECIP_FRAC - RECIP_IN_BITS + lead),
                        row.eq(~row), wait.eq(0),
                    ]
                    with m.If(over):
                        m.d.sync += self.scale_sat.eq(self.scale_sat + 1)
                    with m.If(row == 1):
                        m.d.sync += unit.eq(0)
                        m.next = "EMIT"
            with m.State("EMIT"), m.If(space):
                m.d.comb += e_issue.eq(1)
                m.d.sync += ln.eq(ln + 1)
                with m.If(unit_done):
                    m.d.sync += [unit.eq(unit + 1), ln.eq(0)]
                    with m.If(last_unit):
                        m.next = "DRAIN"
            with m.State("DRAIN"), m.If(~busy):
                nbytes = blk_bytes + kv_token_bytes(D)
                m.d.sync += [absmax[0].eq(0), absmax[1].eq(0), blk_bytes.eq(nbytes),
                             self.tokens.eq(self.tokens + 1)]
                self._unit_done(m, nbytes, blk_last, blk_len)
        return pk

    def _elaborate_channel(self, m):
        """PER_CHANNEL_K: buffer a group's rows (channel absmax per K beat, row absmax per V
        row), compute the channel scales one channel per cycle (:class:`KvqChannelParams`),
        then emit the group (:class:`KvqGroupEmit`: header, per token its V scale and record).
        A block that starts with header beats is an open group: the header's reciprocals are
        computed first, the group's K rows are prescaled in place after arrival, and the
        records carry per-token K scales."""
        D, NL, G = self.head_dim, KVQ_LANES, self.group
        RB = D // NL                     # beats per row
        TW = 2 * RB                      # buffer words per token (K row, V row)
        AW = ACT.width
        PW = kvq_par_layout().size       # per-channel parameters: rmul, rsh, zero
        LB = (NL - 1).bit_length()
        m.submodules.buf = buf = Memory(shape=unsigned(NL * AW), depth=G * TW, init=[])
        wr, rd = buf.write_port(), buf.read_port()
        m.submodules.cabs = cabs = Memory(shape=unsigned(NL * AW), depth=RB, init=[])
        cabs_w, cabs_r = cabs.write_port(), cabs.read_port(domain="comb")
        m.submodules.vabs = vabs = Memory(shape=unsigned(AW), depth=G, init=[])
        vabs_w, vabs_r = vabs.write_port(), vabs.read_port(domain="comb")
        m.submodules.kabs = kabs = Memory(shape=unsigned(AW), depth=G, init=[])
        kabs_w, kabs_r = kabs.write_port(), kabs.read_port(domain="comb")
        m.submodules.cpar = cpar = Memory(shape=unsigned(NL * PW), depth=RB, init=[])
        cpar_w, cpar_r = cpar.write_port(granularity=PW), cpar.read_port()
        m.submodules.csc = csc = Memory(shape=unsigned(NL * HALF), depth=RB, init=[])
        csc_w, csc_r = csc.write_port(granularity=HALF), csc.read_port()
        csc_rc = csc.read_port(domain="comb")
        m.submodules.scale = su = KvqScaleUnit()
        m.submodules.chan = cp = KvqChannelParams(D)
        m.submodules.emit = em = KvqGroupEmit(D, G)

        cnt = Signal(range(TW))          # receive: beat within the token
        tok = Signal(range(G))           # receive: token within the group
        hcnt = Signal(range(RB))         # receive: header beat
        ntok = Signal(range(G + 1))      # tokens of the group being emitted
        blk_last = Signal()
        opened = Signal()                # this block is an open group (header beats came first)
        first = Signal()                 # next beat is the block's first
        vmax = Signal(AW)                # V row absmax (receive)
        c_iss = Signal(range(D + 1))     # channel pipeline: next channel

        # --- receive: magnitudes of the beat's lanes, channel and V-row maxima
        ip = self.i.payload
        mags = [Mux(e.as_signed() < 0, -e.as_signed(), e.as_signed())[:AW]
                for e in (ip.data[k * AW:(k + 1) * AW] for k in range(NL))]
        old = [cabs_r.data[k * AW:(k + 1) * AW] for k in range(NL)]
        new_c = [Mux((tok == 0) | (mag > o), mag, o) for mag, o in zip(mags, old)]
        vnew = Mux(cnt == RB, 0, vmax)
        for mag in mags:
            mx = Signal(AW)
            m.d.comb += mx.eq(Mux(mag > vnew, mag, vnew))
            vnew = mx

        # --- shared scale unit: channel absmax (CHAN), header scale (OCHAN: its reciprocal for
        # the prescale), or the emitted token's K / V row absmax (emission)
        in_chan, in_ochan = Signal(), Signal()
        a_lane = Array(cabs_r.data[k * AW:(k + 1) * AW] for k in range(NL))[c_iss[:LB]]
        h_lane = Array(csc_rc.data[k * HALF:(k + 1) * HALF] for k in range(NL))[c_iss[:LB]]
        m.d.comb += [vabs_r.addr.eq(em.etok), kabs_r.addr.eq(em.etok),
                     csc_rc.addr.eq(c_iss >> LB),
                     su.a.eq(Mux(in_chan, a_lane, Mux(in_ochan, h_lane,
                                                      Mux(em.which, vabs_r.data, kabs_r.data))))]
        # channel pipeline: issue channel c_iss, its parameters written LATENCY cycles later
        m.d.comb += [cp.issue.eq((in_chan | in_ochan) & (c_iss < D)), cp.chan.eq(c_iss),
                     cp.opened.eq(opened),
                     cpar_w.addr.eq(cp.par_addr), cpar_w.data.eq(cp.par_data),
                     cpar_w.en.eq(cp.par_en)]
        for n in ("lead", "sc", "over", "zero", "r", "rmul"):
            m.d.comb += getattr(cp, n).eq(getattr(su, n))
        with m.If(cp.sc_we):
            m.d.comb += [csc_w.addr.eq(cp.sc_addr), csc_w.data.eq(cp.sc_data),
                         csc_w.en.eq(cp.sc_en)]
        with m.If(cp.sat | em.sat):
            m.d.sync += self.scale_sat.eq(self.scale_sat + 1)

        # --- emission (and the open group's prescale) into the unit FIFO
        m.submodules.packer = pk = WordPacker(self.data_width, self.out_fifo_depth, HALF)
        for n in ("lead", "sc", "over", "zero", "rmul"):
            m.d.comb += getattr(em, n).eq(getattr(su, n))
        m.d.comb += [em.ntok.eq(ntok), em.blk_last.eq(blk_last), em.opened.eq(opened),
                     rd.addr.eq(em.rd_addr), csc_r.addr.eq(em.csc_addr),
                     cpar_r.addr.eq(em.par_addr), em.rd_data.eq(rd.data),
                     em.hdr_data.eq(csc_r.data), em.par_data.eq(cpar_r.data),
                     em.space.eq(pk.level <= self.out_fifo_depth - 4),
                     pk.i.payload.eq(em.w_data), pk.i.valid.eq(em.w_en)]

        blk_len, blk_bytes = self._blk_counters()
        with m.FSM(name="kvq"):
            self._meta_state(m, blk_len, blk_bytes, tok.eq(0), cnt.eq(0), hcnt.eq(0),
                             opened.eq(0), first.eq(1))
            with m.State("RECV"):
                m.d.comb += [self.i.ready.eq(1), wr.addr.eq(tok * TW + cnt), wr.data.eq(ip.data),
                             cabs_r.addr.eq(cnt), cabs_w.addr.eq(cnt), cabs_w.data.eq(Cat(*new_c))]
                # header beat (open group): 4 scale codes in the lanes' low 16 bits; taken only
                # before the block's first token (a later one is dropped)
                with m.If(self.i.valid & ip.hdr & (first | (hcnt != 0))):
                    m.d.comb += [csc_w.addr.eq(hcnt), csc_w.en.eq((1 << NL) - 1),
                                 csc_w.data.eq(Cat(*[ip.data[k * AW:k * AW + HALF]
                                                     for k in range(NL)]))]
                    m.d.sync += [hcnt.eq(hcnt + 1), first.eq(0)]
                    with m.If(hcnt == RB - 1):
                        m.d.sync += [hcnt.eq(0), opened.eq(1), c_iss.eq(0)]
                        m.next = "OCHAN"
                with m.Elif(self.i.valid & ~ip.hdr):
                    m.d.comb += [wr.en.eq(1), cabs_w.en.eq(cnt < RB)]
                    m.d.sync += [cnt.eq(cnt + 1), first.eq(0)]
                    with m.If(cnt >= RB):
                        m.d.sync += vmax.eq(vnew)
                    with m.If(cnt == TW - 1):
                        m.d.comb += [vabs_w.addr.eq(tok), vabs_w.data.eq(vnew), vabs_w.en.eq(1)]
                        m.d.sync += [cnt.eq(0), tok.eq(tok + 1)]
                        with m.If(ip.last | (tok == G - 1)):
                            m.d.sync += [ntok.eq(tok + 1), blk_last.eq(ip.last), tok.eq(0),
                                         c_iss.eq(0)]
                            with m.If(opened):
                                m.d.comb += [em.start.eq(1), em.pre.eq(1)]
                                m.next = "EMIT"
                            with m.Else():
                                m.next = "CHAN"
            with m.State("OCHAN"):
                m.d.comb += in_ochan.eq(1)
                with m.If(c_iss < D):
                    m.d.sync += c_iss.eq(c_iss + 1)
                with m.Elif(~cp.busy):
                    m.next = "RECV"
            with m.State("CHAN"):
                m.d.comb += [in_chan.eq(1), cabs_r.addr.eq(c_iss >> LB)]
                with m.If(c_iss < D):
                    m.d.sync += c_iss.eq(c_iss + 1)
                with m.Elif(~cp.busy):
                    m.d.comb += em.start.eq(1)
                    m.next = "EMIT"
            with m.State("EMIT"), m.If(em.done):
                m.next = "DRAIN"
            with m.State("DRAIN"), m.If(~em.busy):
                nbytes = blk_bytes + kv_group_header_bytes(D) + ntok * kv_token_bytes(D)
                m.d.sync += [blk_bytes.eq(nbytes), self.tokens.eq(self.tokens + ntok),
                             self.groups.eq(self.groups + 1)]
                self._unit_done(m, nbytes, blk_last, blk_len)
        wb = em.wb                       # the prescaled K words, written back in place
        with m.If(wb.valid):
            m.d.comb += [wr.addr.eq(wb.addr), wr.data.eq(wb.data), wr.en.eq(1)]
            with m.If(wb.lastw):
                m.d.comb += [kabs_w.addr.eq(wb.tok), kabs_w.data.eq(wb.kmax), kabs_w.en.eq(1)]
        return pk

    def _blk_counters(self):
        """(``blk_len``, ``blk_bytes``): the block's ``Meta.length`` and the bytes emitted."""
        blk_len = Signal.like(self.i_meta.payload.length)
        return blk_len, Signal(len(blk_len) + 8, name="blk_bytes")

    def _meta_state(self, m, blk_len, blk_bytes, *resets):
        """The ``META`` state: pass the block's Meta through, latch its length, clear the byte
        count (and ``resets``), then receive."""
        with m.State("META"):
            m.d.comb += [self.o_meta.payload.eq(self.i_meta.payload),
                         self.o_meta.valid.eq(self.i_meta.valid),
                         self.i_meta.ready.eq(self.o_meta.ready)]
            with m.If(self.i_meta.valid & self.o_meta.ready):
                m.d.sync += [blk_len.eq(self.i_meta.payload.length), blk_bytes.eq(0), *resets]
                m.next = "RECV"

    def _unit_done(self, m, nbytes, blk_last, blk_len):
        """End of a token (PER_TOKEN) or group (PER_CHANNEL_K) in the ``DRAIN`` state: at the
        block's end count it, check its ``nbytes`` against ``meta.length`` and take the next
        Meta; otherwise receive the next unit."""
        with m.If(blk_last):
            m.d.sync += self.blocks.eq(self.blocks + 1)
            with m.If(nbytes != blk_len):
                m.d.sync += self.len_err.eq(self.len_err + 1)
            m.next = "META"
        with m.Else():
            m.next = "RECV"
