"""AXI4-Lite control/status register bank elaborated from an ABI :class:`RegisterMap`.

Paper section 5 (Unified Progressive Execution Layout, Figure 2): the PS-side MARS runtime
delivers control to the PL "through AXI-Lite"; this bank is that control/status path (node
identity, engine configuration, status counters). The map — names, addresses, widths, access
kinds, reset values — comes from :mod:`mcf.abi.regs` / :mod:`mcf.abi.csrmap`; this file types
no address.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, exact_log2

from mcf.abi.regs import WORD_BYTES, Access, Field, Register, RegisterMap, bank_registers

from .axil import AxiLiteSignature, AxiResp

__all__ = ["CsrBank", "field_signature", "register_signature", "DEFAULT_ADDR_WIDTH"]

DATA_BITS = 8 * WORD_BYTES
LANE_BITS = exact_log2(WORD_BYTES)
DEFAULT_ADDR_WIDTH = 12  # a 4 KiB window, the smallest segment Vivado's address editor assigns


def field_signature(fld: Field) -> wiring.Member:
    """The member (seen from the bank) through which hardware reaches one field."""
    if fld.access is Access.R:
        return In(fld.width)
    if fld.access is Access.RW:
        return Out(fld.width, init=fld.reset)
    if fld.access is Access.W:
        return Out(wiring.Signature({"value": Out(fld.width, init=fld.reset), "stb": Out(1)}))
    if fld.access is Access.RW1C:
        return Out(wiring.Signature({"value": Out(fld.width, init=fld.reset),
                                     "set": In(fld.width)}))
    raise ValueError(f"field {fld.name}: unknown access {fld.access!r}")


def register_signature(reg: Register) -> wiring.Signature:
    return wiring.Signature({f.name: field_signature(f) for f in reg.fields})


class CsrBank(wiring.Component):
    """AXI4-Lite subordinate holding the registers of ``regmap``.

    Members
    -------
    s_axi_ctrl : ``In(AxiLiteSignature(addr_width, 8 * WORD_BYTES))``
        The control bus. ``awprot``/``arprot`` are ignored; address bits below the word size
        are ignored (byte lanes are chosen by ``wstrb``).
    regs : ``Out(Signature)``
        One nested interface per register of the map except register 0 (``ID``, a constant)
        and register 1 (``BUS_ERRORS``, counted here), named after the register; in it one
        member per field, named after the field, shaped by the field's access kind:

        * ``R``    — ``In(width)``: hardware drives the value a read returns.
        * ``RW``   — ``Out(width)``: the stored value (map reset value after reset).
        * ``W``    — ``value: Out(width)`` (last written bytes, held) and ``stb: Out(1)``,
          high for exactly one cycle after each write enabling any byte of the field;
          reads return 0.
        * ``RW1C`` — ``value: Out(width)`` (the sticky bits) and ``set: In(width)``: a 1 on
          ``set`` at a clock edge sets that bit; software writing 1 clears it. When hardware
          sets and software clears the same bit at the same edge, **the set wins**.

        Under :class:`mcf.hdl.flat.FlatTop` these become ``regs_<REG>_<field>``,
        ``regs_<REG>_<field>_value`` / ``_stb`` / ``_set``.

    Protocol and latency
    --------------------
    AW and W are independent one-entry slots (``awready = ~aw_full``, ``wready = ~w_full``,
    both registered, either may arrive first, any skew). A write commits at the first edge
    where both slots are full and the B slot is free (``~bvalid | bready``): that edge updates
    the registers, raises ``bvalid`` and (for ``W`` fields) the strobe. So ``bvalid`` rises
    2 cycles after the later of the AW/W handshakes; a new AW/W is accepted from the cycle
    after the commit. A read samples the registers (and the ``R`` inputs) at its AR handshake
    edge and raises ``rvalid`` the cycle after (latency 1); ``arready = ~rvalid``. ``bvalid``
    / ``rvalid`` stay high with ``bresp`` / ``rdata`` / ``rresp`` stable until ``bready`` /
    ``rready``. A read and a write committing at the same edge: the read returns the value
    before the write. No combinational path from any input to any output.

    Errors
    ------
    An address whose word holds no register of the map (a gap, or anything past the last
    register up to ``2**addr_width``) answers ``SLVERR``; reads return 0; each such access
    increments ``BUS_ERRORS`` (wrapping; a read and a write erring at one edge add 2). Writes
    to ``R`` fields (including ``ID``/``BUS_ERRORS``) are ignored and answered ``OKAY``.
    """

    def __init__(self, regmap: RegisterMap, *, addr_width: int | None = None):
        need = bits_for(max(regmap.size - 1, WORD_BYTES))
        if addr_width is None:
            addr_width = max(need, DEFAULT_ADDR_WIDTH)
        if addr_width < need:
            raise ValueError(f"addr_width {addr_width} cannot reach the {regmap.size}-byte "
                             f"map {regmap.name}")
        self._regmap = regmap
        self._addr_width = addr_width
        self._id_reg, self._errors_reg = bank_registers(regmap)
        self._user = [(addr, reg) for addr, reg in regmap
                      if reg not in (self._id_reg, self._errors_reg)]
        for addr, _ in regmap:
            if addr % WORD_BYTES:
                raise ValueError(f"map {regmap.name}: address {addr:#x} is not word aligned")
        members = {"s_axi_ctrl": In(AxiLiteSignature(addr_width, DATA_BITS))}
        if self._user:
            members["regs"] = Out(wiring.Signature(
                {reg.name: Out(register_signature(reg)) for _, reg in self._user}))
        super().__init__(members)

    @property
    def regmap(self) -> RegisterMap:
        return self._regmap

    @property
    def addr_width(self) -> int:
        return self._addr_width

    def port(self, reg: str, field: str | None = None):
        """The member of ``regs`` for ``reg.field`` (``field`` defaults to the register name,
        as :meth:`Register.single` and ``RegisterMap.add_status`` name them)."""
        return getattr(getattr(self.regs, reg), reg if field is None else field)

    def elaborate(self, platform):
        m = Module()
        axi = self.s_axi_ctrl
        word_width = self._addr_width - LANE_BITS

        # --- state of every field ----------------------------------------------------------
        errors_width = sum(f.width for f in self._errors_reg.fields)
        errors = Signal(errors_width)
        storage: dict[tuple[str, str], Signal] = {}
        read_value: dict[tuple[str, str], object] = {}
        for _, reg in self._user:
            ports = getattr(self.regs, reg.name)
            for fld in reg.fields:
                key = (reg.name, fld.name)
                if fld.access is Access.R:
                    read_value[key] = getattr(ports, fld.name)
                    continue
                store = Signal(fld.width, init=fld.reset, name=f"{reg.name}__{fld.name}")
                storage[key] = store
                port = getattr(ports, fld.name)
                if fld.access is Access.RW:
                    m.d.comb += port.eq(store)
                    read_value[key] = store
                else:
                    m.d.comb += port.value.eq(store)
                    read_value[key] = store if fld.access is Access.RW1C else Const(0, fld.width)

        def word_of(reg: Register):
            if reg is self._id_reg:
                return Const(reg.reset, DATA_BITS)
            if reg is self._errors_reg:
                return errors
            return Cat(*(read_value[(reg.name, f.name)] for f in reg.fields))

        # --- write path: AW and W slots, commit, B ----------------------------------------
        aw_full = Signal()
        aw_word = Signal(word_width)
        w_full = Signal()
        w_data = Signal(DATA_BITS)
        w_strb = Signal(WORD_BYTES)
        bvalid = Signal()
        bresp = Signal(AxiResp)
        m.d.comb += [
            axi.awready.eq(~aw_full),
            axi.wready.eq(~w_full),
            axi.bvalid.eq(bvalid),
            axi.bresp.eq(bresp),
        ]
        with m.If(axi.awvalid & ~aw_full):
            m.d.sync += [aw_full.eq(1), aw_word.eq(axi.awaddr[LANE_BITS:])]
        with m.If(axi.wvalid & ~w_full):
            m.d.sync += [w_full.eq(1), w_data.eq(axi.wdata), w_strb.eq(axi.wstrb)]

        commit = Signal()
        m.d.comb += commit.eq(aw_full & w_full & (~bvalid | axi.bready))
        with m.If(bvalid & axi.bready):
            m.d.sync += bvalid.eq(0)

        # which words hold a register: the map's runs of consecutive words, a comparison pair
        # per run (one for a map without gaps); a write select only for registers with a
        # writable field
        runs: list[list[int]] = []
        for w in sorted(addr // WORD_BYTES for addr, _ in self._regmap):
            if runs and runs[-1][1] == w:
                runs[-1][1] = w + 1
            else:
                runs.append([w, w + 1])

        def is_mapped(word):
            return Cat(*((word >= lo) & (word < hi) for lo, hi in runs)).any()

        w_sel = {}
        for addr, reg in self._user:
            if all(f.access is Access.R for f in reg.fields):
                continue
            w_sel[reg.name] = sel = Signal(name=f"wsel_{reg.name}")
            m.d.comb += sel.eq(commit & (aw_word == addr // WORD_BYTES))
        w_mapped = Signal()
        m.d.comb += w_mapped.eq(is_mapped(aw_word))
        w_error = Signal()
        m.d.comb += w_error.eq(commit & ~w_mapped)
        with m.If(commit):
            m.d.sync += [aw_full.eq(0), w_full.eq(0), bvalid.eq(1),
                         bresp.eq(AxiResp.SLVERR)]
            with m.If(w_mapped):
                m.d.sync += bresp.eq(AxiResp.OKAY)

        bit_en = Signal(DATA_BITS)
        m.d.comb += bit_en.eq(Cat(*(w_strb[i].replicate(8) for i in range(WORD_BYTES))))
        for _, reg in self._user:
            ports = getattr(self.regs, reg.name)
            for fld, off in reg.offsets():
                if fld.access is Access.R:
                    continue
                sel = w_sel[reg.name]
                store = storage[(reg.name, fld.name)]
                en = bit_en[off:off + fld.width]
                new = w_data[off:off + fld.width]
                port = getattr(ports, fld.name)
                if fld.access in (Access.RW, Access.W):
                    with m.If(sel):
                        m.d.sync += store.eq((store & ~en) | (new & en))
                    if fld.access is Access.W:
                        m.d.sync += port.stb.eq(sel & en.any())
                else:  # RW1C: clear by software, then set by hardware (the set wins)
                    clear = Signal(fld.width, name=f"{reg.name}__{fld.name}__clear")
                    m.d.comb += clear.eq(Mux(sel, new & en, 0))
                    m.d.sync += store.eq((store & ~clear) | port.set)

        # --- read path: AR handshake samples, R holds --------------------------------------
        rvalid = Signal()
        rdata = Signal(DATA_BITS)
        rresp = Signal(AxiResp)
        m.d.comb += [
            axi.arready.eq(~rvalid),
            axi.rvalid.eq(rvalid),
            axi.rdata.eq(rdata),
            axi.rresp.eq(rresp),
        ]
        ar_take = Signal()
        m.d.comb += ar_take.eq(axi.arvalid & ~rvalid)
        r_error = Signal()
        with m.If(rvalid & axi.rready):
            m.d.sync += rvalid.eq(0)
        with m.If(ar_take):
            m.d.sync += [rvalid.eq(1), rresp.eq(AxiResp.OKAY)]
            # one multiplexer tree indexed by the word address (a gap or a word past the map
            # is a constant 0), not a comparator per register
            r_word = axi.araddr[LANE_BITS:]
            words = [Const(0, DATA_BITS)] * 2 ** word_width
            for addr, reg in self._regmap:
                words[addr // WORD_BYTES] = word_of(reg)
            m.d.sync += rdata.eq(Array(words)[r_word])
            with m.If(~is_mapped(r_word)):
                m.d.comb += r_error.eq(1)
                m.d.sync += rresp.eq(AxiResp.SLVERR)

        m.d.sync += errors.eq(errors + r_error + w_error)
        return m

