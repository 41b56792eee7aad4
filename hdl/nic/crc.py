"""CRC-32 gateware (the reflected IEEE 802.3 polynomial, :mod:`mcf.abi.nic`): the link frames'
trailer (:mod:`mcf.hdl.nic.link`) and the Ethernet FCS of the MACs (:mod:`mcf.hdl.eth`).

:func:`crc32_update` is the combinational update of the CRC register by ``nbytes`` bytes (the
CRC is linear over GF(2): every output bit is an XOR of state and data bits); :class:`CrcByKeep`
updates it by the bytes a beat's contiguous ``keep`` selects.
"""

from __future__ import annotations

from functools import cache

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.nic import CRC32_POLY_REFLECTED

__all__ = ["crc32_update", "CrcByKeep"]


@cache
def _crc_matrix(nbytes: int) -> tuple[tuple[int, int], ...]:
    """For the reflected CRC-32 over ``nbytes`` bytes: per output bit, (mask over the 32 state
    bits, mask over the 8·nbytes data bits) whose XOR gives it (the CRC is linear over GF(2))."""
    state = [(1 << j, 0) for j in range(32)]
    for byte in range(nbytes):
        for bit in range(8):
            # state ^= data bit into bit 0, then shift right with the reflected polynomial
            s0, d0 = state[0]
            d0 ^= 1 << (8 * byte + bit)
            new = [state[j + 1] if j < 31 else (0, 0) for j in range(32)]
            for j in range(32):
                if CRC32_POLY_REFLECTED >> j & 1:
                    new[j] = (new[j][0] ^ s0, new[j][1] ^ d0)
            state = new
    return tuple(state)


def crc32_update(crc, data_bits, nbytes: int):
    """Amaranth expression: the CRC-32 register after ``nbytes`` low bytes of ``data_bits``."""
    out = []
    for smask, dmask in _crc_matrix(nbytes):
        terms = [crc[j] for j in range(32) if smask >> j & 1]
        terms += [data_bits[j] for j in range(8 * nbytes) if dmask >> j & 1]
        out.append(Cat(*terms).xor() if terms else Const(0, 1))
    return Cat(*out)


class CrcByKeep(wiring.Component):
    """Combinational CRC-32 update of a beat whose ``keep`` is contiguous from byte 0 (any other
    ``keep`` leaves the CRC unchanged).

    A full beat takes one ``bytes``-byte update; a partial beat of ``n`` bytes takes the binary
    decomposition of ``n`` (4, then 2, then 1 bytes on a 64-bit beat), each part applied to the
    previous part's state — a third of the logic of one update per possible ``n``, same result
    (the CRC is a left fold over the bytes).
    """

    def __init__(self, data_width):
        self._bpb = data_width // 8
        super().__init__({"crc_in": In(32), "data": In(data_width), "keep": In(self._bpb),
                          "crc_out": Out(32)})

    def elaborate(self, platform):
        m = Module()
        B = self._bpb
        n = Signal(range(B + 1))          # bytes of a contiguous keep, 0 otherwise
        for i in range(1, B + 1):
            with m.If(self.keep == (1 << i) - 1):
                m.d.comb += n.eq(i)
        state, offset = self.crc_in, 0    # offset: bytes taken so far (a mux value)
        for bit in reversed(range((B - 1).bit_length())):
            size = 1 << bit
            # the part starts at one of the offsets the larger parts can have left
            starts = range(0, B - size + 1, 2 * size)
            part = Signal(8 * size, name=f"part{size}")
            m.d.comb += part.eq(Array(self.data[8 * o:8 * (o + size)] for o in starts)[
                offset // (2 * size) if isinstance(offset, int) else offset >> (bit + 1)])
            nxt = Signal(32, name=f"crc_part{size}")
            m.d.comb += nxt.eq(Mux(n[bit], crc32_update(state, part, size), state))
            took = Signal(range(B + 1), name=f"took{size}")
            m.d.comb += took.eq(offset + Mux(n[bit], size, 0))
            state, offset = nxt, took
        m.d.comb += self.crc_out.eq(Mux(n == B, crc32_update(self.crc_in, self.data, B),
                                        Mux(n == 0, self.crc_in, state)))
        return m
