"""AXI-Lite register maps: typed registers and fields, access kinds, builder-assigned addresses.

A :class:`RegisterMap` is built once in Python; the HDL CSR bank (``mcf.hdl.csr``) elaborates it,
the PYNQ driver injects it into ``description["registers"]``, and ``mcf abi`` prints it. Nobody
types an address. Register 0 of every map is the ID/version word a driver checks when it binds.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from amaranth.hdl import unsigned
from amaranth.lib import data

__all__ = ["Access", "Field", "Register", "RegisterMap", "MCF_ID", "WORD_BYTES",
           "status_registers", "bank_registers", "COUNTER_BITS", "counters"]

COUNTER_BITS = 32
"""Width of every status counter in the register maps (saturating or wrapping per block)."""


def counters(*names: str) -> data.StructLayout:
    """A status register layout of ``COUNTER_BITS``-wide counters, one per name, in order."""
    return data.StructLayout({n: unsigned(COUNTER_BITS) for n in names})


WORD_BYTES = 4
MCF_ID = 0x4D43  # "MC"


class Access(enum.Enum):
    R = "R"        # read-only: hardware drives it
    W = "W"        # write-only: reads return 0; a write produces a one-cycle strobe
    RW = "RW"      # read-write storage
    RW1C = "RW1C"  # sticky status: hardware sets bits, writing 1 clears them


@dataclass(frozen=True)
class Field:
    name: str
    width: int
    access: Access
    reset: int = 0
    desc: str = ""

    def __post_init__(self):
        if not 1 <= self.width <= 32:
            raise ValueError(f"field {self.name}: width {self.width} not in 1..32")
        if not 0 <= self.reset < (1 << self.width):
            raise ValueError(f"field {self.name}: reset {self.reset:#x} does not fit")


@dataclass(frozen=True)
class Register:
    name: str
    fields: tuple[Field, ...]
    desc: str = ""

    def __post_init__(self):
        if sum(f.width for f in self.fields) > 8 * WORD_BYTES:
            raise ValueError(f"register {self.name}: fields exceed {8 * WORD_BYTES} bits")
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"register {self.name}: duplicate field names")

    @classmethod
    def single(cls, name: str, width: int, access: Access, reset: int = 0, desc: str = ""):
        """A register holding one field of the same name."""
        return cls(name, (Field(name, width, access, reset, desc),), desc)

    def offsets(self) -> Iterator[tuple[Field, int]]:
        """Fields with their bit offsets, LSB first in declaration order."""
        offset = 0
        for f in self.fields:
            yield f, offset
            offset += f.width

    @property
    def reset(self) -> int:
        return sum(f.reset << off for f, off in self.offsets())

    def pack(self, **values: int) -> int:
        """The 32-bit word writing ``values`` (field name → value); unnamed fields take their
        reset value. Raises on an unknown field or a value that does not fit."""
        names = {f.name for f in self.fields}
        if unknown := set(values) - names:
            raise ValueError(f"register {self.name} has no field {sorted(unknown)[0]!r}")
        word = 0
        for f, off in self.offsets():
            v = int(values.get(f.name, f.reset))
            if not 0 <= v < (1 << f.width):
                raise ValueError(f"{self.name}.{f.name}={v} does not fit in {f.width} bits")
            word |= v << off
        return word

    def unpack(self, word: int) -> dict[str, int]:
        """Field name → value of a 32-bit word read from the register."""
        return {f.name: (word >> off) & ((1 << f.width) - 1) for f, off in self.offsets()}


def status_registers(prefix: str, layout: data.StructLayout, desc: str = "") -> list[Register]:
    """One read-only register ``<prefix>_<field>`` per field of a status layout; a field that
    is itself a layout (e.g. a tag) is one register holding its bits."""
    return [Register.single(f"{prefix}_{name}", fld.width, Access.R,
                            desc=f"{desc} {name}".strip())
            for name, fld in layout]


@dataclass
class RegisterMap:
    """Builder: ``add`` assigns the next word address. Register 0 is ``ID`` (id, version),
    register 1 ``BUS_ERRORS`` (maintained by the CSR bank itself)."""
    name: str
    version: int
    ident: int = MCF_ID
    _regs: list[tuple[int, Register]] = field(default_factory=list)

    def __post_init__(self):
        self.add(Register("ID", (
            Field("version", 16, Access.R, self.version, "map version (major << 8 | minor)"),
            Field("ident", 16, Access.R, self.ident, "constant identifying an MCF block"),
        ), "identification word; a driver refuses to bind if it does not match"))
        self.add(Register.single(
            "BUS_ERRORS", 32, Access.R,
            desc="accesses to unmapped addresses (answered SLVERR), counted by the CSR bank"))

    def add(self, reg: Register) -> int:
        if any(r.name == reg.name for _, r in self._regs):
            raise ValueError(f"register {reg.name} already in map {self.name}")
        addr = len(self._regs) * WORD_BYTES
        self._regs.append((addr, reg))
        return addr

    def add_status(self, prefix: str, layout: data.StructLayout, desc: str = "") -> None:
        """One read-only register per field of a status layout (counters, flags)."""
        self.extend(status_registers(prefix, layout, desc))

    def extend(self, regs: Iterable[Register]) -> None:
        for reg in regs:
            self.add(reg)

    def __iter__(self) -> Iterator[tuple[int, Register]]:
        return iter(self._regs)

    def __len__(self) -> int:
        return len(self._regs)

    @property
    def size(self) -> int:
        """Address span in bytes (a power of two, as AXI address decoding wants)."""
        span = max(len(self._regs) * WORD_BYTES, WORD_BYTES)
        return 1 << (span - 1).bit_length()

    def addr(self, name: str) -> int:
        for addr, reg in self._regs:
            if reg.name == name:
                return addr
        raise KeyError(f"no register {name!r} in map {self.name}")

    def register(self, name: str) -> Register:
        return self._regs[self.addr(name) // WORD_BYTES][1]

    @property
    def id_word(self) -> int:
        return self._regs[0][1].reset

    def pynq_registers(self) -> dict:
        """The ``description["registers"]`` dict PYNQ's ``DefaultIP.register_map`` consumes."""
        out = {}
        for addr, reg in self._regs:
            access = "read-only" if all(f.access is Access.R for f in reg.fields) else (
                "write-only" if all(f.access is Access.W for f in reg.fields) else "read-write")
            out[reg.name] = {
                "address_offset": addr, "size": 8 * WORD_BYTES, "access": access,
                "description": reg.desc,
                "fields": {f.name: {"bit_offset": off, "bit_width": f.width,
                                    "access": "read-only" if f.access is Access.R else
                                    "write-only" if f.access is Access.W else "read-write",
                                    "description": f.desc}
                           for f, off in reg.offsets()},
            }
        return out


def bank_registers(regmap: RegisterMap) -> tuple[Register, Register]:
    """The two registers the CSR bank owns, where the builder places them: register 0 (``ID``, a
    constant) and register 1 (``BUS_ERRORS``, counted by the bank)."""
    regs = [reg for _, reg in regmap]
    return regs[0], regs[1]
