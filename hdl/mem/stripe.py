"""Stripe readers: one weight matrix read from all four HP ports in lockstep into the GEMM's wide
``w_in`` (docs/node.md §4 "HP-port allocation: weights striped over all four ports"; paper §5,
Fig. 2: the memory frontend streaming weights from DDR).

The driver lays every weight matrix out as ``ports`` stripe blobs (stripe ``p`` = beats
``ports·i + p`` of the engine's weight stream, :func:`mcf.quant.gemm_stripe_image`); one
:class:`~mcf.hdl.mem.dma.DmaReader` per port reads its stripe, and word ``i`` of ``w_in`` is beat
``i`` of every stripe, stripe 0 in the low bits. The readers' receive FIFOs are the reorder
buffers: each port runs ahead of the others by up to its FIFO, bursts are issued only when their
beats fit, so no R channel is ever held by a port waiting for another.
"""

from __future__ import annotations

from amaranth import Cat, Module, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.compute import STRIPE_STATUS, WEIGHT_STRIPES, stripe_job_layout

from .axi import ADDR_BITS, AXI4Signature
from .dma import DmaReader, off_align

__all__ = ["StripeReader"]


def _times(value, k: int):
    """``value · k`` for a constant ``k`` as a sum of shifts (adders, no DSP slice)."""
    terms = [value << b for b in range(k.bit_length()) if k >> b & 1]
    return sum(terms[1:], terms[0]) if terms else 0


class StripeReader(wiring.Component):
    """``ports`` AXI4 read masters in lockstep → one stream of ``ports · data_width``-bit words.

    Parameters
    ----------
    ports : int
        Stripes, one per HP port (:data:`mcf.abi.compute.WEIGHT_STRIPES` on the kr260).
    data_width, addr_width, outstanding, fifo_depth :
        Of each port's :class:`~mcf.hdl.mem.dma.DmaReader` (beat width, address width, bursts
        in flight, receive FIFO depth in beats).
    jobs : int
        Depth of the job queue.
    align : int
        Bytes every stripe row starts on (default: a beat, ``data_width / 8``): the readers
        need no realigner (:class:`~mcf.hdl.mem.dma.DmaReader` ``align``, ≈ 440 LUT each at
        128 bits); a job whose ``addr``, ``pitch`` or ``stride`` is not a multiple is rejected.

    Members
    -------
    job : In(stream.Signature(:func:`mcf.abi.compute.stripe_job_layout`))
        Weight matrices (:class:`mcf.abi.compute.StripeJob`), queued up to ``jobs`` deep. Each
        port takes its stripe's descriptor (``addr + p·pitch``, ``length``, ``stride``,
        ``count``) as soon as it has issued the last burst of the previous job, so the next
        job's weights are requested while the current one is consumed (prefetch: up to
        ``fifo_depth`` beats per port). A job with ``length = 0`` or ``count = 0``, or with
        ``addr``, ``pitch`` or ``stride`` off ``align`` bytes, is taken, counted in
        ``status.rejects`` and reads nothing.
    o : Out(stream.Signature(unsigned(ports · data_width)))
        The words, job after job: word ``i`` of a job = beat ``i`` of each stripe's rows (each
        row from lane 0; a row's final beat partial when ``length`` is not a whole number of
        beats — lanes beyond it undefined), stripe ``p`` in bits ``p·data_width`` up. For the
        GEMM's ``w_in`` (:func:`mcf.abi.compute.gemm_w_stream` words). Stream rules: ``valid``
        never waits for ``ready``; the payload holds until taken.
    job_done : Out(1)
        One-cycle pulse the cycle after a job's final word was taken.
    busy : Out(1)
        A job is queued or has words not yet taken.
    bus0 … bus{ports-1} : Out(AXI4Signature(addr_width, data_width))
        One AXI4 master per HP port (R half only; AW/W idle), each a client of that port's
        :class:`~mcf.hdl.mem.axi_mux.AxiPortMux`. ``rready`` is always high.
    status : Out(:data:`mcf.abi.compute.STRIPE_STATUS`)
        Jobs accepted / completed / rejected, words delivered, words marked ``err`` by some
        port's reader (a SLVERR/DECERR beat; the data still flow), cycles ``busy``.

    Latency (ideal ports): on an idle reader a job's first AR is valid on every port five
    cycles after the job's handshake (two in the queue, three in :class:`DmaReader`); its first
    word is valid four cycles after the first R beat of the slowest port, when the next beat
    follows at once (the reader's FIFO and realigner); the join adds none. Throughput: one word
    per cycle while every port delivers one beat per cycle, across job boundaries too (a job
    costs one or two extra cycles in each reader's realigner).
    """

    def __init__(self, ports: int = WEIGHT_STRIPES, data_width: int = 128,
                 addr_width: int = ADDR_BITS, jobs: int = 4, outstanding: int = 8,
                 fifo_depth: int = 512, align: int | None = None):
        if ports < 1:
            raise ValueError("at least one port")
        self._ports, self._data_width, self._jobs = ports, data_width, jobs
        self.align = data_width // 8 if align is None else align
        self.readers = [DmaReader(data_width, addr_width, outstanding, fifo_depth, self.align)
                        for _ in range(ports)]
        self._job_layout = stripe_job_layout(addr_width)
        super().__init__({
            "job": In(stream.Signature(self._job_layout)),
            "o": Out(stream.Signature(unsigned(ports * data_width))),
            "job_done": Out(1),
            "busy": Out(1),
            **{f"bus{p}": Out(AXI4Signature(addr_width, data_width)) for p in range(ports)},
            "status": Out(STRIPE_STATUS),
        })

    @property
    def n_ports(self) -> int:
        return self._ports

    @property
    def data_width(self) -> int:
        return self._data_width

    def elaborate(self, platform):
        m = Module()
        P = self._ports
        st = self.status
        rds = self.readers
        for p, rd in enumerate(rds):
            m.submodules[f"reader{p}"] = rd
            wiring.connect(m, rd.bus, wiring.flipped(getattr(self, f"bus{p}")))

        # job queue → one descriptor per port; the head leaves when every port has taken it
        lay = self._job_layout
        # each entry carries whether the job reads anything (issue #35: so the head's test is a
        # flip-flop, not compares of its fields in front of every port's descriptor valid)
        m.submodules.queue = q = fifo.SyncFIFOBuffered(width=lay.size + 1, depth=self._jobs)
        job = self.job.payload
        on_align = ~off_align(job.addr | job.pitch | job.stride, self.align)
        m.d.comb += [q.w_data.eq(Cat(job.as_value(),
                                     (job.length != 0) & (job.count != 0) & on_align)),
                     q.w_en.eq(self.job.valid), self.job.ready.eq(q.w_rdy)]
        head = data.View(lay, q.r_data[:lay.size])
        good = Signal()
        m.d.comb += good.eq(q.r_data[lay.size])
        taken = Signal(P)               # ports that took the head job's descriptor
        now = Signal(P)
        for p, rd in enumerate(rds):
            d = rd.desc
            m.d.comb += [d.valid.eq(q.r_rdy & good & ~taken[p]),
                         d.payload.addr.eq(head.addr + _times(head.pitch, p)),
                         d.payload.length.eq(head.length), d.payload.stride.eq(head.stride),
                         d.payload.count.eq(head.count),
                         now[p].eq(d.valid & d.ready)]
        pending = Signal(16)            # accepted jobs with words still to go
        pop = Signal()
        m.d.comb += pop.eq(q.r_rdy & (~good | ((taken | now) == (1 << P) - 1)))
        m.d.comb += q.r_en.eq(pop)
        with m.If(pop):
            m.d.sync += taken.eq(0)
            with m.If(good):
                m.d.sync += st.jobs.eq(st.jobs + 1)
            with m.Else():
                m.d.sync += st.rejects.eq(st.rejects + 1)
        with m.Else():
            m.d.sync += taken.eq(taken | now)

        # lockstep join: a word leaves when every port has its beat
        all_valid = Signal()
        m.d.comb += all_valid.eq(Cat(rd.o.valid for rd in rds).all())
        m.d.comb += [self.o.valid.eq(all_valid),
                     self.o.payload.eq(Cat(rd.o.payload.data for rd in rds))]
        for rd in rds:
            m.d.comb += rd.o.ready.eq(self.o.ready & all_valid)
        take = Signal()
        last = Signal()
        m.d.comb += [take.eq(self.o.valid & self.o.ready), last.eq(take & rds[0].o.payload.last)]
        m.d.sync += self.job_done.eq(last)
        with m.If(take):
            m.d.sync += st.words.eq(st.words + 1)
            with m.If(Cat(rd.o.payload.err for rd in rds).any()):
                m.d.sync += st.errors.eq(st.errors + 1)
        with m.If(last):
            m.d.sync += st.jobs_done.eq(st.jobs_done + 1)
        m.d.sync += pending.eq(pending + (pop & good) - last)
        m.d.comb += self.busy.eq(q.r_rdy | (pending != 0))
        m.d.sync += st.busy_cycles.eq(st.busy_cycles + self.busy)
        return m
