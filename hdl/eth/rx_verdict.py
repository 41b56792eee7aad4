"""The receive verdict of an Ethernet frame: which :class:`mcf.abi.eth.EthDrop` cause, if any,
drops it — the checks in the order :func:`mcf.abi.eth.decap` makes them (``docs/eth.md``).
Used at a frame's last byte by both MACs' decapsulators: :class:`mcf.hdl.eth.encap.EthDecap`
(1G, 8 bits) and :class:`mcf.hdl.eth.xgmii.XgmiiDecap` (10G, 64 bits).
"""

from __future__ import annotations

from amaranth import Module, Mux
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.eth import (
    ETH_EVENT,
    ETH_TYPE,
    FCS_BYTES,
    HEADER_BYTES,
    MAX_FRAME,
    MAX_LINK_FRAME,
    MIN_FRAME,
    MIN_PAYLOAD,
    EthDrop,
)

__all__ = ["RxVerdict", "CRC_RESIDUE"]

CRC_RESIDUE = 0xDEBB20E3     # CRC register after a frame followed by its own (good) FCS

FRAME_BYTES = ETH_EVENT["bytes"].shape   # frame byte counts: the event's (saturating) width


class RxVerdict(wiring.Component):
    """The cause a received frame is dropped for (``EthDrop.OK``: delivered), first match in
    this order: ``PHY_ERROR``, ``OVERFLOW``, ``RUNT``, ``OVERSIZE``, ``FCS``, ``ETHERTYPE``,
    ``FOREIGN``, ``BAD_LENGTH``.

    Members
    -------
    phy_err : In(1)
        A byte of the frame arrived with a PHY error.
    room : In(1)
        The link frame fitted in the receive buffer (low: ``OVERFLOW``).
    frame_bytes : In(16)
        Frame bytes dst..FCS.
    crc : In(32)
        The CRC-32 register after every byte of the frame, its FCS included (good:
        :data:`CRC_RESIDUE`).
    ethertype : In(16)
        Frame bytes 12..13, big-endian.
    dst_ok : In(1)
        The destination address is this node's.
    link_bytes : In(16)
        The link frame's length from its ``Meta.length`` (``LINK_OVERHEAD + length``).
    cause : Out(``ETH_EVENT.cause``)
        :class:`mcf.abi.eth.EthDrop`.

    Combinational (latency 0).
    """

    def __init__(self):
        super().__init__({
            "phy_err": In(1),
            "room": In(1),
            "frame_bytes": In(FRAME_BYTES),
            "crc": In(32),
            "ethertype": In(16),
            "dst_ok": In(1),
            "link_bytes": In(FRAME_BYTES),
            "cause": Out(ETH_EVENT["cause"].shape),
        })

    def elaborate(self, platform):
        m = Module()
        n, ll = self.frame_bytes, self.link_bytes
        pay = n - HEADER_BYTES - FCS_BYTES
        with m.If(self.phy_err):
            m.d.comb += self.cause.eq(EthDrop.PHY_ERROR)
        with m.Elif(~self.room):
            m.d.comb += self.cause.eq(EthDrop.OVERFLOW)
        with m.Elif(n < MIN_FRAME):
            m.d.comb += self.cause.eq(EthDrop.RUNT)
        with m.Elif(n > MAX_FRAME):
            m.d.comb += self.cause.eq(EthDrop.OVERSIZE)
        with m.Elif(self.crc != CRC_RESIDUE):
            m.d.comb += self.cause.eq(EthDrop.FCS)
        with m.Elif(self.ethertype != ETH_TYPE):
            m.d.comb += self.cause.eq(EthDrop.ETHERTYPE)
        with m.Elif(~self.dst_ok):
            m.d.comb += self.cause.eq(EthDrop.FOREIGN)
        with m.Elif((ll > MAX_LINK_FRAME) | (pay != Mux(ll < MIN_PAYLOAD, MIN_PAYLOAD, ll))):
            m.d.comb += self.cause.eq(EthDrop.BAD_LENGTH)
        return m
