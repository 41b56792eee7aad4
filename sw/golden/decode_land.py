"""Golden model of the decode lander (``mcf.hdl.node.decode_land.DecodeLander``): QBUF, OBUF,
MBUF and SUM-slot bytes and the :data:`mcf.abi.decode_land.DECODE_LAND_STATUS` counters, bit
for bit.

The format and the decision are the ABI's (:mod:`mcf.abi.decode_land`:
:func:`~mcf.abi.decode_land.decode_land_decision`, the addresses,
:func:`~mcf.abi.decode_land.normalized_row`); this module applies them to a packet stream.
"""

from __future__ import annotations

import numpy as np

from mcf.abi.decode_land import (
    DEC_ADDR_BITS,
    DECODE_LAND_STATUS,
    M_SLOT_BYTES,
    SUM_SLOT_BYTES,
    DecodeLandConfig,
    DecodeLandResult,
    decode_land_decision,
    normalized_row,
    obuf_row_bytes,
)
from mcf.abi.meta import Meta

from .landing import write_outcome

__all__ = ["DecodeLandModel"]


class DecodeLandModel:
    """Golden model of the decode lander: DDR bytes written (``mem``: address → byte) and the
    :data:`DECODE_LAND_STATUS` counters (``status``)."""

    def __init__(self, cfg: DecodeLandConfig, head_dim: int):
        self.cfg, self.head_dim = cfg, head_dim
        self.mem: dict[int, int] = {}
        self.status = {name: 0 for name, _ in DECODE_LAND_STATUS}

    def land(self, meta: Meta, payload: bytes, write_error: bool = False) -> DecodeLandResult:
        """One packet as 64-bit parsed beats carrying ``payload`` (its length may disagree with
        ``meta.length``: the lander takes ``meta.length`` bytes, cut or zero-padded);
        ``write_error``: its write is answered SLVERR (its bytes are then not modelled)."""
        body = (bytes(payload) + bytes(meta.length))[:meta.length]
        result, addr = decode_land_decision(self.cfg, meta, payload, self.head_dim)
        drop = result.value if addr is None else None
        if not write_outcome(self.status, drop, payload, meta.length, write_error):
            return result
        if result is DecodeLandResult.RESULT:
            body = normalized_row(body, self.head_dim)
        for i, b in enumerate(body):
            self.mem[(addr + i) % (1 << DEC_ADDR_BITS)] = b
        self.status[result.value] += 1
        return result

    def row(self, layer: int, head: int) -> np.ndarray:
        """OBUF row ``(layer mod 2, head)`` as signed ATTN_OUT codes (unwritten bytes: 0)."""
        base = self.cfg.obuf_base + ((layer & 1) * self.cfg.q_heads + head) * \
            obuf_row_bytes(self.head_dim)
        raw = bytes(self.mem.get((base + i) % (1 << DEC_ADDR_BITS), 0)
                    for i in range(obuf_row_bytes(self.head_dim)))
        return np.frombuffer(raw, dtype="<i4").astype(np.int64)

    def maxima(self, layer: int, head0: int, heads: int) -> np.ndarray:
        """MBUF slot ``(layer mod 2, head0)``'s first ``heads`` maxima (unwritten bytes: 0)."""
        base = self.cfg.mbuf_base + ((layer & 1) * self.cfg.q_heads + head0) * M_SLOT_BYTES
        raw = bytes(self.mem.get((base + i) % (1 << DEC_ADDR_BITS), 0)
                    for i in range(4 * heads))
        return np.frombuffer(raw, dtype="<i4").astype(np.int64)

    def lanes(self, slot: int, words: int) -> np.ndarray:
        """SUM slot ``slot``'s first ``words`` lanes as signed 32-bit words (unwritten bytes:
        0); the slots are contiguous, so a row's lanes read on across them."""
        base = self.cfg.sum_base + slot * SUM_SLOT_BYTES
        raw = bytes(self.mem.get((base + i) % (1 << DEC_ADDR_BITS), 0)
                    for i in range(4 * words))
        return np.frombuffer(raw, dtype="<i4").astype(np.int64)
