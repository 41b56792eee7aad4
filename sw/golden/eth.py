"""Counting golden model of one Ethernet MAC (``mcf.hdl.eth``): the
:data:`mcf.abi.eth.ETH_STATUS` counters after frames sent and received. The frame format and the
receive decision are the ABI's (:func:`mcf.abi.eth.encap`, :func:`mcf.abi.eth.decap`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mcf.abi.eth import ETH_STATUS, RX_COUNTER, EthDrop, decap, encap

__all__ = ["EthModel"]


@dataclass
class EthModel:
    """Counting golden model of one MAC: :data:`ETH_STATUS` after ``send``/``receive``."""
    local: int
    peer: int
    status: dict = field(default_factory=lambda: {n: 0 for n, _ in ETH_STATUS})

    def send(self, link: bytes) -> bytes:
        frame = encap(link, self.local, self.peer)
        self.status["tx_frames"] += 1
        self.status["tx_bytes"] += len(frame)
        return frame

    def receive(self, frame: bytes, **kw) -> bytes | None:
        cause, link = decap(frame, self.local, **kw)
        if cause == EthDrop.OK:
            self.status["rx_frames"] += 1
            self.status["rx_bytes"] += len(frame)
            return link
        self.status[RX_COUNTER[cause]] += 1
        return None
