"""The GEMM engine's two loaders (paper §5 ping-pong DMA loader, Fig. 2): activation chunks from
``x_in`` into two activation banks, weight tiles from ``w_in`` into two tile banks. Each walks
the engine's job queue in job order; the engine owns the queue, the banks and their flags.
Stream formats: :func:`mcf.abi.compute.gemm_x_stream`, :func:`mcf.abi.compute.gemm_w_stream`.
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.compute import GEMM_JOB
from mcf.abi.quant import SCALE_MANT_BITS, WEIGHT

__all__ = ["GemmActLoader", "GemmTileLoader"]


class GemmActLoader(wiring.Component):
    """Loads job after job's activations into bank ``bank`` (the job's pointer's low bit):
    the per-token scale beats into the scale bank, then the INT8 steps token-major into
    ``arrays`` sub-banks (sub-bank ``a`` holds tokens ``a, a + arrays, …``: row
    ``(t // arrays) · k_steps + step``). An ``acc_in`` job's lanes follow its scale beats: the
    epilogue takes them (``lanes``, ``lanes_take``, ``lanes_end``).

    Members
    -------
    x_in : In(stream.Signature(unsigned(beat)))
        The engine's ``x_in``.
    queued, bank, bank_busy : In(1)
        A job is queued for this loader; the bank it loads into; that bank is still held.
    m_count, k_steps, acc_in : In
        The job's fields.
    start : Out(1)
        The loader takes the job this cycle (the engine marks the bank busy).
    done : Out(1)
        The loader is done with the job this cycle (the engine advances its pointer).
    tok, step : Out
        The token being loaded and its step (the issuer's early start).
    lanes : Out(1)
        ``x_in`` carries the job's ``acc_in`` lanes (after its scale beats).
    lanes_take, lanes_end : In(1)
        The epilogue takes a lanes beat; it is the job's final one.
    x_wr0 … x_wr{arrays − 1}, t_wr : In(memory.WritePort.Signature)
        The activation sub-banks' and the scale bank's write ports (both banks: ``x_depth``,
        ``t_depth`` words each); a beat is written the cycle it is taken.

    Latency: ``start`` (combinational) in the first cycle the job is queued, its bank free and
    the loader idle; ``x_in`` is ready from the next cycle, one beat per cycle.
    """

    def __init__(self, beat: int, arrays: int, m_max: int, ks_max: int, x_depth: int,
                 t_depth: int):
        self.beat, self.n_arrays, self.m_max, self.ks_max = beat, arrays, m_max, ks_max
        self.x_depth, self.t_depth = x_depth, t_depth
        x_port = memory.WritePort.Signature(addr_width=(2 * x_depth - 1).bit_length(),
                                            shape=unsigned(beat))
        members = {
            "x_in": In(stream.Signature(unsigned(beat))),
            "queued": In(1), "bank": In(1), "bank_busy": In(1),
            "m_count": In(range(m_max + 1)), "k_steps": In(range(ks_max + 1)),
            "acc_in": In(1),
            "start": Out(1), "done": Out(1),
            "tok": Out(range(m_max + 1)), "step": Out(range(ks_max + 1)),
            "lanes": Out(1), "lanes_take": In(1), "lanes_end": In(1),
            "t_wr": In(memory.WritePort.Signature(addr_width=(2 * t_depth - 1).bit_length(),
                                                  shape=unsigned(beat))),
        }
        members.update({f"x_wr{a}": In(x_port) for a in range(arrays)})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        A, XD, TD = self.n_arrays, self.x_depth, self.t_depth
        lg_a = A.bit_length() - 1
        tpb = self.beat // 32
        lg_tpb = tpb.bit_length() - 1
        x_on = Signal()
        x_tok, x_step = self.tok, self.step         # token being loaded, its step, its row
        x_row = Signal(range(XD + 1))
        t_cnt = Signal(range(TD + 1))
        t_total = Signal(range(TD + 1))
        xws = [getattr(self, f"x_wr{a}") for a in range(A)]
        tw = self.t_wr
        x_m_, x_k_ = self.m_count, self.k_steps
        x_lanes = self.lanes
        m.d.comb += x_lanes.eq(x_on & self.acc_in & (t_cnt == t_total))
        with m.If(~x_on & self.queued & ~self.bank_busy):
            m.d.comb += self.start.eq(1)
            m.d.sync += [x_on.eq(1), t_total.eq((x_m_ + (tpb - 1)) >> lg_tpb)]
        m.d.comb += [self.x_in.ready.eq(Mux(x_lanes, self.lanes_take, x_on)),
                     tw.addr.eq(t_cnt + Mux(self.bank, TD, 0)), tw.data.eq(self.x_in.payload)]
        for xw in xws:
            m.d.comb += [xw.addr.eq(x_row + x_step + Mux(self.bank, XD, 0)),
                         xw.data.eq(self.x_in.payload)]
        with m.If(self.lanes_end):
            m.d.comb += self.done.eq(1)
            m.d.sync += [x_on.eq(0), t_cnt.eq(0)]
        with m.If(self.x_in.valid & x_on & ~x_lanes):
            with m.If(t_cnt != t_total):
                m.d.comb += tw.en.eq(1)
                m.d.sync += t_cnt.eq(t_cnt + 1)
            with m.Else():
                for a, xw in enumerate(xws):
                    m.d.comb += xw.en.eq(x_tok[:lg_a] == a if A > 1 else 1)
                m.d.sync += x_step.eq(x_step + 1)
                with m.If(x_step == x_k_ - 1):
                    m.d.sync += [x_step.eq(0), x_tok.eq(x_tok + 1)]
                    with m.If(x_tok[:lg_a] == A - 1 if A > 1 else 1):
                        m.d.sync += x_row.eq(x_row + x_k_)
                    with m.If(x_tok == x_m_ - 1):
                        m.d.comb += self.done.eq(1)
                        m.d.sync += [x_on.eq(0), x_tok.eq(0), x_row.eq(0), t_cnt.eq(0)]
        return m


class GemmTileLoader(wiring.Component):
    """Loads the tiles of job after job into tile bank ``bank`` (ping-pong across jobs): per
    tile ``k_steps`` weight words, its group scales, its bias (an ``acc_in`` job's tiles:
    the bias only). Weights and scales come a ``w_in`` word at a time (a scale entry =
    ``spw`` scale words), the bias a beat at a time.

    Members
    -------
    w_in : In(stream.Signature(unsigned(w_width)))
        The engine's ``w_in``.
    queued : In(1)
        A job is queued for this loader.
    held : In(2)
        The tile banks still held (loaded, results not all out).
    k_steps, n_tiles, acc_in : In
        The job's fields.
    bank : Out(1)
        The bank being loaded.
    loaded : Out(1)
        The tile in ``bank`` is complete this cycle (the engine marks it held and available).
    done : Out(1)
        ... and it was the job's last tile (the engine advances the loader's pointer).
    w_wr, s_wr, b_wr : In(memory.WritePort.Signature)
        The weight, scale and bias banks' write ports (both banks).

    Latency: a weight word or scale entry is written the cycle its last ``w_in`` word is
    taken, a bias beat the cycle it is taken; ``loaded`` with the tile's last bias beat.
    """

    def __init__(self, rows: int, lanes: int, beat: int, w_width: int, ks_max: int,
                 se_max: int, spg: int):
        self.rows, self.lanes, self.beat, self.w_width = rows, lanes, beat, w_width
        self.ks_max, self.se_max, self.spg = ks_max, se_max, spg
        self.w_word = rows * lanes * WEIGHT.width
        self.s_word = rows * SCALE_MANT_BITS
        self.spw = max(1, w_width // self.s_word)   # scale words per w_in word
        self.bt = rows * 32 // beat                 # bias beats per tile

        def port(depth, width):
            return In(memory.WritePort.Signature(addr_width=(2 * depth - 1).bit_length(),
                                                 shape=unsigned(width)))
        super().__init__({
            "w_in": In(stream.Signature(unsigned(w_width))),
            "queued": In(1), "held": In(2),
            "k_steps": In(range(ks_max + 1)), "n_tiles": In(GEMM_JOB["n_tiles"].shape),
            "acc_in": In(1),
            "bank": Out(1), "loaded": Out(1), "done": Out(1),
            "w_wr": port(ks_max, self.w_word),
            "s_wr": port(se_max, self.s_word * self.spw),
            "b_wr": port(self.bt, beat),
        })

    def elaborate(self, platform):
        m = Module()
        B, W, BT = self.beat, self.w_width, self.bt
        ks_max, se_max = self.ks_max, self.se_max
        w_word, s_word, spw = self.w_word, self.s_word, self.spw
        lg_spg = self.spg.bit_length() - 1
        lg_spw = spw.bit_length() - 1
        w_beats = w_word // W                       # w_in words per weight word
        nsub = W // B                               # beats per w_in word (scales, bias)
        s_beats = max(1, s_word // W)               # w_in words per scale word
        lb = self.bank
        tl = Signal.like(self.n_tiles)
        ww, sw, bw = self.w_wr, self.s_wr, self.b_wr
        phase = Signal(2)        # 0 weights, 1 scales, 2 bias
        wcnt = Signal(range(max(ks_max, se_max, BT) + 1))
        sub = Signal(range(max(w_beats, s_beats, 2) + 1))
        asm = Signal(max(w_word, s_word))
        l_k = self.k_steps
        ph = Signal(2)                              # the phase; an acc_in job's: bias only
        m.d.comb += ph.eq(Mux(self.acc_in, 2, phase))
        w_ok = Signal()
        # bias one beat at a time: beat ws of the word, taken at its last beat or at the end
        # of the tile (padding)
        ws = Signal(range(max(nsub, 2)))
        part = self.w_in.payload.word_select(ws, B) if nsub > 1 else self.w_in.payload
        new_asm = Signal.like(asm)
        tile_end = Signal()
        m.d.comb += [
            new_asm.eq(Cat(asm[W:], self.w_in.payload)),
            tile_end.eq((ph == 2) & (wcnt == BT - 1)),
            w_ok.eq(self.queued & ~self.held.bit_select(lb, 1)),
            self.w_in.ready.eq(w_ok & ((ph != 2) | (ws == nsub - 1) | tile_end)
                               if nsub > 1 else w_ok),
            ww.addr.eq(wcnt + Mux(lb, ks_max, 0)), ww.data.eq(new_asm[len(asm) - w_word:]),
            sw.addr.eq(wcnt + Mux(lb, se_max, 0)),
            sw.data.eq(new_asm[len(asm) - s_word:] if spw == 1 else self.w_in.payload),
            bw.addr.eq(wcnt + Mux(lb, BT, 0)), bw.data.eq(part),
        ]
        with m.If(self.w_in.valid & w_ok):
            if nsub > 1:
                with m.If(ph == 2):
                    m.d.sync += ws.eq(Mux((ws == nsub - 1) | tile_end, 0, ws + 1))
            with m.If(ph == 0):
                m.d.sync += asm.eq(new_asm)
                with m.If(sub == w_beats - 1):
                    m.d.comb += ww.en.eq(1)
                    m.d.sync += [sub.eq(0), wcnt.eq(wcnt + 1)]
                    with m.If(wcnt == l_k - 1):
                        m.d.sync += [phase.eq(1), wcnt.eq(0)]
                with m.Else():
                    m.d.sync += sub.eq(sub + 1)
            with m.Elif(ph == 1):
                m.d.sync += asm.eq(new_asm)
                with m.If(sub == s_beats - 1):
                    m.d.comb += sw.en.eq(1)
                    m.d.sync += [sub.eq(0), wcnt.eq(wcnt + 1)]
                    n_se = (l_k >> lg_spg) if spw == 1 else \
                        ((l_k >> lg_spg) + (spw - 1)) >> lg_spw
                    with m.If(wcnt == n_se - 1):
                        m.d.sync += [phase.eq(2), wcnt.eq(0)]
                with m.Else():
                    m.d.sync += sub.eq(sub + 1)
            with m.Else():
                m.d.comb += bw.en.eq(1)
                m.d.sync += wcnt.eq(wcnt + 1)
                with m.If(tile_end):
                    m.d.comb += self.loaded.eq(1)
                    m.d.sync += [lb.eq(~lb), phase.eq(0), wcnt.eq(0), tl.eq(tl + 1)]
                    with m.If(tl == self.n_tiles - 1):
                        m.d.comb += self.done.eq(1)
                        m.d.sync += tl.eq(0)
        return m
