"""The bookkeeping :class:`~.array_score.ArrayScore` and :class:`~.array_pv.ArrayPV` share
around the GEMM's arrays (issue #33; docs/attention.md "The arrays' attention products"): a KV
block's operand words in two banks, its rows in **quads** of up to ``arrays`` rows in two quad
buffers, two result buffers, and the flags that pass a quad from filling to issue, to its
results, to its emission."""

from __future__ import annotations

from amaranth import Array, Module, Mux, Signal
from amaranth.lib import data, stream
from amaranth.lib.wiring import In, Out

from .array_bank import bank_result_layout, bank_step_layout

__all__ = ["QuadFlow", "client_members", "client_ports", "at"]


def at(half, n: int, low):
    """The address ``half · n + low`` of a two-half memory."""
    return Mux(half, n, 0) + low


def client_members(arrays: int, rows: int, lanes: int) -> dict:
    """The ``st`` / ``res`` members of a client of shared arrays (an
    :class:`~.array_share.ArrayShare` port)."""
    return {"st": Out(stream.Signature(bank_step_layout(arrays, rows, lanes))),
            "res": In(stream.Signature(bank_result_layout(arrays, rows)))}


def client_ports(m: Module, client):
    """``client``'s step and result streams: its own :class:`~.array_bank.ArrayBank` (added to
    ``m``) when it has ``own_arrays``, else its ``st`` / ``res`` members."""
    if client.own_arrays:
        m.submodules.bank = bank = client.bank
        return bank.i, bank.o
    return client.st, client.res


class QuadFlow:
    """Signals and rules built into the caller's module ``m`` (like the DMA's ``_Rows``).

    **Banks** (:meth:`load`): a block's words fill bank ``wb`` (``full``: loaded and still
    needed, ``loaded``: rows still to take; ``nrows``, ``nkeys`` from its last word; a block
    of 0 rows is dropped). **Quads** (:meth:`fill`): rows of the oldest loaded block gather in
    quad buffer ``fh`` (row ``fi``; ``f_rows`` = the quad's rows, fewer at the block's end);
    a complete quad's ``qinfo`` (bank, rows, nkeys, ``blast``: the block's last quad, and the
    caller's ``info`` fields) and per row a ``meta`` record. **Issue** (:meth:`start`,
    :meth:`issued`): quad ``ih`` into result buffer ``ish`` once both are free. **Results**
    (:meth:`resulted`): at a quad's last result its quad buffer is free and its result
    buffer ready, with ``sinfo`` / ``smeta`` copied. **Emission** (:meth:`emitted`): buffer
    ``eh``, row ``ei``; freed after its last row."""

    def __init__(self, m: Module, arrays: int, max_rows: int, max_block: int,
                 meta: data.StructLayout, info: dict | None = None):
        A = arrays
        self.A, self.max_rows, self.max_block = A, max_rows, max_block
        self.full, self.loaded = Signal(2, name="full"), Signal(2, name="loaded")
        self.nrows = Array(Signal(range(max_rows + 1), name=f"nrows{b}") for b in range(2))
        self.nkeys = Array(Signal(range(max_block + 1), name=f"nkeys{b}") for b in range(2))
        self.info_l = data.StructLayout({"bank": 1, "rows": range(A + 1),
                                         "nkeys": range(max_block + 1), "blast": 1,
                                         **(info or {})})
        self.qinfo = Array(Signal(self.info_l, name=f"qinfo{h}") for h in range(2))
        self.sinfo = Array(Signal(self.info_l, name=f"sinfo{h}") for h in range(2))
        self.rmeta = [[Signal(meta, name=f"rmeta{h}_{i}") for i in range(A)] for h in range(2)]
        self.smeta = [[Signal(meta, name=f"smeta{h}_{i}") for i in range(A)] for h in range(2)]
        self.qfull = Signal(2, name="qfull")        # a quad filled, results not all back
        self.qissued = Signal(2, name="qissued")    # its steps all issued
        self.sbusy = Signal(2, name="sbusy")        # a result buffer reserved until emitted
        self.sready = Signal(2, name="sready")      # a quad's results all in
        self.fb, self.fh = Signal(name="fill_bank"), Signal(name="fill_quad")
        self.frow = Signal(range(max_rows + 1), name="rows_filled")
        self.fi = Signal(range(A), name="fill_row")
        self.f_rows = Signal(range(A + 1), name="quad_rows")
        self.ih, self.ish = Signal(name="issue_quad"), Signal(name="issue_buf")
        self.issuing = Signal()
        self.eh, self.ei = Signal(name="emit_buf"), Signal(range(A), name="emit_row")
        left = Signal(range(max_rows + 1))
        m.d.comb += [left.eq(self.nrows[self.fb] - self.frow),
                     self.f_rows.eq(Mux(left < A, left, A))]

    @property
    def fill_ready(self):
        """A row beat may be taken: its block is loaded and the quad buffer free."""
        return self.loaded.bit_select(self.fb, 1) & ~self.qfull.bit_select(self.fh, 1)

    def load(self, m: Module, src, wr, words: int):
        """``src``'s words (``last``, ``rows``, ``n`` on a block's last) into bank ``wb`` of
        ``words`` words through the write port ``wr`` (its ``data`` the caller's). Returns the
        write's address and enable for the caller's other memories."""
        wb = Signal(name="load_bank")
        word = Signal(range(words), name="load_word")
        m.d.comb += [src.ready.eq(~self.full.bit_select(wb, 1)),
                     wr.addr.eq(at(wb, words, word)), wr.en.eq(src.valid & src.ready)]
        with m.If(src.valid & src.ready):
            m.d.sync += word.eq(Mux(src.payload.last, 0, word + 1))
            with m.If(src.payload.last & (src.payload.rows != 0)):
                m.d.sync += [self.full.bit_select(wb, 1).eq(1),
                             self.loaded.bit_select(wb, 1).eq(1),
                             self.nrows[wb].eq(src.payload.rows),
                             self.nkeys[wb].eq(src.payload.n), wb.eq(~wb)]
        return wr.addr, wr.en

    def set_meta(self, module: Module, cond, /, **fields):
        """Row ``fi`` of quad buffer ``fh``'s ``meta`` fields, where ``cond``."""
        for i in range(self.A):
            with module.If(cond & (self.fi == i)):
                for h in range(2):
                    with module.If(self.fh == h):
                        module.d.sync += [getattr(self.rmeta[h][i], k).eq(v)
                                          for k, v in fields.items()]

    def fill(self, m: Module, take, row_end, /, **info):
        """A row beat taken (``take``), ending its row (``row_end``): the next row, and after
        the quad's last the quad buffer full with its ``qinfo`` (``info``: the caller's
        fields)."""
        fb, fh = self.fb, self.fh
        with m.If(take & row_end):
            m.d.sync += self.fi.eq(self.fi + 1)
            with m.If(self.fi == self.f_rows - 1):
                blast = self.frow + self.f_rows == self.nrows[fb]
                m.d.sync += [self.fi.eq(0), self.qfull.bit_select(fh, 1).eq(1), fh.eq(~fh),
                             self.frow.eq(self.frow + self.f_rows)]
                for h in range(2):
                    with m.If(fh == h):
                        qi = self.qinfo[h]
                        m.d.sync += [qi.bank.eq(fb), qi.rows.eq(self.f_rows),
                                     qi.nkeys.eq(self.nkeys[fb]), qi.blast.eq(blast)]
                        m.d.sync += [getattr(qi, k).eq(v) for k, v in info.items()]
                with m.If(blast):
                    m.d.sync += [self.frow.eq(0), self.loaded.bit_select(fb, 1).eq(0),
                                 fb.eq(~fb)]

    def start(self, m: Module, *reset):
        """Quad ``ih`` starts issuing into result buffer ``ish`` once it is full and the buffer
        free (``reset``: the caller's step counters, zeroed then)."""
        with m.If(~self.issuing & self.qfull.bit_select(self.ih, 1) &
                  ~self.qissued.bit_select(self.ih, 1) & ~self.sbusy.bit_select(self.ish, 1)):
            m.d.sync += [self.issuing.eq(1), self.sbusy.bit_select(self.ish, 1).eq(1)]
            m.d.sync += [r.eq(0) for r in reset]

    def issued(self, m: Module):
        """Under the condition that the quad's last step was issued."""
        m.d.sync += [self.issuing.eq(0), self.qissued.bit_select(self.ih, 1).eq(1),
                     self.ih.eq(~self.ih), self.ish.eq(~self.ish)]

    def resulted(self, m: Module, qh, sh):
        """Under the condition that quad buffer ``qh``'s last result (into result buffer
        ``sh``) is in."""
        m.d.sync += [self.qfull.bit_select(qh, 1).eq(0), self.qissued.bit_select(qh, 1).eq(0),
                     self.sready.bit_select(sh, 1).eq(1)]
        for h in range(2):
            with m.If(qh == h):
                for s_ in range(2):
                    with m.If(sh == s_):
                        m.d.sync += [self.smeta[s_][i].eq(self.rmeta[h][i])
                                     for i in range(self.A)]
                        m.d.sync += self.sinfo[s_].eq(self.qinfo[h])

    def emitted(self, m: Module):
        """Under the condition that row ``ei`` of result buffer ``eh`` left: the next row, and
        after the quad's last the buffer free. Returns the quad-end condition."""
        end = Signal(name="quad_emitted")
        m.d.comb += end.eq(self.ei == self.sinfo[self.eh].rows - 1)
        m.d.sync += self.ei.eq(self.ei + 1)
        with m.If(end):
            m.d.sync += [self.ei.eq(0), self.sready.bit_select(self.eh, 1).eq(0),
                         self.sbusy.bit_select(self.eh, 1).eq(0), self.eh.eq(~self.eh)]
        return end

    @property
    def emit_meta(self):
        """Row ``ei``'s record in result buffer ``eh``."""
        return Array(Array(self.smeta[h][i] for i in range(self.A)) for h in range(2))[
            self.eh][self.ei]
