"""Host model of the AXI-Lite CSR bank (``mcf.hdl.csr.CsrBank``): the scoreboard of its benches.

It models the register semantics the bank implements for any :class:`mcf.abi.regs.RegisterMap`,
one bus access at a time, with no knowledge of the bank's pipeline:

* a word address is ``addr // WORD_BYTES`` (the byte-lane bits of the address are ignored); a
  word holding no register of the map answers ``SLVERR`` (reads return 0) and increments
  ``BUS_ERRORS`` (wrapping at its field width);
* register 0 (``ID``) reads its reset word; register 1 (``BUS_ERRORS``) reads the error count;
* ``R`` fields read what hardware drives (:attr:`CsrModel.inputs`); writes to them are ignored
  and answered ``OKAY``;
* ``RW`` fields store the written bytes (``wstrb`` selects bytes); ``W`` fields do the same but
  read as 0, and a write enabling any byte of a ``W`` field fires its one-cycle strobe
  (:attr:`CsrModel.strobes` lists the fields the last write fired);
* ``RW1C`` fields are sticky: :meth:`CsrModel.hw_set` ORs bits in, a write clears the bits that
  are 1 in ``wdata`` within enabled bytes.

Events at one clock edge are applied in the bank's order by :meth:`CsrModel.edge`: reads sample
the state before the edge, then the write (RW1C clear), then hardware sets — so when hardware
sets and software clears the same bit at the same edge, **the set wins** and no event is lost.

Pure Python on ints (no simulator needed); imports only the ABI.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..abi.axi import AxiResp
from ..abi.regs import WORD_BYTES, Access, Field, Register, RegisterMap, bank_registers

__all__ = ["OKAY", "SLVERR", "CsrModel", "FieldSlot", "byte_mask"]

OKAY = AxiResp.OKAY.value
SLVERR = AxiResp.SLVERR.value

DATA_BITS = 8 * WORD_BYTES
STORED = (Access.RW, Access.W, Access.RW1C)


def byte_mask(strb: int) -> int:
    """Bit mask enabled by a ``wstrb`` value."""
    return sum(0xFF << (8 * i) for i in range(WORD_BYTES) if (strb >> i) & 1)


@dataclass(frozen=True)
class FieldSlot:
    """One field placed in its register: ``(value >> offset) & mask`` extracts it."""
    reg: Register
    field: Field
    offset: int

    @property
    def key(self) -> tuple[str, str]:
        return (self.reg.name, self.field.name)

    @property
    def mask(self) -> int:
        return (1 << self.field.width) - 1

    @property
    def word_mask(self) -> int:
        return self.mask << self.offset


class CsrModel:
    """Register semantics of the CSR bank for ``regmap``."""

    def __init__(self, regmap: RegisterMap):
        self.regmap = regmap
        self.id_reg, self.errors_reg = bank_registers(regmap)
        self._by_word: dict[int, Register] = {addr // WORD_BYTES: reg for addr, reg in regmap}
        self.slots: dict[tuple[str, str], FieldSlot] = {}
        for _, reg in regmap:
            for fld, off in reg.offsets():
                self.slots[(reg.name, fld.name)] = FieldSlot(reg, fld, off)
        self.reset()

    # --- state -----------------------------------------------------------------------------
    def reset(self) -> None:
        self.storage: dict[tuple[str, str], int] = {
            s.key: s.field.reset for s in self.slots.values()
            if s.reg not in (self.id_reg, self.errors_reg) and s.field.access in STORED}
        self.inputs: dict[tuple[str, str], int] = {
            s.key: 0 for s in self.slots.values()
            if s.reg not in (self.id_reg, self.errors_reg) and s.field.access is Access.R}
        self.bus_errors = 0
        self.strobes: set[tuple[str, str]] = set()

    @property
    def errors_mask(self) -> int:
        return (1 << sum(f.width for f in self.errors_reg.fields)) - 1

    def decode(self, addr: int) -> Register | None:
        return self._by_word.get(addr // WORD_BYTES)

    def _field_read(self, slot: FieldSlot) -> int:
        if slot.reg is self.id_reg:
            return slot.field.reset
        if slot.reg is self.errors_reg:
            return (self.bus_errors >> slot.offset) & slot.mask
        if slot.field.access is Access.R:
            return self.inputs[slot.key] & slot.mask
        if slot.field.access is Access.W:
            return 0
        return self.storage[slot.key]

    def word(self, reg: Register) -> int:
        """The 32-bit word a read of ``reg`` returns now."""
        return sum(self._field_read(self.slots[(reg.name, f.name)]) << off
                   for f, off in reg.offsets())

    # --- bus accesses ----------------------------------------------------------------------
    def read(self, addr: int) -> tuple[int, int]:
        """``(rresp, rdata)`` of a read of byte address ``addr``."""
        reg = self.decode(addr)
        if reg is None:
            self.bus_errors = (self.bus_errors + 1) & self.errors_mask
            return SLVERR, 0
        return OKAY, self.word(reg)

    def write(self, addr: int, data: int, strb: int) -> int:
        """Apply a write; return ``bresp``. :attr:`strobes` lists the W fields it fired."""
        self.strobes = set()
        reg = self.decode(addr)
        if reg is None:
            self.bus_errors = (self.bus_errors + 1) & self.errors_mask
            return SLVERR
        if reg in (self.id_reg, self.errors_reg):
            return OKAY
        bits = byte_mask(strb)
        for fld, off in reg.offsets():
            slot = self.slots[(reg.name, fld.name)]
            enabled = (bits >> off) & slot.mask
            new = (data >> off) & slot.mask
            if fld.access in (Access.RW, Access.W):
                self.storage[slot.key] = (self.storage[slot.key] & ~enabled) | (new & enabled)
                if fld.access is Access.W and enabled:
                    self.strobes.add(slot.key)
        for key, bits in self.rw1c_clears(addr, data, strb).items():
            self.storage[key] &= ~bits
        return OKAY

    def rw1c_clears(self, addr: int, data: int, strb: int) -> dict[tuple[str, str], int]:
        """The RW1C bits a write would clear (whether they are set or not), per field."""
        reg = self.decode(addr)
        if reg is None:
            return {}
        bits = byte_mask(strb)
        return {(reg.name, f.name): (data & bits) >> off & ((1 << f.width) - 1)
                for f, off in reg.offsets() if f.access is Access.RW1C}

    def hw_set(self, reg: str, field: str, bits: int) -> None:
        """Hardware raises ``bits`` of a RW1C field (sticky)."""
        slot = self.slots[(reg, field)]
        if slot.field.access is not Access.RW1C:
            raise ValueError(f"{reg}.{field} is {slot.field.access.value}, not RW1C")
        self.storage[slot.key] |= bits & slot.mask

    def edge(self, reads: Iterable[int] = (), write: tuple[int, int, int] | None = None,
             sets: dict[tuple[str, str], int] | None = None) -> tuple[list, int | None]:
        """Everything that happens at one clock edge, in the bank's order: reads sample the
        state before the edge, then the write applies, then hardware sets (a set wins over a
        clear of the same bit). Returns ``([(rresp, rdata)…], bresp or None)``."""
        results = [self.read(a) for a in reads]
        bresp = self.write(*write) if write is not None else None
        if write is None:
            self.strobes = set()
        for (reg, field), bits in (sets or {}).items():
            self.hw_set(reg, field, bits)
        return results, bresp

    # --- host-side helpers -----------------------------------------------------------------
    def pack(self, reg: str, **fields: int) -> int:
        """A register word from field values (unnamed fields 0)."""
        register = self.regmap.register(reg)
        word = 0
        for name, value in fields.items():
            slot = self.slots[(register.name, name)]
            if not 0 <= value <= slot.mask:
                raise ValueError(f"{reg}.{name} = {value:#x} does not fit {slot.field.width} bits")
            word |= value << slot.offset
        return word

    def unpack(self, reg: str, word: int) -> dict[str, int]:
        register = self.regmap.register(reg)
        return {f.name: (word >> off) & ((1 << f.width) - 1) for f, off in register.offsets()}
