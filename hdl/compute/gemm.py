"""INT4 GEMM engine: queued jobs, ping-pong activation chunks and weight tiles, dot-product array
and dequantising epilogue (paper §5 compute engine and its ping-pong DMA loader, Fig. 2; §6.1
INT4 weights).

The host lays tiles out with :func:`mcf.quant.gemm_tile_blob`; the arithmetic is
:func:`mcf.golden.gemm.gemm` bit for bit, and for tensor-parallel decode's row-parallel GEMM
(``acc_out`` / ``acc_in`` jobs, :data:`mcf.abi.compute.GEMM_JOB`)
:func:`mcf.golden.gemm.partial_lanes` / :func:`mcf.golden.gemm.lanes_epilogue`.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.compute import GEMM_JOB, GEMM_STATUS, GemmLimits
from mcf.abi.quant import (
    ACC_BITS,
    ACT,
    ACT_FRAC,
    GROUP_SIZE,
    SCALE_EXP_BITS,
    SCALE_MANT_BITS,
    SHIFT_MAX,
    WEIGHT,
    XQ,
)
from mcf.abi.tp import ACC_LANES, ACC_LO_BITS

from .gemm_array import GemmArray

__all__ = ["GemmEngine", "gemm_round_shift"]


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
    """One node's INT4 GEMM: ``Y[M, N] = epilogue(X[M, K] · W[N, K]ᵀ)`` in tiles of ``rows``,
    jobs back to back, on ``arrays`` token-parallel copies of the dot-product array.

    Parameters: ``rows`` × ``lanes`` array (:class:`GemmArray`), ``group``, ``k_max``,
    ``m_max``, ``jobs`` (queue depth), ``arrays`` (1, 2 or 4; 4 on the kr260, docs/node.md
    §11), ``w_width`` (bits of ``w_in``, a multiple of the beat dividing a weight word
    ``rows·lanes·4``; default one beat; 512 on the kr260: four HP ports in lockstep, §4).
    Stream beats of ``x_in`` and ``o`` are ``lanes·8`` bits wide (one k-step of activations
    per beat; 128 bits for 16 lanes — the ZU+ HP port width).

    Token parallelism: token ``t`` of a job runs on array ``t mod arrays`` (the activation
    bank is split into ``arrays`` sub-banks the same way); the ``arrays`` arrays take the same
    weight word and k-step in the same cycle, each on its own token. A tile therefore takes
    ``ceil(m_count / arrays) · k_steps`` cycles and reads each weight word ``ceil(m_count /
    arrays)`` times; job descriptor, stream formats and output order do not depend on
    ``arrays`` (``arrays=1`` is the single-array engine).

    Weight rate (what ``w_in`` must bring for one k-step per cycle): a tile is ``k_steps``
    words of ``rows·lanes·4`` bits plus its scales and bias, used for ``ceil(m / arrays) ·
    k_steps`` cycles, so ``w_in`` needs ``rows·lanes·4 / ceil(m / arrays)`` bits per cycle
    (+ 1/8 for scales at group 128): 64 bits/cycle for the kr260's 64-token chunk (16 × 16,
    4 arrays) — a 128-bit ``w_in`` suffices from ``m ≥ 32``; below that (decode, ``m = 1``:
    1,024 bits per step) the engine runs at the ``w_in`` rate, which is why the kr260 widens
    ``w_in`` to 512 bits (a k-step every 2 cycles at ``m = 1``). ``chain``: lanes per
    post-adder chain of the arrays, ``dsp``: how its slices are built (:class:`GemmArray`);
    resource choices only.

    Members
    -------
    job : In(stream.Signature(:data:`mcf.abi.compute.GEMM_JOB`))
        Job descriptors, queued (up to ``jobs``). A job with ``m_count`` not in 1..m_max,
        ``k_steps`` not in 1..k_max/lanes or not a whole number of groups, or ``n_tiles = 0``
        is taken, counted in ``status.bad_jobs`` and ignored (its data must not be sent).
        ``acc_out``: the job's results are SUM lanes (below); ``acc_in``: the job runs only
        the epilogue, on accumulators from summed lanes (``x_in``, ``w_in`` below; no array
        steps; ``k_steps`` must still pass the check).
    x_in : In(stream)
        Per job, in job order: ``ceil(m_count · 32 / beat)`` beats of per-token scale words
        (:func:`mcf.quant.pack_token_scale`), then ``m_count · k_steps`` beats of INT8
        activations, token-major (:func:`mcf.abi.compute.gemm_x_stream`). Two activation
        banks (ping-pong): job j+1's chunk loads while job j computes; computing starts as soon
        as the steps it needs have arrived. ``ready`` is low
        while no queued job has a free bank. An ``acc_in`` job: the scale beats, then per
        tile, per token, ``rows`` summed accumulators as :data:`mcf.abi.tp.ACC_LANES` 32-bit
        lanes ``lo, hi`` (:func:`mcf.abi.compute.gemm_lanes_x_stream`), taken by the epilogue
        as it runs (the next job's activations load after them); ``acc = hi ·
        2^ACC_LO_BITS + lo`` wrapped to ACC_BITS.
    w_in : In(stream)
        Per job, ``n_tiles`` tile blobs (:func:`mcf.quant.gemm_tile_blob`): ``k_steps · rows /
        2`` weight beats, ``K / group · rows · 16 / beat`` scale beats, ``rows · 32 / beat``
        bias beats, in ``w_width``-bit words: a tile's scales and its bias each padded to a
        whole word (:func:`mcf.abi.compute.gemm_w_stream`; no padding when ``w_width`` is the
        beat, nor at 16 × 16 with 512 bits and an even number of groups). Weights and scales
        take one word per cycle, the bias one beat per cycle. An ``acc_in`` job: each tile's
        bias only, padded to a whole word (:func:`mcf.abi.compute.gemm_bias_stream`).
        Two tile banks (ping-pong) shared across jobs: a tile — also the next job's
        first — loads while the previous one computes. ``ready`` is low while no job is
        queued for it or both banks are held.
    o : Out(stream)
        ACT results, job by job, token-major per tile: for each tile, for each token, ``rows``
        32-bit little-endian lanes (``rows · 32 / beat`` beats). An ``acc_out`` job: ``2 ·
        rows`` lanes per token and tile, each element's exact accumulator as ``lo = acc mod
        2^ACC_LO_BITS``, ``hi = acc >> ACC_LO_BITS`` (:func:`mcf.abi.tp.acc_lanes`); no bias.
    busy : Out(1)
        A job is queued or in flight.
    status : Out(:data:`mcf.abi.compute.GEMM_STATUS`)
        Counters (wrap): jobs accepted / done / rejected, tiles done, k-steps issued (per
        array: each ``rows · lanes`` MACs), cycles with a job in flight, x and w words taken.

    Latency: a tile's first result leaves ``k_steps + array latency + 5`` cycles after it
    starts computing; steady state is one k-step per cycle on every array (``arrays · rows ·
    lanes`` MACs), across job boundaries too, as long as the next tile and the next job's
    activations have loaded. The epilogue handles one output lane per cycle, ``rows`` cycles
    per token: with ``arrays · rows > k_steps`` (K < 1,024 at 16 × 16, 4 arrays) it, not the
    arrays, sets the rate. An ``acc_out`` job's epilogue takes two cycles per element (one per
    lane); an ``acc_in`` job's one per element, as its lanes arrive.
    """

    def __init__(self, rows: int = 16, lanes: int = 16, group: int = GROUP_SIZE,
                 k_max: int = 8960, m_max: int = 64, jobs: int = 4, arrays: int = 1,
                 w_width: int | None = None, chain: int = 1, dsp: str = "fabric"):
        beat = lanes * XQ.width
        w_width = beat if w_width is None else w_width
        if (rows * SCALE_MANT_BITS) % beat or (rows * ACT.width) % beat or beat % 32:
            raise ValueError("rows·16 and rows·32 must be multiples of the beat (lanes·8)")
        if k_max % group or (group // lanes) & (group // lanes - 1) or lanes & (lanes - 1):
            raise ValueError("k_max must be a multiple of the group; group / lanes and lanes "
                             "powers of 2")
        if jobs < 2 or jobs & (jobs - 1):
            raise ValueError("the job queue depth must be a power of 2, at least 2")
        if arrays < 1 or arrays & (arrays - 1):
            raise ValueError("arrays must be a power of 2")
        s_word = rows * SCALE_MANT_BITS
        if (w_width % beat or (rows * lanes * WEIGHT.width) % w_width or
                (s_word % w_width and w_width % s_word)):
            raise ValueError("w_width must be a multiple of the beat dividing rows·lanes·4, "
                             "and divide or be a multiple of rows·16")
        self.rows, self.lanes, self.group = rows, lanes, group
        self.k_max, self.m_max, self.beat, self.jobs = k_max, m_max, beat, jobs
        self.n_arrays, self.w_width = arrays, w_width
        self.limits = GemmLimits(m_max, k_max, lanes, group)
        self.arrays = [GemmArray(rows, lanes, group, chain, dsp) for _ in range(arrays)]
        self.array = self.arrays[0]
        super().__init__({
            "job": In(stream.Signature(GEMM_JOB)),
            "x_in": In(stream.Signature(unsigned(beat))),
            "w_in": In(stream.Signature(unsigned(w_width))),
            "o": Out(stream.Signature(unsigned(beat))),
            "busy": Out(1),
            "status": Out(GEMM_STATUS),
        })

    def elaborate(self, platform):
        m = Module()
        R, L, G, B = self.rows, self.lanes, self.group, self.beat
        spg = G // L
        lg_spg = spg.bit_length() - 1
        ks_max = self.k_max // L
        g_max = self.k_max // G
        tpb = B // 32                               # 32-bit words per beat
        lg_tpb = tpb.bit_length() - 1
        A = self.n_arrays
        lg_a = A.bit_length() - 1
        W = self.w_width
        XD = -(-self.m_max // A) * ks_max           # words per activation (sub-)bank
        TD = -(-self.m_max // tpb)                  # scale beats per bank
        BT = R // tpb                               # bias beats per tile
        st = self.status
        arrs = self.arrays
        if A == 1:
            m.submodules.array = arrs[0]
        else:
            for a, arr_a in enumerate(arrs):
                m.submodules[f"array{a}"] = arr_a

        w_word = R * L * WEIGHT.width
        w_beats = w_word // W                       # w_in words per weight word
        nsub = W // B                               # beats per w_in word (scales, bias)
        s_word = R * SCALE_MANT_BITS
        s_beats = max(1, s_word // W)               # w_in words per scale word
        spw = max(1, W // s_word)                   # scale words per w_in word
        lg_spw = spw.bit_length() - 1
        se_max = -(-g_max // spw)                   # scale entries per bank

        # activation sub-bank a holds tokens a, a + A, …: row (t // A)·k_steps + step
        xmems = [memory.Memory(shape=unsigned(B), depth=2 * XD, init=[]) for _ in range(A)]
        if A == 1:
            m.submodules.xmem = xmems[0]
        else:
            for a, xm in enumerate(xmems):
                m.submodules[f"xmem{a}"] = xm
        m.submodules.tmem = tmem = memory.Memory(shape=unsigned(B), depth=2 * TD, init=[])
        m.submodules.wmem = wmem = memory.Memory(shape=unsigned(w_word), depth=2 * ks_max,
                                                 init=[])
        m.submodules.smem = smem = memory.Memory(shape=unsigned(s_word * spw),
                                                 depth=2 * se_max,
                                                 init=[])
        m.submodules.bmem = bmem = memory.Memory(shape=unsigned(B), depth=2 * BT, init=[])

        # --- job queue: a ring read by four walkers (X loader, tile loader, issuer, epilogue)
        J = self.jobs
        pbits = J.bit_length()                      # one wrap bit
        jm = Array(Signal(range(self.m_max + 1), name=f"job{i}_m") for i in range(J))
        jk = Array(Signal(range(ks_max + 1), name=f"job{i}_k") for i in range(J))
        jn = Array(Signal(GEMM_JOB["n_tiles"].shape, name=f"job{i}_n") for i in range(J))
        je = Array(Signal(signed(SCALE_EXP_BITS), name=f"job{i}_e") for i in range(J))
        jai = Array(Signal(name=f"job{i}_acc_in") for i in range(J))
        jao = Array(Signal(name=f"job{i}_acc_out") for i in range(J))
        wp, xp, lp, ip, ep = (Signal(pbits, name=n) for n in ("jq_w", "jq_x", "jq_l", "jq_i",
                                                                 "jq_e"))

        def slot(ptr):
            return ptr[:pbits - 1]

        jp = self.job.payload
        job_ok = Signal()
        m.d.comb += [
            job_ok.eq(self.limits.accepts(jp.m_count, jp.k_steps, jp.n_tiles)),
            self.job.ready.eq((wp - ep)[:pbits] != J),
            self.busy.eq(wp != ep),
        ]
        with m.If(self.job.valid & self.job.ready):
            with m.If(job_ok):
                m.d.sync += [jm[slot(wp)].eq(jp.m_count), jk[slot(wp)].eq(jp.k_steps),
                             jn[slot(wp)].eq(jp.n_tiles), je[slot(wp)].eq(jp.w_exp),
                             jai[slot(wp)].eq(jp.acc_in), jao[slot(wp)].eq(jp.acc_out),
                             wp.eq(wp + 1), st.jobs.eq(st.jobs + 1)]
            with m.Else():
                m.d.sync += st.bad_jobs.eq(st.bad_jobs + 1)

        # --- activation loader: job xp into bank xp[0] (scale beats, then codes) ------------
        xbusy = Signal(2)                           # bank loaded or loading, not yet released
        x_on = Signal()
        x_tok = Signal(range(self.m_max + 1))       # token being loaded, its step, its row
        x_step = Signal(range(ks_max + 1))
        x_row = Signal(range(XD + 1))
        t_cnt = Signal(range(TD + 1))
        t_total = Signal(range(TD + 1))
        xws = [xm.write_port() for xm in xmems]
        tw = tmem.write_port()
        x_m_, x_k_ = jm[slot(xp)], jk[slot(xp)]
        # an acc_in job's lanes follow its scale words on x_in: the epilogue takes them
        x_lanes = Signal()                          # x_in carries job xp's lanes
        x_lanes_take = Signal()                     # the epilogue takes a lanes beat
        x_lanes_end = Signal()                      # ... the job's final one
        m.d.comb += x_lanes.eq(x_on & jai[slot(xp)] & (t_cnt == t_total))
        with m.If(~x_on & (xp != wp) & ~xbusy.bit_select(xp[0], 1)):
            m.d.sync += [x_on.eq(1), xbusy.bit_select(xp[0], 1).eq(1),
                         t_total.eq((x_m_ + (tpb - 1)) >> lg_tpb)]
        m.d.comb += [self.x_in.ready.eq(Mux(x_lanes, x_lanes_take, x_on)),
                     tw.addr.eq(t_cnt + Mux(xp[0], TD, 0)), tw.data.eq(self.x_in.payload)]
        for xw in xws:
            m.d.comb += [xw.addr.eq(x_row + x_step + Mux(xp[0], XD, 0)),
                         xw.data.eq(self.x_in.payload)]
        with m.If(self.x_in.valid & self.x_in.ready):
            m.d.sync += st.x_beats.eq(st.x_beats + 1)
        with m.If(x_lanes_end):
            m.d.sync += [x_on.eq(0), xp.eq(xp + 1), t_cnt.eq(0)]
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
                        m.d.sync += [x_on.eq(0), xp.eq(xp + 1), x_tok.eq(0), x_row.eq(0),
                                     t_cnt.eq(0)]

        # --- tile loader: tiles of job lp into bank lb (ping-pong across jobs) --------------
        full = Signal(2)                            # bank held: loaded, results not all out
        avail = Signal(2)                           # bank loaded, not yet taken by the issuer
        lb = Signal()
        tl = Signal.like(jn[0])
        ww = wmem.write_port()
        sw = smem.write_port()
        bw = bmem.write_port()
        phase = Signal(2)        # 0 weights, 1 scales, 2 bias
        wcnt = Signal(range(max(ks_max, se_max, BT) + 1))
        sub = Signal(range(max(w_beats, s_beats, 2) + 1))
        asm = Signal(max(w_word, s_word))
        l_k = jk[slot(lp)]
        ph = Signal(2)                              # the phase; an acc_in job's: bias only
        m.d.comb += ph.eq(Mux(jai[slot(lp)], 2, phase))
        w_ok = Signal()
        # weights and scales come a w_in word at a time (a scale entry = spw scale words);
        # bias one beat at a time: beat ws of the word, taken at its last beat or at the end
        # of the tile (padding)
        ws = Signal(range(max(nsub, 2)))
        part = self.w_in.payload.word_select(ws, B) if nsub > 1 else self.w_in.payload
        new_asm = Signal.like(asm)
        tile_end = Signal()
        m.d.comb += [
            new_asm.eq(Cat(asm[W:], self.w_in.payload)),
            tile_end.eq((ph == 2) & (wcnt == BT - 1)),
            w_ok.eq((lp != wp) & ~full.bit_select(lb, 1)),
            self.w_in.ready.eq(w_ok & ((ph != 2) | (ws == nsub - 1) | tile_end)
                               if nsub > 1 else w_ok),
            ww.addr.eq(wcnt + Mux(lb, ks_max, 0)), ww.data.eq(new_asm[len(asm) - w_word:]),
            sw.addr.eq(wcnt + Mux(lb, se_max, 0)),
            sw.data.eq(new_asm[len(asm) - s_word:] if spw == 1 else self.w_in.payload),
            bw.addr.eq(wcnt + Mux(lb, BT, 0)), bw.data.eq(part),
        ]
        with m.If(self.w_in.valid & self.w_in.ready):
            m.d.sync += st.w_beats.eq(st.w_beats + 1)
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
                    m.d.sync += [full.bit_select(lb, 1).eq(1), avail.bit_select(lb, 1).eq(1),
                                 lb.eq(~lb), phase.eq(0),
                                 wcnt.eq(0), tl.eq(tl + 1)]
                    with m.If(tl == jn[slot(lp)] - 1):
                        m.d.sync += [tl.eq(0), lp.eq(lp + 1)]

        # --- issuer: k-steps of the tile in bank ib, activations of job ip ------------------
        # tokens mi .. mi + A − 1 (those < m_count) run on arrays 0 .. A − 1, same k-step
        ib = Signal()
        issuing = Signal()
        ti = Signal.like(tl)
        mi = Signal(range(self.m_max + A))
        si = Signal(range(ks_max + 1))
        gi = Signal(range(spg))
        xrow = Signal(range(XD + 1))
        x_ok = Signal()
        t_last = Signal.like(mi)                    # the group's last token
        i_m, i_k = jm[slot(ip)], jk[slot(ip)]
        xrs = [xm.read_port() for xm in xmems]
        wr = wmem.read_port()
        sr = smem.read_port()
        go = Signal()
        m.d.comb += go.eq(Cat(*[arr_a.i.ready for arr_a in arrs]).all())
        # a step may use a row once the loader wrote it (early start on the first tile); the
        # issuer passes an acc_in job at once, so the loader may be behind it (x_d > J)
        x_d = Signal(pbits)
        m.d.comb += [
            x_d.eq(xp - ip),
            t_last.eq(Mux(mi + (A - 1) < i_m, mi + (A - 1), i_m - 1) if A > 1 else mi),
            x_ok.eq(((x_d != 0) & (x_d <= J)) | ((x_d == 0) & ((x_tok > t_last) |
                                                               ((x_tok == t_last) &
                                                                (x_step > si))))),
            wr.en.eq(go), sr.en.eq(go),
            wr.addr.eq(si + Mux(ib, ks_max, 0)),
            sr.addr.eq((si >> lg_spg + lg_spw) + Mux(ib, se_max, 0))]
        for xr in xrs:
            m.d.comb += [xr.en.eq(go), xr.addr.eq(xrow + si + Mux(ip[0], XD, 0))]
        v0, g0, l0 = Signal(A), Signal(), Signal()
        s_sel = Signal(max(lg_spw, 1))              # scale word of the entry read
        s_data = sr.data.word_select(s_sel, s_word) if spw > 1 else sr.data
        last_group = Signal()
        m.d.comb += last_group.eq(mi + A >= i_m)
        with m.If(go):
            m.d.sync += [v0.eq(Cat(*[(issuing & x_ok & (mi + a < i_m)) if a else issuing & x_ok
                                     for a in range(A)])),
                         g0.eq(gi == spg - 1), l0.eq(si == i_k - 1)]
            if spw > 1:
                m.d.sync += s_sel.eq((si >> lg_spg)[:lg_spw])
            with m.If(issuing & x_ok):
                m.d.sync += [si.eq(si + 1), gi.eq(gi + 1)]
                with m.If(gi == spg - 1):
                    m.d.sync += gi.eq(0)
                with m.If(si == i_k - 1):
                    m.d.sync += [si.eq(0), gi.eq(0), mi.eq(mi + A), xrow.eq(xrow + i_k)]
                    with m.If(last_group):
                        m.d.sync += [issuing.eq(0), ib.eq(~ib), ti.eq(ti + 1)]
                        with m.If(ti == jn[slot(ip)] - 1):
                            m.d.sync += [ti.eq(0), ip.eq(ip + 1)]
            with m.Elif(~issuing & avail.bit_select(ib, 1) & jai[slot(ip)]):
                # an acc_in job's tile (its bias) goes to the epilogue without array steps
                m.d.sync += [avail.bit_select(ib, 1).eq(0), ib.eq(~ib), ti.eq(ti + 1)]
                with m.If(ti == jn[slot(ip)] - 1):
                    m.d.sync += [ti.eq(0), ip.eq(ip + 1)]
            with m.Elif(~issuing & avail.bit_select(ib, 1)):
                m.d.sync += [issuing.eq(1), avail.bit_select(ib, 1).eq(0), mi.eq(0), si.eq(0),
                             gi.eq(0), xrow.eq(0)]
        # an array takes a step only when all can (they share the weight word)
        for a, (arr_a, xr) in enumerate(zip(arrs, xrs)):
            m.d.comb += [arr_a.i.valid.eq(v0[a] & go if A > 1 else v0[a]),
                         arr_a.i.payload.w.eq(wr.data),
                         arr_a.i.payload.a.eq(xr.data), arr_a.i.payload.scale.eq(s_data),
                         arr_a.i.payload.glast.eq(g0), arr_a.i.payload.last.eq(l0)]
        taken = [Signal(name=f"taken{a}") for a in range(A)]
        m.d.comb += [t.eq(arr_a.i.valid & arr_a.i.ready) for t, arr_a in zip(taken, arrs)]
        m.d.sync += st.steps.eq(st.steps + sum(taken) if A > 1 else
                                st.steps + taken[0])
        with m.If(self.busy):
            m.d.sync += st.active_cycles.eq(st.active_cycles + 1)

        # --- epilogue: job ep, tile bank eb; token em's result from array em mod A --------
        rqs = []
        for a, arr_a in enumerate(arrs):
            rq_a = fifo.SyncFIFOBuffered(width=R * ACC_BITS, depth=2)
            m.submodules["rq" if A == 1 else f"rq{a}"] = rq_a
            m.d.comb += [rq_a.w_data.eq(arr_a.o.payload.as_value()),
                         rq_a.w_en.eq(arr_a.o.valid), arr_a.o.ready.eq(rq_a.w_rdy)]
            rqs.append(rq_a)
        eb = Signal()
        te = Signal.like(tl)
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
        m.d.comb += [tr.addr.eq((em >> lg_tpb) + Mux(ep[0], TD, 0)),
                     br.addr.eq((er >> lg_tpb) + Mux(eb, BT, 0))]
        e_in, e_out = jai[slot(ep)], jao[slot(ep)]
        for a, rq_a in enumerate(rqs):
            sel = (em[:lg_a] == a) if A > 1 else 1
            m.d.comb += rq_a.r_en.eq(~cur_v & sel & ~e_in)
            with m.If(~cur_v & rq_a.r_rdy & sel & ~e_in):
                m.d.sync += [cur.eq(rq_a.r_data), cur_v.eq(1), er.eq(0)]
        # acc_in: element er's summed lanes (lo, hi) from x_in, once its tile's bias is loaded
        lane_ok = Signal()
        lane_lo = Signal(32)
        lane_hi = Signal(32)
        lane_beat_end = Signal()                    # the element ends its x_in beat
        lanes_here = Signal()
        lo_take = Signal()                          # a 32-bit beat's lo lane, latched
        e_ok = Signal()                             # element er is there
        half = Signal()                             # acc_out: lo sent, hi next
        e_step = Signal()                           # element er is done this cycle
        m.d.comb += lanes_here.eq(x_lanes & (xp == ep) & e_in & full.bit_select(eb, 1))
        if B >= ACC_LANES * 32:
            epb = B // (ACC_LANES * 32)             # elements per beat
            pair = self.x_in.payload.word_select(er[:epb.bit_length() - 1], ACC_LANES * 32) \
                if epb > 1 else self.x_in.payload[:ACC_LANES * 32]
            m.d.comb += [lane_ok.eq(lanes_here & self.x_in.valid),
                         lane_lo.eq(pair[:32]), lane_hi.eq(pair[32:64]),
                         lane_beat_end.eq(er[:epb.bit_length() - 1] == epb - 1
                                          if epb > 1 else 1)]
        else:                                       # a 32-bit beat: lo, then hi
            lo_have = Signal()
            lo_reg = Signal(32)
            m.d.comb += [lane_ok.eq(lanes_here & lo_have & self.x_in.valid),
                         lane_lo.eq(lo_reg), lane_hi.eq(self.x_in.payload),
                         lane_beat_end.eq(1)]
            with m.If(lanes_here & ~lo_have):
                m.d.comb += lo_take.eq(1)
                with m.If(self.x_in.valid):
                    m.d.sync += [lo_reg.eq(self.x_in.payload), lo_have.eq(1)]
            with m.If(e_step & e_in):
                m.d.sync += lo_have.eq(0)
        # acc = hi · 2^ACC_LO_BITS + lo, wrapped to ACC_BITS (lo a signed lane sum)
        lane_acc = Signal(signed(ACC_BITS))
        m.d.comb += lane_acc.eq(Cat(lane_lo[:ACC_LO_BITS],
                                    (lane_hi + lane_lo.as_signed()[ACC_LO_BITS:].as_signed())
                                    [:ACC_BITS - ACC_LO_BITS]))
        acc_e = Signal(signed(ACC_BITS))
        m.d.comb += [e_ok.eq(Mux(e_in, lane_ok, cur_v)),
                     acc_e.eq(Mux(e_in, lane_acc, cur.word_select(er, ACC_BITS).as_signed())),
                     e_step.eq(ee & e_ok & (~e_out | half))]
        m.d.comb += x_lanes_take.eq(lo_take | (e_step & e_in & lane_beat_end))
        t_word = tr.data.word_select(em[:lg_tpb], 32) if lg_tpb else tr.data
        b_word = br.data.word_select(er[:lg_tpb], 32) if lg_tpb else br.data
        x_m = t_word[:SCALE_MANT_BITS]
        x_e = t_word[SCALE_MANT_BITS:SCALE_MANT_BITS + SCALE_EXP_BITS].as_signed()
        sh_raw = Signal(signed(SCALE_EXP_BITS + 3))
        m.d.comb += sh_raw.eq(-(je[slot(ep)] + x_e + ACT_FRAC))
        p1 = Signal(signed(ACC_BITS + SCALE_MANT_BITS + 1))
        sh1 = Signal(range(SHIFT_MAX + 1))
        bias1 = Signal(signed(32))
        lane1 = Signal(signed(32))                  # acc_out: the lane sent instead
        raw1 = Signal()
        v1 = Signal()
        with m.If(ee):
            m.d.sync += v1.eq(e_ok)
            with m.If(e_ok):
                m.d.sync += [
                    p1.eq(acc_e * x_m),
                    sh1.eq(Mux(sh_raw < 0, 0, Mux(sh_raw > SHIFT_MAX, SHIFT_MAX, sh_raw))),
                    bias1.eq(b_word), raw1.eq(e_out),
                    lane1.eq(Mux(half, acc_e[ACC_LO_BITS:].as_signed(), acc_e[:ACC_LO_BITS]))]
                with m.If(e_out):
                    m.d.sync += half.eq(~half)
        with m.If(e_step):
            m.d.sync += er.eq(er + 1)
            with m.If(er == R - 1):
                m.d.sync += [cur_v.eq(0), er.eq(0), em.eq(em + 1)]
                with m.If(em == jm[slot(ep)] - 1):
                    m.d.sync += [em.eq(0), eb.eq(~eb), full.bit_select(eb, 1).eq(0),
                                 te.eq(te + 1), st.tiles_done.eq(st.tiles_done + 1)]
                    with m.If(te == jn[slot(ep)] - 1):
                        m.d.sync += [te.eq(0), ep.eq(ep + 1),
                                     xbusy.bit_select(ep[0], 1).eq(0),
                                     st.jobs_done.eq(st.jobs_done + 1)]
                        m.d.comb += x_lanes_end.eq(e_in)
        # E1: round and saturate; E2: bias, saturate, pack
        rounded = gemm_round_shift(m, p1, sh1, len(p1))
        y1 = _sat(m, rounded, ACT.width, "y1")
        y2 = Signal(signed(32))
        b2 = Signal(signed(32))
        v2 = Signal()
        with m.If(ee):
            m.d.sync += [y2.eq(Mux(raw1, lane1, y1)), b2.eq(Mux(raw1, 0, bias1)), v2.eq(v1)]
        ysum = Signal(signed(34))
        m.d.comb += ysum.eq(y2 + b2)
        y3 = _sat(m, ysum, ACT.width, "y3")
        pack = Signal(B)
        pidx = Signal(range(tpb))
        with m.If(ee & v2):
            m.d.sync += [pack.eq(Cat(pack[32:], y3)), pidx.eq(pidx + 1)]
            with m.If(pidx == tpb - 1):
                m.d.sync += [pidx.eq(0), self.o.valid.eq(1),
                             self.o.payload.eq(Cat(pack[32:], y3))]
        return m
