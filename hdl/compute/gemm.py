"""INT4 GEMM engine: resident activation chunk, ping-pong weight tiles, dot-product array and
dequantising epilogue (paper §5 compute engine, Fig. 2; §6.1 INT4 weights).

The host lays tiles out with :func:`mcf.quant.gemm_tile_blob`; the arithmetic is
:func:`mcf.golden.gemm.gemm` bit for bit.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.quant import (
    ACC_BITS,
    ACT,
    ACT_FRAC,
    SCALE_EXP_BITS,
    SCALE_MANT_BITS,
    SHIFT_MAX,
    WEIGHT,
    XQ,
)

from .gemm_array import GemmArray

__all__ = ["GemmEngine", "gemm_round_shift"]

COUNTER_BITS = 32


def gemm_round_shift(m: Module, value, shift, width: int):
    """Comb ``round_half_even(value, shift)`` for a signed ``value`` and a variable ``shift``."""
    q = Signal(signed(width), name="rs_q")
    rem = Signal(width, name="rs_rem")
    half = Signal(width + 1, name="rs_half")
    up = Signal(name="rs_up")
    out = Signal(signed(width + 1), name="rs_out")
    mask = Signal(width + 1, name="rs_mask")
    m.d.comb += [
        q.eq(value >> shift),
        mask.eq((Const(1, width + 1) << shift) - 1),
        rem.eq(value.as_unsigned() & mask),
        half.eq((Const(1, width + 1) << shift) >> 1),
        up.eq((shift != 0) & ((rem > half) | ((rem == half) & q[0]))),
        out.eq(q + up),
    ]
    return out


def _sat(m: Module, value, width: int, name: str):
    out = Signal(signed(width), name=name)
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    m.d.comb += out.eq(Mux(value > hi, hi, Mux(value < lo, lo, value)))
    return out


class GemmEngine(wiring.Component):
    """One node's INT4 GEMM: ``Y[M, N] = epilogue(X[M, K] · W[N, K]ᵀ)`` in tiles of ``rows``.

    Parameters: ``rows`` × ``lanes`` array (:class:`GemmArray`), ``group``, ``k_max``,
    ``m_max``. Stream beats are ``lanes·8`` bits wide (one k-step of activations per beat;
    128 bits for 16 lanes — the ZU+ HP port width).

    Members
    -------
    start : In(1)
        Pulse: latch ``m_count``, ``k_steps`` (= K / lanes), ``n_tiles``, ``w_exp`` and start a
        job (resets the loaders; the X chunk must be streamed again).
    x_in : In(stream)
        ``m_count · k_steps`` beats of INT8 activations (token-major), then
        ``ceil(m_count · 32 / beat)`` beats of per-token scale words
        (:func:`mcf.quant.pack_token_scale`). Beats after that are dropped and counted.
    w_in : In(stream)
        ``n_tiles`` tile blobs (:func:`mcf.quant.gemm_tile_blob`): ``k_steps · rows / 2``
        weight beats, ``K / group · rows · 16 / beat`` scale beats, ``rows · 32 / beat`` bias
        beats. Two tile buffers (ping-pong): a tile loads while the previous one computes.
        Beats beyond ``n_tiles`` are dropped and counted.
    o : Out(stream)
        ACT results, token-major per tile: for each tile, for each token, ``rows`` 32-bit
        little-endian lanes (``rows · 32 / beat`` beats).
    busy, tiles_done, x_dropped, w_dropped : Out
        Status.
    steps, cycles : Out
        Performance counters since ``start``: k-steps accepted by the array (each is
        ``rows · lanes`` MACs) and cycles from the first issued step to the last output beat.

    Latency: a tile's first result leaves ``k_steps + array latency + 5`` cycles after it
    starts computing; steady state is one k-step per cycle (``rows · lanes`` MACs) as long as
    the next tile has loaded.
    """

    def __init__(self, rows: int = 16, lanes: int = 16, group: int = 128,
                 k_max: int = 8960, m_max: int = 64):
        beat = lanes * XQ.width
        if (rows * SCALE_MANT_BITS) % beat or (rows * ACT.width) % beat or beat % 32:
            raise ValueError("rows·16 and rows·32 must be multiples of the beat (lanes·8)")
        if k_max % group or (group // lanes) & (group // lanes - 1):
            raise ValueError("k_max must be a multiple of the group; group / lanes a power of 2")
        self.rows, self.lanes, self.group = rows, lanes, group
        self.k_max, self.m_max, self.beat = k_max, m_max, beat
        self.array = GemmArray(rows, lanes, group)
        super().__init__({
            "start": In(1),
            "m_count": In(range(m_max + 1)),
            "k_steps": In(range(k_max // lanes + 1)),
            "n_tiles": In(16),
            "w_exp": In(signed(SCALE_EXP_BITS)),
            "x_in": In(stream.Signature(unsigned(beat))),
            "w_in": In(stream.Signature(unsigned(beat))),
            "o": Out(stream.Signature(unsigned(beat))),
            "busy": Out(1),
            "tiles_done": Out(COUNTER_BITS),
            "x_dropped": Out(COUNTER_BITS),
            "w_dropped": Out(COUNTER_BITS),
            "steps": Out(COUNTER_BITS),
            "cycles": Out(COUNTER_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        R, L, G, B = self.rows, self.lanes, self.group, self.beat
        spg = G // L
        ks_max = self.k_max // L
        m.submodules.array = arr = self.array

        w_word = R * L * WEIGHT.width
        w_beats = w_word // B                     # beats per weight word (rows / 2)
        s_word = R * SCALE_MANT_BITS
        s_beats = s_word // B
        ts_per_beat = B // 32

        m.submodules.xmem = xmem = memory.Memory(
            shape=unsigned(B), depth=self.m_max * ks_max, init=[])
        m.submodules.wmem = wmem = memory.Memory(shape=unsigned(w_word), depth=2 * ks_max,
                                                 init=[])
        m.submodules.smem = smem = memory.Memory(shape=unsigned(s_word),
                                                 depth=2 * (self.k_max // G), init=[])
        m.submodules.bmem = bmem = memory.Memory(shape=signed(32), depth=2 * R, init=[])
        m.submodules.tmem = tmem = memory.Memory(shape=unsigned(32), depth=self.m_max, init=[])

        # job configuration
        m_count = Signal.like(self.m_count)
        k_steps = Signal.like(self.k_steps)
        n_tiles = Signal.like(self.n_tiles)
        w_exp = Signal.like(self.w_exp)
        active = Signal()
        groups = Signal(range(self.k_max // G + 1))
        with m.If(self.start):
            m.d.sync += [m_count.eq(self.m_count), k_steps.eq(self.k_steps),
                         n_tiles.eq(self.n_tiles), w_exp.eq(self.w_exp), active.eq(1),
                         groups.eq(self.k_steps >> (spg.bit_length() - 1))]

        # --- X loader ---------------------------------------------------------------------
        xw = xmem.write_port()
        tw = tmem.write_port()
        x_cnt = Signal(range(self.m_max * ks_max + 1))
        t_cnt = Signal(range(self.m_max + ts_per_beat + 1))
        x_loaded = Signal()
        x_total = Signal.like(x_cnt)
        m.d.comb += x_total.eq(m_count * k_steps)
        m.d.comb += self.x_in.ready.eq(1)
        m.d.comb += [xw.addr.eq(x_cnt), xw.data.eq(self.x_in.payload)]
        t_idx = Signal(range(ts_per_beat))
        t_hold = Signal(B)
        t_busy = Signal()
        # a scale beat is unpacked into ts_per_beat words, one per cycle (x_in stalls)
        with m.If(t_busy):
            m.d.comb += [self.x_in.ready.eq(0), tw.addr.eq(t_cnt),
                         tw.data.eq(t_hold.word_select(t_idx, 32)),
                         tw.en.eq(t_cnt < m_count)]
            m.d.sync += [t_cnt.eq(t_cnt + 1), t_idx.eq(t_idx + 1)]
            with m.If(t_idx == ts_per_beat - 1):
                m.d.sync += t_busy.eq(0)
                with m.If(t_cnt + 1 >= m_count):
                    m.d.sync += x_loaded.eq(1)
        with m.Elif(self.x_in.valid):
            with m.If(~active | x_loaded):
                m.d.sync += self.x_dropped.eq(self.x_dropped + 1)
            with m.Elif(x_cnt < x_total):
                m.d.comb += xw.en.eq(1)
                m.d.sync += x_cnt.eq(x_cnt + 1)
            with m.Else():
                m.d.sync += [t_hold.eq(self.x_in.payload), t_busy.eq(1), t_idx.eq(0)]

        # --- tile loader (ping-pong) --------------------------------------------------------
        full = Signal(2)
        lb = Signal()
        tiles_loaded = Signal(16)
        ww = wmem.write_port()
        sw = smem.write_port()
        bw = bmem.write_port()
        phase = Signal(2)        # 0 weights, 1 scales, 2 bias
        wcnt = Signal(range(max(ks_max, self.k_max // G, R) + 1))
        sub = Signal(range(max(w_beats, s_beats, 2) + 1))
        asm = Signal(max(w_word, s_word))
        b_idx = Signal(range(R + 1))
        b_sub = Signal(range(ts_per_beat + 1))
        b_hold = Signal(B)
        b_busy = Signal()
        can_load = Signal()
        m.d.comb += can_load.eq(active & ~full.bit_select(lb, 1) & (tiles_loaded < n_tiles))
        m.d.comb += self.w_in.ready.eq(~b_busy)
        new_asm = Signal.like(asm)
        m.d.comb += new_asm.eq(Cat(asm[B:], self.w_in.payload))
        m.d.comb += [ww.addr.eq(wcnt + Mux(lb, ks_max, 0)),
                     ww.data.eq(new_asm[len(asm) - w_word:]),
                     sw.addr.eq(wcnt + Mux(lb, self.k_max // G, 0)),
                     sw.data.eq(new_asm[len(asm) - s_word:]),
                     bw.addr.eq(b_idx + Mux(lb, R, 0)),
                     bw.data.eq(b_hold.word_select(b_sub, 32))]
        with m.If(b_busy):
            m.d.comb += bw.en.eq(1)
            m.d.sync += [b_idx.eq(b_idx + 1), b_sub.eq(b_sub + 1)]
            with m.If(b_sub == ts_per_beat - 1):
                m.d.sync += [b_busy.eq(0), b_sub.eq(0)]
                with m.If(b_idx == R - 1):
                    m.d.sync += [full.bit_select(lb, 1).eq(1), lb.eq(~lb),
                                 tiles_loaded.eq(tiles_loaded + 1), phase.eq(0), wcnt.eq(0),
                                 b_idx.eq(0)]
        with m.Elif(self.w_in.valid):
            with m.If(~active | (tiles_loaded >= n_tiles)):
                m.d.sync += self.w_dropped.eq(self.w_dropped + 1)
            with m.Elif(~can_load):
                m.d.comb += self.w_in.ready.eq(0)       # wait for the buffer to drain
            with m.Elif(phase == 0):
                m.d.sync += asm.eq(new_asm)
                with m.If(sub == w_beats - 1):
                    m.d.comb += ww.en.eq(1)
                    m.d.sync += [sub.eq(0), wcnt.eq(wcnt + 1)]
                    with m.If(wcnt == k_steps - 1):
                        m.d.sync += [phase.eq(1), wcnt.eq(0)]
                with m.Else():
                    m.d.sync += sub.eq(sub + 1)
            with m.Elif(phase == 1):
                m.d.sync += asm.eq(new_asm)
                with m.If(sub == s_beats - 1):
                    m.d.comb += sw.en.eq(1)
                    m.d.sync += [sub.eq(0), wcnt.eq(wcnt + 1)]
                    with m.If(wcnt == groups - 1):
                        m.d.sync += [phase.eq(2), wcnt.eq(0)]
                with m.Else():
                    m.d.sync += sub.eq(sub + 1)
            with m.Else():
                m.d.sync += [b_hold.eq(self.w_in.payload), b_busy.eq(1), b_sub.eq(0)]

        # --- issue: k-steps of the current tile into the array ------------------------------
        ib = Signal()
        issuing = Signal()
        tiles_issued = Signal(16)
        mi = Signal(range(self.m_max + 1))
        si = Signal(range(ks_max + 1))
        gi = Signal(range(spg))
        xrow = Signal(range(self.m_max * ks_max + 1))
        xr = xmem.read_port()
        wr = wmem.read_port()
        sr = smem.read_port()
        go = arr.i.ready
        m.d.comb += [xr.en.eq(go), wr.en.eq(go), sr.en.eq(go),
                     xr.addr.eq(xrow + si),
                     wr.addr.eq(si + Mux(ib, ks_max, 0)),
                     sr.addr.eq((si >> (spg.bit_length() - 1)) + Mux(ib, self.k_max // G, 0))]
        v0, g0, l0 = Signal(), Signal(), Signal()
        with m.If(go):
            m.d.sync += [v0.eq(issuing), g0.eq(gi == spg - 1), l0.eq(si == k_steps - 1)]
            with m.If(issuing):
                m.d.sync += [si.eq(si + 1), gi.eq(gi + 1)]
                with m.If(gi == spg - 1):
                    m.d.sync += gi.eq(0)
                with m.If(si == k_steps - 1):
                    m.d.sync += [si.eq(0), gi.eq(0), mi.eq(mi + 1), xrow.eq(xrow + k_steps)]
                    with m.If(mi == m_count - 1):
                        m.d.sync += [issuing.eq(0), ib.eq(~ib),
                                     tiles_issued.eq(tiles_issued + 1)]
            with m.Elif(active & x_loaded & full.bit_select(ib, 1) &
                        (tiles_issued < n_tiles) & (m_count != 0) & (k_steps != 0)):
                m.d.sync += [issuing.eq(1), mi.eq(0), si.eq(0), gi.eq(0), xrow.eq(0)]
        m.d.comb += [arr.i.valid.eq(v0), arr.i.payload.w.eq(wr.data),
                     arr.i.payload.a.eq(xr.data), arr.i.payload.scale.eq(sr.data),
                     arr.i.payload.glast.eq(g0), arr.i.payload.last.eq(l0)]

        # --- epilogue ---------------------------------------------------------------------
        m.submodules.rq = rq = fifo.SyncFIFOBuffered(width=R * ACC_BITS, depth=2)
        m.d.comb += [rq.w_data.eq(arr.o.payload.as_value()), rq.w_en.eq(arr.o.valid),
                     arr.o.ready.eq(rq.w_rdy)]
        eb = Signal()
        em = Signal(range(self.m_max + 1))
        er = Signal(range(R + 1))
        cur = Signal(R * ACC_BITS)
        cur_v = Signal()
        tr = tmem.read_port(domain="comb")
        br = bmem.read_port(domain="comb")
        ee = Signal()
        m.d.comb += ee.eq(~self.o.valid | self.o.ready)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        # E0: pick lane er of the current vector
        m.d.comb += [rq.r_en.eq(~cur_v), tr.addr.eq(em), br.addr.eq(er + Mux(eb, R, 0))]
        with m.If(~cur_v & rq.r_rdy):
            m.d.sync += [cur.eq(rq.r_data), cur_v.eq(1), er.eq(0)]
        x_m = tr.data[:SCALE_MANT_BITS]
        x_e = tr.data[SCALE_MANT_BITS:SCALE_MANT_BITS + SCALE_EXP_BITS].as_signed()
        sh_raw = Signal(signed(SCALE_EXP_BITS + 3))
        m.d.comb += sh_raw.eq(-(w_exp + x_e + ACT_FRAC))
        p1 = Signal(signed(ACC_BITS + SCALE_MANT_BITS + 1))
        sh1 = Signal(range(SHIFT_MAX + 1))
        bias1 = Signal(signed(32))
        v1 = Signal()
        with m.If(ee):
            m.d.sync += v1.eq(cur_v)
            with m.If(cur_v):
                m.d.sync += [
                    p1.eq(cur.word_select(er, ACC_BITS).as_signed() * x_m),
                    sh1.eq(Mux(sh_raw < 0, 0, Mux(sh_raw > SHIFT_MAX, SHIFT_MAX, sh_raw))),
                    bias1.eq(br.data), er.eq(er + 1)]
                with m.If(er == R - 1):
                    m.d.sync += [cur_v.eq(0), em.eq(em + 1)]
                    with m.If(em == m_count - 1):
                        m.d.sync += [em.eq(0), eb.eq(~eb), full.bit_select(eb, 1).eq(0),
                                     self.tiles_done.eq(self.tiles_done + 1)]
        # E1: round and saturate; E2: bias, saturate, pack
        rounded = gemm_round_shift(m, p1, sh1, len(p1))
        y1 = _sat(m, rounded, ACT.width, "y1")
        y2 = Signal(signed(32))
        b2 = Signal(signed(32))
        v2 = Signal()
        with m.If(ee):
            m.d.sync += [y2.eq(y1), b2.eq(bias1), v2.eq(v1)]
        ysum = Signal(signed(34))
        m.d.comb += ysum.eq(y2 + b2)
        y3 = _sat(m, ysum, ACT.width, "y3")
        pack = Signal(B)
        pidx = Signal(range(ts_per_beat))
        with m.If(ee & v2):
            m.d.sync += [pack.eq(Cat(pack[32:], y3)), pidx.eq(pidx + 1)]
            with m.If(pidx == ts_per_beat - 1):
                m.d.sync += [pidx.eq(0), self.o.valid.eq(1),
                             self.o.payload.eq(Cat(pack[32:], y3))]
        m.d.comb += self.busy.eq(active & (self.tiles_done != n_tiles))

        # performance counters
        counting = Signal()
        with m.If(arr.i.valid & arr.i.ready):
            m.d.sync += [self.steps.eq(self.steps + 1), counting.eq(1)]
        with m.If(counting & self.busy):
            m.d.sync += self.cycles.eq(self.cycles + 1)

        # start clears everything job-related
        with m.If(self.start):
            m.d.sync += [x_cnt.eq(0), t_cnt.eq(0), x_loaded.eq(0), t_busy.eq(0), full.eq(0),
                         lb.eq(0), tiles_loaded.eq(0), phase.eq(0), wcnt.eq(0), sub.eq(0),
                         b_busy.eq(0), b_idx.eq(0), b_sub.eq(0), ib.eq(0), issuing.eq(0),
                         tiles_issued.eq(0), eb.eq(0), em.eq(0), self.tiles_done.eq(0),
                         self.steps.eq(0), self.cycles.eq(0), counting.eq(0)]
        return m
