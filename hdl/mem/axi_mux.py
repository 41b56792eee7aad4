"""Per-HP-port AXI4 multiplexer: several DMA clients on one ``S_AXI_HP`` port, each with its own
AXI ID (docs/node.md §4 "HP-port allocation"; paper §5, the memory frontend shared by the
weight stripes, the KV reader, the send reader and the landing writer).

Read and write sides are independent. AR and AW are granted burst by burst, round robin; the
ID a client's burst carries on the port is ``{client index, client ID}``, so R and B come back
to their client by ID alone. W has no ID in AXI4: the write side keeps the granted clients in
AW order and forwards W beats of the head client only, popping it on ``wlast``.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Signal
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out

from .axi import ADDR_BITS, AXI4Signature

__all__ = ["AxiPortMux"]

CLIENT_ID_BITS = 1      # every client is an AXI4Signature(id_width=1) master (DmaReader/Writer)

_AR = ("araddr", "arlen", "arsize", "arburst", "arcache", "arprot")
_AW = ("awaddr", "awlen", "awsize", "awburst", "awcache", "awprot")


class AxiPortMux(wiring.Component):
    """``n_clients`` AXI4 masters → one AXI4 master.

    Parameters
    ----------
    n_clients : int
        Clients, at least 1.
    addr_width, data_width : int
        Of every client and of the port.
    w_depth : int
        Granted write bursts whose W beats may be pending (AW accepted by the mux, ``wlast``
        not yet forwarded); AW waits when it is full.

    Members
    -------
    s0 … s{n-1} : In(AXI4Signature(addr_width, data_width, id_width=1))
        The clients. A client drives only the half it uses and ties the other's valids low
        (``DmaReader``: AW/W/B; ``DmaWriter``: AR/R; the stdlib default of 0 does it).
    m : Out(AXI4Signature(addr_width, data_width, id_width))
        The port, ``id_width`` = :attr:`id_width` = bits of the client index + 1: ``arid`` /
        ``awid`` = ``{index, client arid/awid}`` (client ID in bit 0).

    Protocol and timing
    -------------------
    * AR, AW: one output register per channel, refilled in the cycle it is taken, so bursts
      leave back to back (no bubble between grants; one cycle from a client's valid to the
      port). A client's ``arready``/``awready`` is combinational on the port's ready and the
      clients' valids (never on its own ready: no loop). Round robin: the client after the
      last granted one has priority, so a client waits at most ``n - 1`` bursts.
    * R, B: combinational routing by the ID's index bits; ``rready``/``bready`` of the port
      is the addressed client's. R beats of different IDs may interleave. A client holding
      ``rready`` low stalls the R channel (every ``DmaReader`` keeps it high).
    * W: the head of the grant FIFO (AW order) is connected combinationally; its ``wlast``
      pops it, so the next client's beats follow with no bubble. W may run ahead of its AW on
      the port by at most the AW register (AXI allows W before AW).
    * A client that never raises a valid is never granted and blocks nobody.

    Measured: two ``DmaReader`` clients streaming 64 KiB each from cocotbext-axi ``AxiRam``
    receive 8,192 R beats in 8,192 cycles combined (1.0 beat per cycle, AR grants alternating;
    ``tests/test_axi_mux.py::test_mux_rate``); an ideal slave with 16-beat bursts gives
    ≥ 0.98 in ``amaranth.sim`` (``test_mux_back_to_back``).
    """

    def __init__(self, n_clients: int, *, addr_width: int = ADDR_BITS, data_width: int = 128,
                 w_depth: int = 8):
        if n_clients < 1:
            raise ValueError("at least one client")
        self._n, self._w_depth = n_clients, w_depth
        self._index_bits = max(1, (n_clients - 1).bit_length())
        self._id_width = self._index_bits + CLIENT_ID_BITS
        members = {f"s{i}": In(AXI4Signature(addr_width, data_width, CLIENT_ID_BITS))
                   for i in range(n_clients)}
        members["m"] = Out(AXI4Signature(addr_width, data_width, self._id_width))
        super().__init__(members)

    @property
    def n_clients(self) -> int:
        return self._n

    @property
    def id_width(self) -> int:
        return self._id_width

    def _arbiter(self, m: Module, prefix: str, fields, extra_ok=None):
        """Output-registered round-robin grant of ``<prefix>valid`` among the clients;
        returns (grant strobe, granted index)."""
        n = self._n
        clients = [getattr(self, f"s{i}") for i in range(n)]
        port = self.m
        valid = getattr(port, f"{prefix}valid")
        ready = getattr(port, f"{prefix}ready")
        last = Signal(range(n), name=f"{prefix}_last")
        sel = Signal(range(n), name=f"{prefix}_sel")
        any_valid = Signal(name=f"{prefix}_any")
        req = Cat(getattr(c, f"{prefix}valid") for c in clients)
        # priority order starting after the last grant
        with m.Switch(last):
            for lst in range(n):
                with m.Case(lst):
                    order = [(lst + 1 + k) % n for k in range(n)]
                    for idx in reversed(order):      # the last If wins: order[0]
                        with m.If(req[idx]):
                            m.d.comb += [sel.eq(idx), any_valid.eq(1)]
        free = Signal(name=f"{prefix}_free")
        m.d.comb += free.eq(~valid | ready)
        grant = Signal(name=f"{prefix}_grant")
        ok = free & any_valid
        if extra_ok is not None:
            ok = ok & extra_ok
        m.d.comb += grant.eq(ok)
        with m.If(valid & ready):
            m.d.sync += valid.eq(0)
        with m.If(grant):
            m.d.sync += [valid.eq(1), last.eq(sel)]
        for i, c in enumerate(clients):
            m.d.comb += getattr(c, f"{prefix}ready").eq(grant & (sel == i))
            with m.If(grant & (sel == i)):
                m.d.sync += [getattr(port, f).eq(getattr(c, f)) for f in fields]
                m.d.sync += getattr(port, f"{prefix}id").eq(
                    Cat(getattr(c, f"{prefix}id"), Const(i, self._index_bits)))
        return grant, sel

    def elaborate(self, platform):
        m = Module()
        n = self._n
        clients = [getattr(self, f"s{i}") for i in range(n)]
        port = self.m
        ib = self._index_bits

        # --- read side ---------------------------------------------------------------------
        self._arbiter(m, "ar", _AR)
        r_to = port.rid[CLIENT_ID_BITS:]
        for i, c in enumerate(clients):
            m.d.comb += [c.rdata.eq(port.rdata), c.rresp.eq(port.rresp),
                         c.rlast.eq(port.rlast), c.rid.eq(port.rid[:CLIENT_ID_BITS]),
                         c.rvalid.eq(port.rvalid & (r_to == i))]
        with m.Switch(r_to):
            for i, c in enumerate(clients):
                with m.Case(i):
                    m.d.comb += port.rready.eq(c.rready)
            with m.Default():       # an ID no client issued (a faulty slave): drained
                m.d.comb += port.rready.eq(1)

        # --- write side --------------------------------------------------------------------
        m.submodules.w_order = order = fifo.SyncFIFO(width=ib, depth=self._w_depth)
        aw_grant, aw_sel = self._arbiter(m, "aw", _AW, extra_ok=order.w_rdy)
        m.d.comb += [order.w_en.eq(aw_grant), order.w_data.eq(aw_sel)]
        head = order.r_data
        with m.Switch(head):
            for i, c in enumerate(clients):
                with m.Case(i):
                    m.d.comb += [port.wvalid.eq(order.r_rdy & c.wvalid),
                                 port.wdata.eq(c.wdata), port.wstrb.eq(c.wstrb),
                                 port.wlast.eq(c.wlast)]
        for i, c in enumerate(clients):
            m.d.comb += c.wready.eq(order.r_rdy & (head == i) & port.wready)
        m.d.comb += order.r_en.eq(port.wvalid & port.wready & port.wlast)

        b_to = port.bid[CLIENT_ID_BITS:]
        for i, c in enumerate(clients):
            m.d.comb += [c.bresp.eq(port.bresp), c.bid.eq(port.bid[:CLIENT_ID_BITS]),
                         c.bvalid.eq(port.bvalid & (b_to == i))]
        with m.Switch(b_to):
            for i, c in enumerate(clients):
                with m.Case(i):
                    m.d.comb += port.bready.eq(c.bready)
            with m.Default():
                m.d.comb += port.bready.eq(1)
        return m
