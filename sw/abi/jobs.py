"""JOB templates: engine descriptor lists in DDR that the node's template walker
(:class:`mcf.hdl.node.jobs.JobWalker`) plays into the matrix engine without the PS (issue #11
§1.2, docs/node.md §3 "Job templates").

**JOB record.** ``CMD.arg`` of a ``RecordClass.JOB`` record is :data:`JOB_ARG`: the template
index. The walker patches nothing: a template is a fixed list of descriptors for one shape (the
driver writes one template per model step and token count it runs). A JOB's ``meta`` is unused.

**Template table.** ``JOBS_TABLE`` (a 40-bit byte address, registers ``JOBS_TABLE_LO/HI``) holds
``JOBS_TABLE_LEN`` rows of :data:`TEMPLATE_REF` (16 bytes each): the address of the template's
first entry and its entry count. Index ``i`` ≥ ``JOBS_TABLE_LEN`` is a bad index.

**Alignment.** The table, every template and the transfers of its RD0, RD1 and STRIPE entries
(``addr`` and ``stride``) start on a bus beat (:data:`JOB_ALIGN`, 16 B), those of its WR
entries on :data:`JOB_WR_ALIGN` (4 B: a requantised chunk's per-token scale words are written
one by one): the walker's and the matrix engine's read engines have no byte realigner, its
write engine one stage. A JOB against a table off a beat counts as a bad index; a template off
a beat, or an entry whose transfer is off its alignment, as a bad entry (the JOB aborts
there).

**Entries** are :data:`TEMPLATE_ENTRY` (16 bytes, one 128-bit beat, contiguous): ``kind``
(:class:`EntryKind`) selects what ``body`` is and where it goes —

===========  =============================  ==============================================
kind         body                           action
===========  =============================  ==============================================
RD0 / RD1    :data:`~mcf.abi.compute.DMA_DESC`  push on the engine's ``rd_desc0`` / ``rd_desc1``
WR           :data:`~mcf.abi.compute.DMA_DESC`  push on ``wr_desc``
GEMM         :data:`~mcf.abi.compute.GEMM_JOB`  push on ``gemm_job``
ROUTE        :data:`ROUTE`                  set ``rd_dest0``, ``rd_dest1``, ``wr_src``
VEC          :data:`VEC_CFG`                set ``vec_op``, ``vec_n_beats``, ``vec_eps``
STRIPE (6)   :data:`~mcf.abi.compute.DMA_DESC`  push a :data:`~mcf.abi.compute.STRIPE_JOB` on
             of stripe 0, ``ext`` = pitch   ``w_job`` (the stripe readers: a GEMM job's weights)
===========  =============================  ==============================================

A STRIPE entry is one weight matrix laid out by :func:`mcf.quant.gemm_stripe_image`: its body
is stripe 0's transfer (``addr``, ``length``, ``stride``, ``count``) and ``ext`` the ``pitch``
between stripes in :data:`~mcf.abi.compute.STRIPE_ALIGN` units (< 2^11 · 4 KiB = 8 MiB per
stripe; :meth:`Entry.pack` refuses more). Only a walker built with ``stripes`` (the node top's)
has a ``w_job`` stream; to any other walker it is an unknown kind.

``fence`` = 1: before this entry, everything issued before it has completed (the walker's
queues are empty, the engine's ``wr_busy`` and ``gemm_busy`` are low: every write descriptor
acknowledged, every GEMM job done). ROUTE and VEC always fence (the engine's routing and vector
configuration change only between transfers). The end of a template is a fence: ``done`` means
the JOB's results are in DDR. An unknown ``kind``, a GEMM job the engine would reject
(:meth:`~mcf.abi.compute.GemmLimits.accepts`: counted in ``bad_gemm``) or a read error aborts
the JOB: counted, the rest of its entries are skipped and it retires at once (no final fence).

**Ordering rule.** The walker plays entries in order into per-stream queues (``queue`` deep); it
stalls while the target queue is full. A template must therefore list the descriptors one engine
operation needs close together (a GEMM job, then its activation, weight and result descriptors
— as :class:`TemplateBuilder` does: the job first, so that a refused job's data is never issued;
the engine would wait for a job that never comes), never a long run on one stream that the
engine can only drain once a later entry on another stream arrives (that stalls until the
sequencer's watchdog).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from amaranth.hdl import unsigned
from amaranth.lib import data, enum

from .compute import (
    DMA_ADDR_BITS,
    DMA_DESC,
    GEMM_JOB,
    STRIPE_ALIGN,
    STRIPE_JOB,
    DmaDesc,
    GemmJob,
    GemmLimits,
    StripeJob,
)
from .node import CMD
from .quant import ReadDest, VectorOp, WriteSrc
from .regs import Access, Register, counters, status_registers

__all__ = [
    "JOB_INDEX_BITS", "JOB_ARG", "TEMPLATE_REF", "TEMPLATE_ENTRY", "ENTRY_BYTES", "EntryKind",
    "ROUTE", "VEC_CFG", "VEC_N_BEATS_BITS", "JOBS_STATUS", "Entry", "TemplateBuilder",
    "STRIPE_KIND", "STRIPE_PITCH_BITS", "stripe_entry_job",
    "template_image", "walk", "jobs_registers", "JOB_ALIGN", "JOB_WR_ALIGN",
]

JOB_INDEX_BITS = 16

JOB_ARG = data.StructLayout({"template": unsigned(JOB_INDEX_BITS),
                             "reserved": unsigned(CMD["arg"].width - JOB_INDEX_BITS)})
"""``CMD.arg`` of a JOB record (the reserved bits are ignored)."""

TEMPLATE_REF = data.StructLayout({
    "addr": unsigned(DMA_ADDR_BITS),       # byte address of the first entry
    "count": unsigned(JOB_INDEX_BITS),     # entries; 0 = an empty template (retires at once)
    "reserved": unsigned(128 - DMA_ADDR_BITS - JOB_INDEX_BITS),
})
"""One template-table row (16 bytes)."""


class EntryKind(enum.Enum, shape=4):
    """What a template entry does (codes 6..15 are bad entries, except :data:`STRIPE_KIND` to a
    walker with stripe readers)."""
    RD0 = 0
    RD1 = 1
    WR = 2
    GEMM = 3
    ROUTE = 4
    VEC = 5


STRIPE_KIND = 6
"""Kind code of a STRIPE entry: a weight matrix for the stripe readers (module docstring). Not an
:class:`EntryKind` member: only a walker built with ``stripes`` (the node top's) executes it;
to any other it is an unknown kind (a bad entry)."""


ROUTE = data.StructLayout({"rd_dest0": ReadDest, "rd_dest1": ReadDest, "wr_src": WriteSrc})
"""Body of a ROUTE entry: the matrix engine's stream routing."""

VEC_N_BEATS_BITS = 16
VEC_CFG = data.StructLayout({"op": VectorOp, "n_beats": unsigned(VEC_N_BEATS_BITS),
                             "eps": unsigned(32)})
"""Body of a VEC entry: the vector unit's ``op``, ``n_beats`` (truncated to the engine's width)
and RMSNorm ``eps`` code."""

_BODY_BITS = max(DMA_DESC.size, GEMM_JOB.size, ROUTE.size, VEC_CFG.size)

TEMPLATE_ENTRY = data.StructLayout({
    "body": unsigned(_BODY_BITS),
    "kind": unsigned(4),                  # EntryKind code (kept raw: bad codes are counted)
    "fence": unsigned(1),
    "ext": unsigned(128 - _BODY_BITS - 5),  # STRIPE: pitch / STRIPE_ALIGN; 0 for other kinds
})
"""One template entry: one 128-bit beat."""

STRIPE_PITCH_BITS = TEMPLATE_ENTRY["ext"].shape.width

ENTRY_BYTES = TEMPLATE_ENTRY.size // 8

JOB_ALIGN = ENTRY_BYTES
"""Bytes the template table, each template and every transfer of a template's RD0, RD1 and
STRIPE entries start on (one 128-bit beat): their DMA readers are built with this ``align``."""

JOB_WR_ALIGN = 4
"""Bytes every transfer of a template's WR entries starts on (one ACT word): the matrix
engine's DMA writer is built with this ``align``."""

if TEMPLATE_ENTRY.size != 128 or TEMPLATE_REF.size != 128:
    raise AssertionError("template rows and entries are one 128-bit beat")  # pragma: no cover

JOBS_STATUS = counters("jobs", "entries", "fences", "fence_cycles", "bad_index",
                       "bad_entries", "read_errors", "bad_gemm")
"""Template walker: JOBs retired (``done`` strobes, bad ones included), entries executed,
fences taken (explicit, ROUTE/VEC and the final one), cycles spent waiting in fences, JOBs with
an index ≥ ``JOBS_TABLE_LEN`` (or a table off :data:`JOB_ALIGN`), entries with an unknown kind
(or a template off :data:`JOB_ALIGN`, or a transfer off its alignment), JOBs aborted by a
non-OKAY read of
the table or entries, GEMM entries the engine would reject (:meth:`GemmLimits.accepts`; the JOB
is aborted there, so the job's descriptors behind it never reach the engine). Registers
``jobs_<field>``."""


def jobs_registers() -> list[Register]:
    """``JOBS_TABLE_LO/HI`` (template table byte address), ``JOBS_TABLE_LEN`` (rows), and the
    status registers ``jobs_<field>`` (:data:`JOBS_STATUS`)."""
    return [Register.single("JOBS_TABLE_LO", 32, Access.RW,
                            desc="template table byte address, bits 31:0"),
            Register.single("JOBS_TABLE_HI", DMA_ADDR_BITS - 32, Access.RW,
                            desc="template table byte address, upper bits"),
            Register.single("JOBS_TABLE_LEN", JOB_INDEX_BITS, Access.RW,
                            desc="template table rows (a JOB index at or above is bad)"),
            *status_registers("jobs", JOBS_STATUS, "template walker")]


# ---------------------------------------------------------------------------------------------
# Host side


@dataclass(frozen=True)
class Entry:
    """Host view of one :data:`TEMPLATE_ENTRY`; ``body`` is the host view of the kind's body
    (:class:`DmaDesc`, :class:`GemmJob`, or a dict of :data:`ROUTE` / :data:`VEC_CFG` fields);
    for a raw (possibly bad) kind code pass an int ``kind`` and an int ``body``."""
    kind: EntryKind | int
    body: object
    fence: bool = False

    def body_bits(self) -> int:
        if isinstance(self.body, int):
            return self.body
        if isinstance(self.body, (DmaDesc, GemmJob)):
            return self.body.pack()
        if isinstance(self.body, StripeJob):
            b = self.body
            return DmaDesc(b.addr, b.length, b.stride, b.count).pack()
        layout = ROUTE if self.kind == EntryKind.ROUTE else VEC_CFG
        return layout.const(self.body).as_bits()

    def pack(self) -> int:
        kind = self.kind.value if isinstance(self.kind, EntryKind) else self.kind
        ext = 0
        if isinstance(self.body, StripeJob):
            ext, rem = divmod(self.body.pitch, STRIPE_ALIGN)
            if rem or ext >> STRIPE_PITCH_BITS:
                raise ValueError(f"stripe pitch {self.body.pitch}: a multiple of {STRIPE_ALIGN} "
                                 f"below {STRIPE_ALIGN << STRIPE_PITCH_BITS}")
        return TEMPLATE_ENTRY.const({"body": self.body_bits(), "kind": kind,
                                     "fence": int(self.fence), "ext": ext}).as_bits()

    def to_bytes(self) -> bytes:
        return self.pack().to_bytes(ENTRY_BYTES, "little")

    @property
    def fences(self) -> bool:
        """The walker waits for the engine before this entry."""
        return bool(self.fence) or self.kind in (EntryKind.ROUTE, EntryKind.VEC)


def template_image(templates: list[list[Entry]], base: int) -> tuple[bytes, int]:
    """The DDR image at ``base``: the table (one row per template), then each template's
    entries. Returns ``(bytes, JOBS_TABLE_LEN)``; ``JOBS_TABLE`` = ``base``."""
    addr = base + ENTRY_BYTES * len(templates)
    table, body = bytearray(), bytearray()
    for t in templates:
        table += TEMPLATE_REF.const({"addr": addr, "count": len(t)}).as_bits().to_bytes(
            ENTRY_BYTES, "little")
        for e in t:
            body += e.to_bytes()
        addr += ENTRY_BYTES * len(t)
    return bytes(table + body), len(templates)


class TemplateBuilder:
    """Records what :class:`mcf.sim.benches.gemm_layer.Engine` pushes from the PS as template
    entries (same methods and arguments, same descriptors; the GEMM runs are issued job by job —
    job descriptor, its activation, weight and result descriptors — so the walker's per-stream
    queues overlap a job's loads with the previous job's compute). ``vlanes`` is the vector
    unit's lanes (``data_width // 32``), ``rows``/``lanes`` the GEMM array's."""

    def __init__(self, eps_code: int, rows: int = 16, lanes: int = 16, vlanes: int = 4):
        self.entries: list[Entry] = []
        self.eps_code, self.rows, self.lanes, self.vlanes = eps_code, rows, lanes, vlanes

    def route(self, dest0, dest1, src):
        self.entries.append(Entry(EntryKind.ROUTE, {"rd_dest0": dest0, "rd_dest1": dest1,
                                                    "wr_src": src}, True))

    def _descs(self, kind, items):
        self.entries += [Entry(kind, DmaDesc(*it)) for it in items]

    def transfer(self, rd0=(), rd1=(), wr=(), dest0=ReadDest.VEC_A, dest1=ReadDest.VEC_B,
                 src=WriteSrc.VECTOR):
        self.route(dest0, dest1, src)
        self._descs(EntryKind.RD0, rd0)
        self._descs(EntryKind.RD1, rd1)
        self._descs(EntryKind.WR, wr)

    def _vec(self, op, n):
        self.entries.append(Entry(EntryKind.VEC, {"op": op, "n_beats": n // self.vlanes,
                                                  "eps": self.eps_code}, True))

    def vector(self, op, n, m, a, b, out, a_stride=None, b_stride=0, out_stride=None):
        self._vec(op, n)
        row = n * 4
        rd1 = [(b, row, b_stride, m)] if b is not None else []
        self.transfer([(a, row, a_stride or row, m)], rd1, [(out, row, out_stride or row, m)])

    def requant(self, n, m, a, xq):
        self._vec(VectorOp.REQUANT, n)
        wr = []
        for t in range(m):
            wr += [(xq + t * n, n, 0, 1), (xq + m * n + 4 * t, 4, 0, 1)]
        self.transfer([(a, n * 4, n * 4, m)], [], wr)

    def requant_to(self, n, m, a, a_stride, wr):
        """REQUANT of ``m`` vectors of ``n`` ACT words read at ``a`` (row stride ``a_stride``)
        with the caller's write descriptors ``wr`` (per vector: the codes, then the scale
        word — e.g. into query records, :mod:`mcf.abi.query`)."""
        self._vec(VectorOp.REQUANT, n)
        self.transfer([(a, n * 4, a_stride, m)], [], wr)

    def gemms(self, jobs):
        """``jobs``: ``(xq, m, k, weights, QuantWeight, out)`` as the bench's; ``weights`` is
        ``(blob_addr, blob_bytes)`` of a tile blob (:func:`mcf.quant.gemm_tile_blob`, read by
        the engine's port 1: an RD1 entry) or the :class:`~mcf.abi.compute.StripeJob` of a
        stripe image (:func:`mcf.quant.gemm_stripe_image`, read by the stripe readers: a
        STRIPE entry)."""
        self.route(ReadDest.GEMM_X, ReadDest.GEMM_W, WriteSrc.GEMM)
        for xq, m, k, blob, qw, out in jobs:
            n = qw.q.shape[0]
            job = GemmJob.for_shape(m, n, k, qw.e, self.rows, self.lanes)
            self.entries.append(Entry(EntryKind.GEMM, job))
            self._descs(EntryKind.RD0, [dataclasses.astuple(x)
                                        for x in job.x_descriptors(xq, self.lanes)])
            if isinstance(blob, StripeJob):
                self.entries.append(Entry(STRIPE_KIND, blob))
            else:
                self._descs(EntryKind.RD1, [(blob[0], blob[1], 0, 1)])
            self._descs(EntryKind.WR, [(out + t * self.rows * 4, self.rows * 4, n * 4, m)
                                       for t in range(n // self.rows)])

    def gemm(self, xq, m, k, blob, qw, out):
        self.gemms([(xq, m, k, blob, qw, out)])


def stripe_entry_job(entry) -> int:
    """The :data:`~mcf.abi.compute.STRIPE_JOB` (as an integer) a STRIPE entry (a
    :data:`TEMPLATE_ENTRY` value) pushes on the walker's ``w_job``."""
    d = DMA_DESC.from_bits(int(entry.body) & ((1 << DMA_DESC.size) - 1))
    return STRIPE_JOB.const({"addr": int(d.addr), "pitch": int(entry.ext) * STRIPE_ALIGN,
                             "length": int(d.length), "stride": int(d.stride),
                             "count": int(d.count)}).as_bits()


def walk(read, table: int, table_len: int, arg: int, gemm: GemmLimits,
         stripes: bool = True) -> tuple[list, dict]:
    """Golden model of the walker for one JOB record (``arg`` = ``CMD.arg``) in front of an
    engine accepting ``gemm`` (with stripe readers, as the node top's, when ``stripes``: STRIPE
    entries go to ``w_job``; else they are bad entries): ``read(addr, n)`` returns ``n`` bytes
    of DDR. Returns
    ``(actions, counts)``: the actions in issue order, each ``(group, target, value)`` —
    ``group`` counts the fences passed so far (an action may reach the engine only after every
    WR and GEMM action of a lower group completed), ``target`` a walker output (``rd_desc0``,
    ``rd_desc1``, ``wr_desc``, ``gemm_job``, ``route``, ``vec``, ``w_job``) and ``value`` its
    integer payload — and the :data:`JOBS_STATUS` increments."""
    c = {name: 0 for name, _ in JOBS_STATUS}
    c["jobs"] = 1
    idx = JOB_ARG.from_bits(arg).template
    if idx >= table_len or table % JOB_ALIGN:
        c["bad_index"] = 1
        return [], c
    ref = TEMPLATE_REF.from_bits(int.from_bytes(read(table + ENTRY_BYTES * idx, ENTRY_BYTES),
                                                "little"))
    if int(ref.count) and int(ref.addr) % JOB_ALIGN:
        c["bad_entries"] = 1
        return [], c
    targets = {EntryKind.RD0: ("rd_desc0", DMA_DESC), EntryKind.RD1: ("rd_desc1", DMA_DESC),
               EntryKind.WR: ("wr_desc", DMA_DESC), EntryKind.GEMM: ("gemm_job", GEMM_JOB),
               EntryKind.ROUTE: ("route", ROUTE), EntryKind.VEC: ("vec", VEC_CFG)}
    actions, group = [], 0
    for i in range(int(ref.count)):
        e = TEMPLATE_ENTRY.from_bits(int.from_bytes(
            read(int(ref.addr) + ENTRY_BYTES * i, ENTRY_BYTES), "little"))
        try:
            kind = EntryKind(int(e.kind))
        except ValueError:
            kind = STRIPE_KIND if stripes and int(e.kind) == STRIPE_KIND else None
        if kind in (EntryKind.RD0, EntryKind.RD1, EntryKind.WR, STRIPE_KIND):
            d = DMA_DESC.from_bits(int(e.body) & ((1 << DMA_DESC.size) - 1))
            if (int(d.addr) | int(d.stride)) % (JOB_WR_ALIGN if kind == EntryKind.WR
                                                 else JOB_ALIGN):
                kind = None                     # a transfer off its alignment: a bad entry
        if kind is None:
            c["bad_entries"] += 1
            return actions, c
        if kind == EntryKind.GEMM:
            job = GEMM_JOB.from_bits(int(e.body) & ((1 << GEMM_JOB.size) - 1))
            if not gemm.accepts(int(job.m_count), int(job.k_steps), int(job.n_tiles)):
                c["bad_gemm"] += 1
                return actions, c
        if e.fence or kind in (EntryKind.ROUTE, EntryKind.VEC):
            group += 1
            c["fences"] += 1
        if kind == STRIPE_KIND:
            actions.append((group, "w_job", stripe_entry_job(e)))
        else:
            name, layout = targets[kind]
            actions.append((group, name, int(e.body) & ((1 << layout.size) - 1)))
        c["entries"] += 1
    c["fences"] += 1
    return actions, c
