"""The GEMM's arrays shared (issue #33; docs/attention.md "The arrays' attention products"):
several clients issue whole dot products onto one :class:`~.array_bank.ArrayBank` — prefill
attention's S (:class:`~.array_score.ArrayScore`) and P·V (:class:`~.array_pv.ArrayPV`) taking
turns — and each gets its own results back."""

from __future__ import annotations

from amaranth import Array, Module, Mux, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.quant import GROUP_SIZE

from .array_bank import ArrayBank, bank_result_layout, bank_step_layout

__all__ = ["ArrayShare"]


class ArrayShare(wiring.Component):
    """``clients`` step streams onto one :class:`~.array_bank.ArrayBank`, switched only between
    dot products (a client's steps from its first to its ``last`` run back to back), round
    robin among the clients with a step waiting; each dot product's result goes back to the
    client that issued it.

    Every client's groups must be whole (``group / lanes`` steps), so group ends stay the
    arrays' ``rows / scalers`` cycles apart across clients. A client must take its results
    (a result waiting on a client's ``ready`` stalls the arrays for all).

    Members
    -------
    c{n}_st : In(stream.Signature(bank_step_layout(arrays, rows, lanes))), n < ``clients``
        Client ``n``'s steps.
    c{n}_res : Out(stream.Signature(bank_result_layout(arrays, rows)))
        Client ``n``'s results, in its step order.

    Latency: the bank's; a switch between clients costs no cycle. Throughput: one step per
    cycle.
    """

    def __init__(self, clients: int = 2, arrays: int = 4, rows: int = 16, lanes: int = 16,
                 group: int = GROUP_SIZE, chain: int = 1, dsp: str = "fabric"):
        self.clients = clients
        self.bank = ArrayBank(arrays, rows, lanes, group, chain, dsp)
        self.latency = self.bank.latency
        members = {}
        for n in range(clients):
            members[f"c{n}_st"] = In(stream.Signature(bank_step_layout(arrays, rows, lanes)))
            members[f"c{n}_res"] = Out(stream.Signature(bank_result_layout(arrays, rows)))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        C = self.clients
        m.submodules.bank = bank = self.bank
        sts = [getattr(self, f"c{n}_st") for n in range(C)]
        ress = [getattr(self, f"c{n}_res") for n in range(C)]
        cb = max(1, (C - 1).bit_length())
        # a dot product's client, from its last step to its result (one per step at most)
        m.submodules.owner = owner = fifo.SyncFIFOBuffered(width=cb, depth=self.latency + 4)

        cur = Signal(range(C))                        # the client of the dot in progress
        mid = Signal()                                # a dot product is in progress
        sel = Signal(range(C))
        # round robin: the first client after ``cur`` with a step waiting (``cur`` last)
        m.d.comb += sel.eq(cur)
        with m.If(~mid):
            for k in reversed(range(1, C + 1)):
                n = Signal(range(C), name=f"rr{k}")
                m.d.comb += n.eq(Mux(cur + k >= C, cur + k - C, cur + k))
                with m.If(Array(s.valid for s in sts)[n]):
                    m.d.comb += sel.eq(n)
        st_v = Array(s.valid for s in sts)[sel]
        st_p = Signal.like(bank.i.payload)
        with m.Switch(sel):
            for n, s in enumerate(sts):
                with m.Case(n):
                    m.d.comb += st_p.eq(s.payload)
        room = owner.w_rdy
        m.d.comb += [bank.i.valid.eq(st_v & room), bank.i.payload.eq(st_p)]
        for n, s in enumerate(sts):
            m.d.comb += s.ready.eq((sel == n) & bank.i.ready & room)
        taken = bank.i.valid & bank.i.ready
        m.d.comb += [owner.w_en.eq(taken & st_p.last), owner.w_data.eq(sel)]
        with m.If(taken):
            m.d.sync += [cur.eq(sel), mid.eq(~st_p.last)]

        # results back to their clients
        who = owner.r_data
        for n, r in enumerate(ress):
            m.d.comb += [r.payload.eq(bank.o.payload),
                         r.valid.eq(bank.o.valid & owner.r_rdy & (who == n))]
        m.d.comb += [bank.o.ready.eq(owner.r_rdy & Array(r.ready for r in ress)[who]),
                     owner.r_en.eq(bank.o.valid & bank.o.ready)]
        return m
