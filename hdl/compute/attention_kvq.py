"""KV emitter of the prefill path (paper §5: "the compute engine outputs KV-cache chunks"):
requantises a new chunk's K/V rows (ACT codes from the QKV projection) to INT4 with per-token
scales and serialises them as the KV block payload of :mod:`mcf.abi.kv` for the packetizer.

Arithmetic: :func:`mcf.abi.kv.quantize_kv_rows` bit for bit (row absmax, reciprocal by
:class:`~mcf.hdl.compute.recip.Recip`, no divider); payload: :func:`mcf.abi.kv.pack_kv_block`.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.framing import beat_layout
from mcf.abi.kv import KV_ELEM, KV_SCALE, KVQ_SCALE_SHIFT, kv_token_bytes, kvq_scale_mult
from mcf.abi.meta import META
from mcf.abi.quant import ACT
from mcf.abi.softmax import RECIP_FRAC, RECIP_IN_BITS

from .recip import Recip

__all__ = ["KVQuantizer", "kvq_in_layout", "KVQ_LANES"]

KVQ_LANES = 4
"""ACT elements per input beat; 4 INT4 codes make one 16-bit unit of the payload."""
HALF = 16


def kvq_in_layout() -> data.StructLayout:
    """Input beat: :data:`KVQ_LANES` ACT codes (element ``i`` in bits ``[32i, 32i+32)``);
    ``last`` on the final beat of the block's last token."""
    return data.StructLayout({"data": unsigned(KVQ_LANES * ACT.width), "last": unsigned(1)})


class KVQuantizer(wiring.Component):
    """ACT K/V rows → INT4 KV block payload.

    Members
    -------
    i : In(stream.Signature(kvq_in_layout()))
        Per token its K row, then its V row, ``head_dim / 4`` beats each; ``last`` on the final
        beat of the block's last token.
    i_meta : In(stream.Signature(META))
        The block's packet metadata from MARS (``length = tokens · kv_token_bytes(head_dim)``),
        one word per block, taken before the block's first token.
    o_meta : Out(stream.Signature(META))
        The same word, forwarded unchanged to the packetizer's metadata stream, so metadata and
        payload stay paired in order.
    o : Out(stream.Signature(beat_layout(data_width)))
        The block payload (``kv_token_bytes(head_dim)`` bytes per token, token-major records
        ``sk, sv, K, V``), ``keep`` on the final beat, ``last`` at the end of the block.
    tokens, blocks : Out(32)
        Counters. ``scale_sat`` : Out(16): rows whose scale saturated (|x| > 7 · max scale).
        ``len_err`` : Out(16): blocks whose payload length differs from ``meta.length`` (the
        packet is still sent; the NIC parser drops and counts a malformed packet).

    Throughput: ``head_dim/2`` cycles to take a token's two rows, ~12 cycles for the two
    scales, then one 16-bit unit per cycle (``2 + head_dim/2`` units per token); the next token
    is taken after the current one is emitted. Output stream rules as the engine's.
    """

    def __init__(self, head_dim: int = 128, data_width: int = 64, out_fifo_depth: int = 16):
        if head_dim % (2 * KVQ_LANES):
            raise ValueError("head_dim must be a multiple of 8")
        if data_width % 32:
            raise ValueError("data_width must be a multiple of 32")
        self.head_dim, self.data_width, self.out_fifo_depth = head_dim, data_width, out_fifo_depth
        super().__init__({
            "i_meta": In(stream.Signature(META)),
            "o_meta": Out(stream.Signature(META)),
            "i": In(stream.Signature(kvq_in_layout())),
            "o": Out(stream.Signature(beat_layout(data_width))),
            "tokens": Out(32),
            "blocks": Out(32),
            "scale_sat": Out(16),
            "len_err": Out(16),
        })

    def elaborate(self, platform):
        m = Module()
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

        # emission pipeline: issue → e1 (buffer word) → e2 (products) → e3 (halfword) → FIFO
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=HALF + 1, depth=self.out_fifo_depth)
        unit = Signal(range(2 + 2 * RB + 1))
        e_issue = Signal()
        e1 = Signal()
        e1_kind = Signal(2)
        e1_row = Signal()
        e1_last = Signal()
        e2 = Signal()
        e2_kind = Signal(2)
        e2_last = Signal()
        e2_p = [Signal(signed(AW + RECIP_IN_BITS + 5), name=f"e2_p{k}") for k in range(NL)]
        e2_sh = Signal(range(64))
        e2_zero = Signal()
        e2_sc = Signal(HALF)
        e3 = Signal()
        e3_val = Signal(HALF)
        e3_last = Signal()
        space = fifo.level <= self.out_fifo_depth - 4
        last_unit = unit == 2 + 2 * RB - 1
        # unit 0: sk, 1: sv, 2..: K row words then V row words (one buffer word = 4 codes)
        m.d.comb += rd.addr.eq(unit - 2)
        m.d.sync += [
            e1.eq(e_issue), e1_kind.eq(Mux(unit < 2, unit, 2)),
            e1_row.eq(unit >= 2 + RB), e1_last.eq(last_unit & blk_last),
        ]
        e1_rm = rmul[e1_row]
        m.d.sync += [e2.eq(e1), e2_kind.eq(e1_kind), e2_last.eq(e1_last),
                     e2_sh.eq(rsh[e1_row]), e2_zero.eq(absmax[e1_row] == 0),
                     e2_sc.eq(Mux(e1_kind == 0, scale[0], scale[1]))]
        for k in range(NL):
            x = rd.data[k * AW:(k + 1) * AW].as_signed()
            m.d.sync += e2_p[k].eq(x * e1_rm)
        codes = []
        for k in range(NL):
            q = (e2_p[k] + ((Const(1, 64) << e2_sh) >> 1)) >> e2_sh
            lo, hi = KV_ELEM.min_int, KV_ELEM.max_int
            codes.append(Mux(e2_zero, 0, Mux(q > hi, hi, Mux(q < lo, lo, q)))[:KV_ELEM.width])
        m.d.sync += [e3.eq(e2), e3_last.eq(e2_last),
                     e3_val.eq(Mux(e2_kind == 2, Cat(*codes), e2_sc))]
        m.d.comb += [fifo.w_data.eq(Cat(e3_val, e3_last)), fifo.w_en.eq(e3)]
        busy = e1 | e2 | e3

        blk_len = Signal.like(self.i_meta.payload.length)
        blk_bytes = Signal(len(blk_len) + 8)
        with m.FSM(name="kvq"):
            with m.State("META"):
                m.d.comb += [self.o_meta.payload.eq(self.i_meta.payload),
                             self.o_meta.valid.eq(self.i_meta.valid),
                             self.i_meta.ready.eq(self.o_meta.ready)]
                with m.If(self.i_meta.valid & self.o_meta.ready):
                    m.d.sync += [blk_len.eq(self.i_meta.payload.length), blk_bytes.eq(0)]
                    m.next = "RECV"
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
                m.d.sync += unit.eq(unit + 1)
                with m.If(last_unit):
                    m.next = "DRAIN"
            with m.State("DRAIN"), m.If(~busy):
                nbytes = blk_bytes + kv_token_bytes(D)
                m.d.sync += [absmax[0].eq(0), absmax[1].eq(0), blk_bytes.eq(nbytes),
                             self.tokens.eq(self.tokens + 1)]
                with m.If(blk_last):
                    m.d.sync += self.blocks.eq(self.blocks + 1)
                    with m.If(nbytes != blk_len):
                        m.d.sync += self.len_err.eq(self.len_err + 1)
                    m.next = "META"
                with m.Else():
                    m.next = "RECV"

        # packer: 16-bit units → data_width beats
        UPB = self.data_width // HALF
        pk = Array(Signal(HALF, name=f"pk{i}") for i in range(UPB))
        pk_cnt = Signal(range(UPB + 1))
        pk_full = Signal()
        pk_last = Signal()
        keep = Array(Const((1 << (2 * n)) - 1, self.data_width // 8) for n in range(UPB + 1))
        m.d.comb += [self.o.valid.eq(pk_full), self.o.payload.data.eq(Cat(*pk)),
                     self.o.payload.last.eq(pk_last), self.o.payload.keep.eq(keep[pk_cnt]),
                     fifo.r_en.eq(~pk_full)]
        with m.If(pk_full), m.If(self.o.ready):
            m.d.sync += [pk_full.eq(0), pk_cnt.eq(0)]
        with m.Elif(fifo.r_rdy):
            wlast = fifo.r_data[HALF]
            m.d.sync += [pk[pk_cnt].eq(fifo.r_data[:HALF]), pk_cnt.eq(pk_cnt + 1),
                         pk_last.eq(wlast)]
            with m.If(wlast | (pk_cnt == UPB - 1)):
                m.d.sync += pk_full.eq(1)
        return m
