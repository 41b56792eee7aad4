"""Host/hardware contract of the matrix half of the compute engine (paper §5, Fig. 2: the
ping-pong DMA loader, the INT4 GEMM engine, the vector unit): the DMA descriptor, the GEMM job
descriptor and the status-counter layouts the HDL drives. Host code packs descriptors with the
very layouts the hardware decodes (``pack``/``unpack`` as :class:`mcf.abi.meta.Meta`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from amaranth.hdl import signed, unsigned
from amaranth.lib import data

from .platform import HP_PORTS
from .quant import GROUP_SIZE, SCALE_EXP_BITS, SCALE_MANT_BITS
from .regs import counters
from .tp import ACC_LANES

__all__ = [
    "DMA_ADDR_BITS", "DMA_LENGTH_BITS", "DMA_STRIDE_BITS", "DMA_COUNT_BITS", "dma_desc_layout",
    "DMA_DESC", "DmaDesc", "GEMM_JOB", "GemmJob", "GEMM_JOB_FIELD_BITS", "GemmLimits",
    "DMA_READ_STATUS", "DMA_WRITE_STATUS", "DMA_STATUS", "GEMM_STATUS", "VECTOR_STATUS",
    "COMPUTE_BUSY_STATUS",
    "status_values", "gemm_x_stream", "gemm_w_stream", "gemm_w_stripes",
    "gemm_lanes_x_stream", "gemm_bias_stream",
    "WEIGHT_STRIPES", "STRIPE_ALIGN", "stripe_job_layout", "STRIPE_JOB", "StripeJob",
    "STRIPE_STATUS",
]

DMA_ADDR_BITS = 40  # ZU+ HP ports take 49 bits; the K26's DDR needs 36 (upper 2 GiB at 32 GiB)
DMA_LENGTH_BITS = 24
DMA_STRIDE_BITS = 32
DMA_COUNT_BITS = 16


def dma_desc_layout(addr_bits: int = DMA_ADDR_BITS) -> data.StructLayout:
    """A 2-D transfer: ``count`` rows of ``length`` bytes, row ``i`` at ``addr + i·stride``.
    Any byte alignment, or (an engine built with ``align``, :class:`mcf.hdl.mem.dma.DmaReader`)
    ``addr`` and ``stride`` on ``align`` bytes — the node's JOB, stripe, EMIT and decode-landing
    engines (:data:`mcf.abi.jobs.JOB_ALIGN`, ...); ``length = 0`` or ``count = 0``, or a row off
    the engine's ``align``, is rejected (counted, no bus access)."""
    return data.StructLayout({
        "addr": unsigned(addr_bits),
        "length": unsigned(DMA_LENGTH_BITS),
        "stride": unsigned(DMA_STRIDE_BITS),
        "count": unsigned(DMA_COUNT_BITS),
    })


DMA_DESC = dma_desc_layout()


def _check_fits(obj, layout: data.StructLayout) -> dict:
    fields = dataclasses.asdict(obj)
    for name, fld in layout:
        shape = fld.shape
        lo, hi = (-(1 << (shape.width - 1)), 1 << (shape.width - 1)) if shape.signed \
            else (0, 1 << shape.width)
        if not lo <= fields[name] < hi:
            raise ValueError(f"{type(obj).__name__}.{name}={fields[name]} does not fit in "
                             f"{shape}")
    return fields


@dataclass(frozen=True)
class DmaDesc:
    """Host view of one DMA descriptor (:data:`DMA_DESC`)."""
    addr: int
    length: int
    stride: int = 0
    count: int = 1

    def pack(self, layout: data.StructLayout = DMA_DESC) -> int:
        """The descriptor as an integer (bit 0 = ``addr`` LSB). Raises on out-of-range fields."""
        return layout.const(_check_fits(self, layout)).as_bits()

    @classmethod
    def unpack(cls, raw: int, layout: data.StructLayout = DMA_DESC) -> DmaDesc:
        view = layout.from_bits(raw)
        return cls(**{name: int(view[name]) for name, _ in layout})

    @property
    def nbytes(self) -> int:
        return self.length * self.count


GEMM_JOB_FIELD_BITS = 16

GEMM_JOB = data.StructLayout({
    "m_count": unsigned(GEMM_JOB_FIELD_BITS),   # tokens (rows of X), 1 .. m_max
    "k_steps": unsigned(GEMM_JOB_FIELD_BITS),   # K / lanes; K a multiple of the group
    "n_tiles": unsigned(GEMM_JOB_FIELD_BITS),   # N / rows
    "w_exp": signed(SCALE_EXP_BITS),            # the weight tensor's shared scale exponent
    "acc_in": unsigned(1),                      # accumulators from summed lanes (x_in)
    "acc_out": unsigned(1),                     # accumulators out as lanes, no epilogue
})
"""One GEMM job ``Y[M, N] = epilogue(X[M, K] · W[N, K]ᵀ)``. The engine queues jobs and runs
them back to back: a job's activations and first weight tile load while the previous job
computes (ping-pong). A job with a zero or out-of-range field is rejected and counted
(:meth:`GemmLimits.accepts`; ``k_steps`` is checked in ``acc_in`` jobs too, though unused).

The two flags are tensor-parallel decode's row-parallel GEMM (:mod:`mcf.abi.tp`):

* ``acc_out``: the results are each element's exact accumulator as :data:`mcf.abi.tp.ACC_LANES`
  32-bit SUM lanes (:func:`mcf.abi.tp.acc_lanes`: ``lo, hi``), not the epilogue's ACT code:
  ``rows · ACC_LANES`` lanes per token and tile (:func:`mcf.golden.gemm.partial_lanes`).
* ``acc_in``: no weights and no array steps; ``x_in`` brings, after the scale words, the
  summed lanes (:func:`gemm_lanes_x_stream`), ``w_in`` only each tile's bias
  (:func:`gemm_bias_stream`), and the epilogue runs on ``lanes_acc`` wrapped to ACC_BITS
  (:func:`mcf.golden.gemm.lanes_epilogue`).
"""


@dataclass(frozen=True)
class GemmLimits:
    """The jobs one GEMM engine runs: ``m_count`` in 1..``m_max``, ``k_steps`` in
    1..``k_max / lanes`` and a whole number of groups, ``n_tiles`` ≥ 1. The engine takes any
    other job, counts it (``bad_jobs``) and ignores it; the template walker refuses a JOB at
    such a GEMM entry before any of that job's data moves (:func:`mcf.abi.jobs.walk`)."""
    m_max: int
    k_max: int
    lanes: int = 16
    group: int = GROUP_SIZE

    def accepts(self, m_count, k_steps, n_tiles):
        """Whether the engine runs a job with these fields: on ints (a ``bool``) or on Amaranth
        values (a 1-bit expression) — the one predicate of the engine, the walker and its golden
        model."""
        steps_per_group = self.group // self.lanes
        return ((m_count != 0) & (m_count <= self.m_max) & (k_steps != 0) &
                (k_steps <= self.k_max // self.lanes) & (n_tiles != 0) &
                ((k_steps & (steps_per_group - 1)) == 0))


@dataclass(frozen=True)
class GemmJob:
    """Host view of :data:`GEMM_JOB`."""
    m_count: int
    k_steps: int
    n_tiles: int
    w_exp: int
    acc_in: int = 0
    acc_out: int = 0

    def pack(self) -> int:
        return GEMM_JOB.const(_check_fits(self, GEMM_JOB)).as_bits()

    @classmethod
    def unpack(cls, raw: int) -> GemmJob:
        view = GEMM_JOB.from_bits(raw)
        return cls(**{name: int(view[name]) for name, _ in GEMM_JOB})

    @classmethod
    def for_shape(cls, m: int, n: int, k: int, w_exp: int, rows: int = 16,
                  lanes: int = 16, acc_in: int = 0, acc_out: int = 0) -> GemmJob:
        if n % rows or k % lanes:
            raise ValueError(f"N={n} must be a multiple of {rows} and K={k} of {lanes}")
        return cls(m, k // lanes, n // rows, w_exp, acc_in, acc_out)

    def x_descriptors(self, xq_addr: int, lanes: int = 16) -> list[DmaDesc]:
        """The activation stream from a requantised chunk at ``xq_addr`` (codes token-major,
        then the scale words, as the vector unit writes it): scale words first, then codes."""
        k = self.k_steps * lanes
        return [DmaDesc(xq_addr + self.m_count * k, 4 * self.m_count),
                DmaDesc(xq_addr, self.m_count * k)]


def gemm_x_stream(x_blob: bytes, m: int, k: int, beat_bytes: int) -> bytes:
    """The engine's activation stream from :func:`mcf.quant.gemm_x_blob` (codes, then scale
    words): the ``m`` scale words first (padded to a beat), then the ``m·k`` codes — what the
    two descriptors of :meth:`GemmJob.x_descriptors` deliver."""
    scales = x_blob[m * k:m * k + 4 * m]
    return scales + bytes((-len(scales)) % beat_bytes) + x_blob[:m * k]


def gemm_w_stream(tile_blob: bytes, k_steps: int, n_tiles: int, rows: int, lanes: int,
                  word_bytes: int, group: int = GROUP_SIZE) -> bytes:
    """The engine's weight stream for a ``w_in`` of ``word_bytes`` bytes from
    :func:`mcf.quant.gemm_tile_blob`: per tile, the weight words, then the scale words and then
    the bias, each of the two padded with zeros to a whole ``w_in`` word (the engine drops the
    padding). Equal to the tile blob when each part is already whole words (always for
    ``word_bytes`` = the beat; for 64 B at 16 × 16 when ``K / group`` is even)."""
    tile = len(tile_blob) // n_tiles
    w_bytes = k_steps * rows * lanes // 2
    s_bytes = k_steps * lanes // group * rows * SCALE_MANT_BITS // 8
    if tile * n_tiles != len(tile_blob) or w_bytes % word_bytes or tile <= w_bytes + s_bytes:
        raise ValueError("blob is not n_tiles tiles of whole weight words, scales and bias")

    def pad(b: bytes) -> bytes:
        return b + bytes((-len(b)) % word_bytes)

    out = bytearray()
    for t in range(n_tiles):
        blob = tile_blob[t * tile:(t + 1) * tile]
        out += blob[:w_bytes] + pad(blob[w_bytes:w_bytes + s_bytes]) + pad(blob[w_bytes + s_bytes:])
    return bytes(out)


def gemm_lanes_x_stream(scale_words: bytes, lanes, rows: int, beat_bytes: int) -> bytes:
    """An ``acc_in`` job's activation stream: the ``m`` scale words (padded to a beat), then the
    summed lanes ``lanes[m, 2n]`` (signed 32-bit; :func:`mcf.abi.tp.acc_lanes` order) tile by
    tile, token by token inside a tile (``rows · ACC_LANES`` lanes each) — the order an
    ``acc_out`` job writes them; for ``m = 1`` the row as it is."""
    v = np.asarray(lanes, dtype=np.int64)
    m, w = v.shape
    per = rows * ACC_LANES
    tiles = v.reshape(m, w // per, per).transpose(1, 0, 2)
    return (scale_words + bytes((-len(scale_words)) % beat_bytes)
            + (tiles & 0xFFFFFFFF).astype("<u4").tobytes())


def gemm_bias_stream(tile_blob: bytes, n_tiles: int, rows: int, word_bytes: int) -> bytes:
    """An ``acc_in`` job's weight stream from :func:`mcf.quant.gemm_tile_blob`: each tile's
    ``rows`` bias words only (the blob's last ``rows · 4`` bytes of each tile; one 2-D read),
    each padded to a whole ``w_in`` word of ``word_bytes``."""
    tile = len(tile_blob) // n_tiles
    b = rows * 4
    return b"".join(tile_blob[(t + 1) * tile - b:(t + 1) * tile] + bytes((-b) % word_bytes)
                    for t in range(n_tiles))


def gemm_w_stripes(w_stream: bytes, ports: int, beat_bytes: int) -> list[bytes]:
    """The weight stream split over ``ports`` HP ports read in lockstep (docs/node.md §4):
    stripe ``p`` = beats ``ports·i + p``; ``w_in`` word ``i`` is beat ``i`` of every stripe,
    stripe 0 in the low bits."""
    word = ports * beat_bytes
    if len(w_stream) % word:
        raise ValueError("the stream is not a whole number of w_in words")
    return [b"".join(w_stream[i + p * beat_bytes:i + (p + 1) * beat_bytes]
                     for i in range(0, len(w_stream), word)) for p in range(ports)]


WEIGHT_STRIPES = HP_PORTS
"""Stripes of a weight stream on the kr260 node, one per HP port, read in lockstep into a
``WEIGHT_STRIPES × 16`` B = 64 B ``w_in`` (docs/node.md §4; :func:`gemm_w_stripes`). Both node
configurations (``kr260`` and ``sim``) read their weights this way: one stripe per HP port."""

STRIPE_ALIGN = 4096
"""Alignment of each stripe of a weight matrix in DDR (:func:`mcf.quant.gemm_stripe_image`): a
stripe's ``pitch`` is a whole number of these (a 4 KiB page: no AXI burst of one stripe crosses
into the next), and a template's STRIPE entry carries ``pitch`` in these units
(:data:`mcf.abi.jobs.TEMPLATE_ENTRY` ``ext``)."""


def stripe_job_layout(addr_bits: int = DMA_ADDR_BITS) -> data.StructLayout:
    """One weight matrix for the stripe readers (:class:`mcf.hdl.mem.stripe.StripeReader`):
    stripe ``p`` is the 2-D transfer ``count`` rows of ``length`` bytes, row ``i`` at
    ``addr + p·pitch + i·stride`` (every stripe the same shape: they are read in lockstep).
    ``addr``, ``pitch`` and ``stride`` are multiples of a bus beat (16 B: the readers have no
    realigner); a job off a beat, or with ``length = 0`` or ``count = 0``, is rejected
    (counted, no bus access)."""
    return data.StructLayout({
        "addr": unsigned(addr_bits),
        "pitch": unsigned(DMA_STRIDE_BITS),
        "length": unsigned(DMA_LENGTH_BITS),
        "stride": unsigned(DMA_STRIDE_BITS),
        "count": unsigned(DMA_COUNT_BITS),
    })


STRIPE_JOB = stripe_job_layout()


@dataclass(frozen=True)
class StripeJob:
    """Host view of :data:`STRIPE_JOB`."""
    addr: int
    length: int
    pitch: int
    stride: int = 0
    count: int = 1

    def pack(self, layout: data.StructLayout = STRIPE_JOB) -> int:
        return layout.const(_check_fits(self, layout)).as_bits()

    @classmethod
    def unpack(cls, raw: int, layout: data.StructLayout = STRIPE_JOB) -> StripeJob:
        view = layout.from_bits(raw)
        return cls(**{name: int(view[name]) for name, _ in layout})

    def descriptors(self, ports: int = WEIGHT_STRIPES) -> list[DmaDesc]:
        """The DMA descriptor of each stripe reader (stripe ``p`` on port ``p``)."""
        return [DmaDesc(self.addr + p * self.pitch, self.length, self.stride, self.count)
                for p in range(ports)]

    def words(self, beat_bytes: int) -> int:
        """``w_in`` words the job delivers: one per beat of a stripe (each row from lane 0,
        its final beat partial when ``length`` is not a whole number of beats)."""
        return self.count * -(-self.length // beat_bytes)


DMA_READ_STATUS = counters("descs", "beats", "rejects", "errors", "last_resp")
"""DMA read path: descriptors completed (last beat delivered), bus beats received, descriptors
rejected (zero length/count), non-OKAY read beats, the last non-OKAY ``RRESP`` code."""

DMA_WRITE_STATUS = counters("descs", "bursts", "rejects", "errors", "last_resp")
"""DMA write path: descriptors accepted, write bursts acknowledged, descriptors rejected,
non-OKAY write responses, the last non-OKAY ``BRESP`` code."""

DMA_STATUS = counters(*(f"rd_{n}" for n, _ in DMA_READ_STATUS),
                      *(f"wr_{n}" for n, _ in DMA_WRITE_STATUS))
"""One DMA loader (read and write path on one HP port)."""

GEMM_STATUS = counters("jobs", "jobs_done", "bad_jobs", "tiles_done", "steps", "active_cycles",
                       "x_beats", "w_beats")
"""GEMM engine: jobs accepted / completed / rejected, weight tiles completed, k-steps issued to
the array (each ``rows·lanes`` MACs), cycles with a job in flight, activation and weight beats
taken. ``steps / active_cycles`` is the MAC utilisation over a run of back-to-back jobs."""

VECTOR_STATUS = counters("tokens", "beats_in", "beats_out")
"""Vector unit: tokens completed, operand beats taken (``a`` and ``b``), result beats sent."""


STRIPE_STATUS = counters("jobs", "jobs_done", "rejects", "words", "errors", "busy_cycles")
"""Stripe readers: jobs accepted / completed (final word delivered) / rejected (zero length or
count), ``w_in`` words delivered, words some port's reader marked ``err`` (a SLVERR/DECERR bus
beat marks each word it may contribute to: its own and, inside a row, the one before), cycles
with a job queued or in flight. ``words · 64 / busy_cycles`` is the kr260 weight rate in B/cycle."""


COMPUTE_BUSY_STATUS = counters("job_cycles", "emit_cycles", "attend_cycles", "busy_cycles")
"""The node's compute half (:class:`mcf.hdl.node.compute.NodeCompute`): cycles with a JOB, an
EMIT, an ATTEND record in progress (taken, ``done`` not yet), and with any of them. Registers
``cmp_<field>``; ``busy_cycles`` over a step's cycles is the step's compute-busy fraction."""


def status_values(layout: data.StructLayout, raw: int) -> dict[str, int]:
    """Every field of a status word (as read from a flat ``status`` port) as an integer."""
    return {name: (int(raw) >> fld.offset) & ((1 << fld.width) - 1) for name, fld in layout}
