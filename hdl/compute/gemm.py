"""INT4 GEMM engine: queued jobs, ping-pong activation chunks and weight tiles, dot-product array
and dequantising epilogue (paper §5 compute engine and its ping-pong DMA loader, Fig. 2; §6.1
INT4 weights).

The host lays tiles out with :func:`mcf.quant.gemm_tile_blob`; the arithmetic is
:func:`mcf.golden.gemm.gemm` bit for bit, and for tensor-parallel decode's row-parallel GEMM
(``acc_out`` / ``acc_in`` jobs, :data:`mcf.abi.compute.GEMM_JOB`)
:func:`mcf.golden.gemm.partial_lanes` / :func:`mcf.golden.gemm.lanes_epilogue`.
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, signed, unsigned
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
    WEIGHT,
    XQ,
)
from mcf.abi.tp import ACC_LANES, ACC_LO_BITS

from ..mem.uram import UramColumns
from .array_bank import bank_result_layout, bank_step_layout
from .gemm_array import GemmArray
from .gemm_load import GemmActLoader, GemmTileLoader
from .gemm_queue import WALKERS, GemmJobQueue
from .gemm_requant import GemmRequant

__all__ = ["GemmEngine"]


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
    ``tile_ram``: the weight tile banks' RAM, ``"block"`` (as synthesis picks) or ``"ultra"``
    (:class:`~mcf.hdl.mem.uram.UramColumns`: URAM288 columns and the remainder in block RAM;
    the kr260's 1,024-bit × 1,120 banks: 14 URAM and 1 BRAM36 instead of 43 BRAM36 and
    ~1,000 LUT); resource choices only.

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
    st : Out(stream.Signature(:func:`~.array_bank.bank_step_layout`)) — ``shared`` only
        The issuer's steps for arrays outside (an :class:`~.array_bank.ArrayBank`, through an
        :class:`~.array_share.ArrayShare` client port, where prefill attention is the other
        client): every array takes every step; a token group's results of arrays past
        ``m_count`` are dropped here.
    res : In(stream.Signature(:func:`~.array_bank.bank_result_layout`)) — ``shared`` only
        Their results, in step order.

    Latency: a tile's first result leaves ``k_steps + array latency + 5`` cycles after it
    starts computing; steady state is one k-step per cycle on every array (``arrays · rows ·
    lanes`` MACs), across job boundaries too, as long as the next tile and the next job's
    activations have loaded. The epilogue handles one output lane per cycle, ``rows`` cycles
    per token: with ``arrays · rows > k_steps`` (K < 1,024 at 16 × 16, 4 arrays) it, not the
    arrays, sets the rate. An ``acc_out`` job's epilogue takes two cycles per element (one per
    lane); an ``acc_in`` job's one per element, as its lanes arrive.

    Structure: :class:`~.gemm_queue.GemmJobQueue` (the job ring),
    :class:`~.gemm_load.GemmActLoader` and :class:`~.gemm_load.GemmTileLoader` (``x_in`` and
    ``w_in`` into the activation and tile banks), the ``arrays`` :class:`GemmArray` and
    :class:`~.gemm_requant.GemmRequant` (the epilogue's E1–E2 and output register); this
    component holds the banks, their flags and the walkers' pointers, and runs the issuer and
    the epilogue's element selection (the arrays' result FIFOs, ``acc_in`` lanes).
    """

    TILE_RAMS = ("block", "ultra")

    def __init__(self, rows: int = 16, lanes: int = 16, group: int = GROUP_SIZE,
                 k_max: int = 8960, m_max: int = 64, jobs: int = 4, arrays: int = 1,
                 w_width: int | None = None, chain: int = 1, dsp: str = "fabric",
                 shared: bool = False, tile_ram: str = "block"):
        if tile_ram not in self.TILE_RAMS:
            raise ValueError(f"tile_ram must be one of {self.TILE_RAMS}")
        self.tile_ram = tile_ram
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
        self.shared = shared
        # shared: the arrays are outside (an ArrayBank behind an ArrayShare), reached through
        # the ``st`` / ``res`` client ports
        self.arrays = [] if shared else [GemmArray(rows, lanes, group, chain, dsp)
                                         for _ in range(arrays)]
        members = {
            "job": In(stream.Signature(GEMM_JOB)),
            "x_in": In(stream.Signature(unsigned(beat))),
            "w_in": In(stream.Signature(unsigned(w_width))),
            "o": Out(stream.Signature(unsigned(beat))),
            "busy": Out(1),
            "status": Out(GEMM_STATUS),
        }
        if shared:
            members["st"] = Out(stream.Signature(bank_step_layout(arrays, rows, lanes)))
            members["res"] = In(stream.Signature(bank_result_layout(arrays, rows)))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        R, L, G, B = self.rows, self.lanes, self.group, self.beat
        spg = G // L
        lg_spg = spg.bit_length() - 1
        ks_max = self.k_max // L
        tpb = B // 32                               # 32-bit words per beat
        lg_tpb = tpb.bit_length() - 1
        A = self.n_arrays
        lg_a = A.bit_length() - 1
        XD = -(-self.m_max // A) * ks_max           # words per activation (sub-)bank
        TD = -(-self.m_max // tpb)                  # scale beats per bank
        BT = R // tpb                               # bias beats per tile
        st = self.status
        arrs = self.arrays
        for a, arr_a in enumerate(arrs):
            m.submodules["array" if A == 1 else f"array{a}"] = arr_a
        if self.shared:
            # which arrays' results a dot product has (tokens past m_count: none), in order;
            # deep enough for every dot in flight: a dot is a step at least, and the arrays'
            # latency is at most 3 + log2(lanes) + rows + chain ≤ rows + 2·lanes + 3 cycles
            m.submodules.mask = rmask = fifo.SyncFIFOBuffered(width=A, depth=R + 2 * L + 8)
        s_word = R * SCALE_MANT_BITS
        spw = max(1, self.w_width // s_word)        # scale words per w_in word
        lg_spw = spw.bit_length() - 1
        se_max = -(-(self.k_max // G) // spw)       # scale entries per bank

        # activation sub-bank a holds tokens a, a + A, …: row (t // A)·k_steps + step
        xmems = [memory.Memory(shape=unsigned(B), depth=2 * XD, init=[]) for _ in range(A)]
        for a, xm in enumerate(xmems):
            m.submodules["xmem" if A == 1 else f"xmem{a}"] = xm
        m.submodules.tmem = tmem = memory.Memory(shape=unsigned(B), depth=2 * TD, init=[])
        if self.tile_ram == "ultra":
            m.submodules.wmem = wmem = UramColumns(R * L * WEIGHT.width, 2 * ks_max)
            w_wr, wr = wmem.w, wmem.r
        else:
            m.submodules.wmem = wmem = memory.Memory(shape=unsigned(R * L * WEIGHT.width),
                                                     depth=2 * ks_max, init=[])
            w_wr, wr = wmem.write_port(), wmem.read_port()
        m.submodules.smem = smem = memory.Memory(shape=unsigned(s_word * spw),
                                                 depth=2 * se_max, init=[])
        m.submodules.bmem = bmem = memory.Memory(shape=unsigned(B), depth=2 * BT, init=[])

        # --- job queue: a ring read by four walkers (X loader, tile loader, issuer, epilogue)
        J = self.jobs
        pbits = J.bit_length()                      # one wrap bit
        m.submodules.queue = q = GemmJobQueue(self.limits, J)
        wiring.connect(m, wiring.flipped(self.job), q.job)
        wp = q.tail
        xp, lp, ip, ep = (Signal(pbits, name=f"jq_{w}") for w in WALKERS)
        m.d.comb += [q.x_ptr.eq(xp), q.l_ptr.eq(lp), q.i_ptr.eq(ip), q.e_ptr.eq(ep),
                     self.busy.eq(q.busy)]
        with m.If(q.accepted):
            m.d.sync += st.jobs.eq(st.jobs + 1)
        with m.If(q.rejected):
            m.d.sync += st.bad_jobs.eq(st.bad_jobs + 1)

        # --- activation loader: job xp into bank xp[0] (scale beats, then codes) ------------
        xbusy = Signal(2)                           # bank loaded or loading, not yet released
        m.submodules.x_loader = xl = GemmActLoader(B, A, self.m_max, ks_max, XD, TD)
        wiring.connect(m, wiring.flipped(self.x_in), xl.x_in)
        wiring.connect(m, xl.t_wr, tmem.write_port())
        for a, xm in enumerate(xmems):
            wiring.connect(m, getattr(xl, f"x_wr{a}"), xm.write_port())
        m.d.comb += [xl.queued.eq(xp != wp), xl.bank.eq(xp[0]),
                     xl.bank_busy.eq(xbusy.bit_select(xp[0], 1)), xl.m_count.eq(q.x_job.m_count),
                     xl.k_steps.eq(q.x_job.k_steps), xl.acc_in.eq(q.x_job.acc_in)]
        with m.If(xl.start):
            m.d.sync += xbusy.bit_select(xp[0], 1).eq(1)
        with m.If(self.x_in.valid & self.x_in.ready):
            m.d.sync += st.x_beats.eq(st.x_beats + 1)
        with m.If(xl.done):
            m.d.sync += xp.eq(xp + 1)

        # --- tile loader: tiles of job lp into bank lb (ping-pong across jobs) --------------
        full = Signal(2)                            # bank held: loaded, results not all out
        avail = Signal(2)                           # bank loaded, not yet taken by the issuer
        m.submodules.w_loader = wl = GemmTileLoader(R, L, B, self.w_width, ks_max, se_max, spg)
        wiring.connect(m, wiring.flipped(self.w_in), wl.w_in)
        wiring.connect(m, wl.w_wr, w_wr)
        wiring.connect(m, wl.s_wr, smem.write_port())
        wiring.connect(m, wl.b_wr, bmem.write_port())
        m.d.comb += [wl.queued.eq(lp != wp), wl.held.eq(full), wl.k_steps.eq(q.l_job.k_steps),
                     wl.n_tiles.eq(q.l_job.n_tiles), wl.acc_in.eq(q.l_job.acc_in)]
        with m.If(self.w_in.valid & self.w_in.ready):
            m.d.sync += st.w_beats.eq(st.w_beats + 1)
        with m.If(wl.loaded):
            m.d.sync += [full.bit_select(wl.bank, 1).eq(1), avail.bit_select(wl.bank, 1).eq(1)]
        with m.If(wl.done):
            m.d.sync += lp.eq(lp + 1)

        # --- issuer: k-steps of the tile in bank ib, activations of job ip ------------------
        # tokens mi .. mi + A − 1 (those < m_count) run on arrays 0 .. A − 1, same k-step
        ib = Signal()
        issuing = Signal()
        ti = Signal.like(q.i_job.n_tiles)
        mi = Signal(range(self.m_max + A))
        si = Signal(range(ks_max + 1))
        gi = Signal(range(spg))
        xrow = Signal(range(XD + 1))
        x_ok = Signal()
        t_last = Signal.like(mi)                    # the group's last token
        i_m, i_k = q.i_job.m_count, q.i_job.k_steps
        xrs = [xm.read_port() for xm in xmems]
        sr = smem.read_port()
        go = Signal()
        if self.shared:
            m.d.comb += go.eq((~self.st.valid | self.st.ready) & rmask.w_rdy)
        else:
            m.d.comb += go.eq(Cat(*[arr_a.i.ready for arr_a in arrs]).all())
        # a step may use a row once the loader wrote it (early start on the first tile); the
        # issuer passes an acc_in job at once, so the loader may be behind it (x_d > J)
        x_d = Signal(pbits)
        m.d.comb += [
            x_d.eq(xp - ip),
            t_last.eq(Mux(mi + (A - 1) < i_m, mi + (A - 1), i_m - 1) if A > 1 else mi),
            x_ok.eq(((x_d != 0) & (x_d <= J)) | ((x_d == 0) & ((xl.tok > t_last) |
                                                               ((xl.tok == t_last) &
                                                                (xl.step > si))))),
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
                        with m.If(ti == q.i_job.n_tiles - 1):
                            m.d.sync += [ti.eq(0), ip.eq(ip + 1)]
            with m.Elif(~issuing & avail.bit_select(ib, 1) & q.i_job.acc_in):
                # an acc_in job's tile (its bias) goes to the epilogue without array steps
                m.d.sync += [avail.bit_select(ib, 1).eq(0), ib.eq(~ib), ti.eq(ti + 1)]
                with m.If(ti == q.i_job.n_tiles - 1):
                    m.d.sync += [ti.eq(0), ip.eq(ip + 1)]
            with m.Elif(~issuing & avail.bit_select(ib, 1)):
                m.d.sync += [issuing.eq(1), avail.bit_select(ib, 1).eq(0), mi.eq(0), si.eq(0),
                             gi.eq(0), xrow.eq(0)]
        # an array takes a step only when all can (they share the weight word)
        taken = [Signal(name=f"taken{a}") for a in range(A)]
        if self.shared:
            # every array takes the step (lockstep); the results of tokens past m_count drop
            sp = self.st.payload
            m.d.comb += [self.st.valid.eq(v0[0]), sp.w.eq(wr.data), sp.scale.eq(s_data),
                         sp.glast.eq(g0), sp.last.eq(l0),
                         rmask.w_en.eq(self.st.valid & self.st.ready & l0),
                         rmask.w_data.eq(v0)]
            m.d.comb += [sp.a[a].eq(xr.data) for a, xr in enumerate(xrs)]
            m.d.comb += [t.eq(self.st.valid & self.st.ready & v0[a])
                         for a, t in enumerate(taken)]
        for a, (arr_a, xr) in enumerate(zip(arrs, xrs)):
            m.d.comb += [arr_a.i.valid.eq(v0[a] & go if A > 1 else v0[a]),
                         arr_a.i.payload.w.eq(wr.data),
                         arr_a.i.payload.a.eq(xr.data), arr_a.i.payload.scale.eq(s_data),
                         arr_a.i.payload.glast.eq(g0), arr_a.i.payload.last.eq(l0)]
            m.d.comb += taken[a].eq(arr_a.i.valid & arr_a.i.ready)
        m.d.sync += st.steps.eq(st.steps + sum(taken) if A > 1 else
                                st.steps + taken[0])
        with m.If(self.busy):
            m.d.sync += st.active_cycles.eq(st.active_cycles + 1)

        # --- epilogue: job ep, tile bank eb; token em's result from array em mod A --------
        rqs = []
        for a in range(A):
            rq_a = fifo.SyncFIFOBuffered(width=R * ACC_BITS, depth=2)
            m.submodules["rq" if A == 1 else f"rq{a}"] = rq_a
            rqs.append(rq_a)
        if self.shared:
            res = self.res
            need = rmask.r_data
            m.d.comb += [res.ready.eq(rmask.r_rdy & Cat(*[~need[a] | rq_a.w_rdy
                                                          for a, rq_a in enumerate(rqs)]).all()),
                         rmask.r_en.eq(res.valid & res.ready)]
            for a, rq_a in enumerate(rqs):
                m.d.comb += [rq_a.w_data.eq(res.payload[a].as_value()),
                             rq_a.w_en.eq(res.valid & res.ready & need[a])]
        for arr_a, rq_a in zip(arrs, rqs):
            m.d.comb += [rq_a.w_data.eq(arr_a.o.payload.as_value()),
                         rq_a.w_en.eq(arr_a.o.valid), arr_a.o.ready.eq(rq_a.w_rdy)]
        eb = Signal()
        te = Signal.like(q.i_job.n_tiles)
        em = Signal(range(self.m_max + 1))
        er = Signal(range(R + 1))
        cur = Signal(R * ACC_BITS)
        cur_v = Signal()
        tr = tmem.read_port(domain="comb")
        br = bmem.read_port(domain="comb")
        m.submodules.requant = rqt = GemmRequant(B)
        wiring.connect(m, rqt.o, wiring.flipped(self.o))
        ee = rqt.i.ready                            # the requantiser's pipeline moves
        # E0: pick lane er of the current vector
        m.d.comb += [tr.addr.eq((em >> lg_tpb) + Mux(ep[0], TD, 0)),
                     br.addr.eq((er >> lg_tpb) + Mux(eb, BT, 0))]
        e_in, e_out = q.e_job.acc_in, q.e_job.acc_out
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
        m.d.comb += lanes_here.eq(xl.lanes & (xp == ep) & e_in & full.bit_select(eb, 1))
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
        m.d.comb += xl.lanes_take.eq(lo_take | (e_step & e_in & lane_beat_end))
        t_word = tr.data.word_select(em[:lg_tpb], 32) if lg_tpb else tr.data
        b_word = br.data.word_select(er[:lg_tpb], 32) if lg_tpb else br.data
        x_m = t_word[:SCALE_MANT_BITS]
        x_e = t_word[SCALE_MANT_BITS:SCALE_MANT_BITS + SCALE_EXP_BITS].as_signed()
        sh_raw = Signal(signed(SCALE_EXP_BITS + 3))
        m.d.comb += sh_raw.eq(-(q.e_job.w_exp + x_e + ACT_FRAC))
        elem = rqt.i.payload
        m.d.comb += [rqt.i.valid.eq(e_ok), elem.acc.eq(acc_e), elem.x_m.eq(x_m),
                     elem.shift.eq(sh_raw), elem.bias.eq(b_word), elem.raw.eq(e_out),
                     elem.lane.eq(Mux(half, acc_e[ACC_LO_BITS:].as_signed(),
                                      acc_e[:ACC_LO_BITS]))]
        with m.If(ee & e_ok & e_out):
            m.d.sync += half.eq(~half)
        with m.If(e_step):
            m.d.sync += er.eq(er + 1)
            with m.If(er == R - 1):
                m.d.sync += [cur_v.eq(0), er.eq(0), em.eq(em + 1)]
                with m.If(em == q.e_job.m_count - 1):
                    m.d.sync += [em.eq(0), eb.eq(~eb), full.bit_select(eb, 1).eq(0),
                                 te.eq(te + 1), st.tiles_done.eq(st.tiles_done + 1)]
                    with m.If(te == q.e_job.n_tiles - 1):
                        m.d.sync += [te.eq(0), ep.eq(ep + 1),
                                     xbusy.bit_select(ep[0], 1).eq(0),
                                     st.jobs_done.eq(st.jobs_done + 1)]
                        m.d.comb += xl.lanes_end.eq(e_in)
        return m
