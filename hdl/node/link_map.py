"""Link ↔ router port crossbar (docs/node.md §9): ``LINK_MAP`` decides which physical link
carries each router port, so every board runs one bitstream."""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.csrmap import NODE_LINKS
from mcf.abi.framing import beat_layout
from mcf.abi.link_map import LINK_BITS, LINK_MAP_STATUS, link_map_layout

__all__ = ["LinkMap"]


class LinkMap(wiring.Component):
    """Stream crossbar between the router's ports and the physical links.

    Parameters
    ----------
    n_links: router ports = physical links (≤ ``NODE_LINKS``, 2**LINK_BITS − 1 at most).
    layout:  the frame beat layout (default ``beat_layout(64)``); it must have ``last``.

    Members
    -------
    ``mac_tx{p}``: ``In(stream)`` — frames router port ``p`` sends (``NicTop.mac_tx{p}``).
    ``mac_rx{p}``: ``Out(stream)`` — frames for router port ``p`` (to ``NicTop.mac_rx{p}``).
    ``link_tx{l}``: ``Out(stream)`` — frames towards physical link ``l``'s MAC.
    ``link_rx{l}``: ``In(stream)`` — frames from physical link ``l``'s MAC.
    ``map``: ``In(link_map_layout(n_links))`` — ``port{p}_link`` per port: the ``LINK_MAP``
        register's fields (:mod:`mcf.abi.link_map`; reset identity is the register's).
    ``status``: ``Out(LINK_MAP_STATUS)`` — ``rx_unmapped`` / ``tx_unmapped`` frame counters.

    Resolution (:func:`mcf.abi.link_map.link_map_routes`): port ``p`` owns link ``map[p]``
    unless that is ≥ ``n_links`` or a lower port names the same link — the lowest port wins.
    An owner's TX goes to its link and the link's RX to the owner. A port owning no link has
    ``ready`` high on ``mac_tx{p}`` (its frames are drained, each counted once at ``last`` in
    ``tx_unmapped``) and ``mac_rx{p}.valid`` low; a link no port owns has ``ready`` high on
    ``link_rx{l}`` (drained, counted in ``rx_unmapped``). Nothing ever waits on a missing peer.

    Change ``map`` only while every link is idle (between frames, as the driver does at bind):
    the crossbar is combinational, so a change inside a frame splits it between two outputs.

    Latency / rate: combinational, 0 cycles; 1 beat per cycle on every path at once;
    ``valid``/``payload`` pass straight from input to output and ``ready`` back.
    """

    def __init__(self, n_links: int = NODE_LINKS, layout: data.Layout | None = None):
        if not 1 <= n_links < (1 << LINK_BITS):
            raise ValueError(f"n_links must lie in 1..{(1 << LINK_BITS) - 1}")
        layout = data.Layout.cast(layout if layout is not None else beat_layout(64))
        if "last" not in dict(layout):
            raise ValueError("the beat layout needs a 'last' field")
        self._n = n_links
        sig = stream.Signature(layout)
        members = {}
        for p in range(n_links):
            members[f"mac_tx{p}"] = In(sig)
            members[f"mac_rx{p}"] = Out(sig)
        for ln in range(n_links):
            members[f"link_tx{ln}"] = Out(sig)
            members[f"link_rx{ln}"] = In(sig)
        members["map"] = In(link_map_layout(n_links))
        members["status"] = Out(LINK_MAP_STATUS)
        super().__init__(members)

    @property
    def n_links(self) -> int:
        return self._n

    def elaborate(self, platform):
        m = Module()
        n = self._n
        mac_tx = [getattr(self, f"mac_tx{p}") for p in range(n)]
        mac_rx = [getattr(self, f"mac_rx{p}") for p in range(n)]
        link_tx = [getattr(self, f"link_tx{ln}") for ln in range(n)]
        link_rx = [getattr(self, f"link_rx{ln}") for ln in range(n)]
        want = [getattr(self.map, f"port{p}_link") for p in range(n)]

        # owns[p][l]: port p owns link l (names it, and no lower port does)
        owns = [[Signal(name=f"own_p{p}_l{ln}") for ln in range(n)] for p in range(n)]
        for p in range(n):
            for ln in range(n):
                lower = [want[q] == ln for q in range(p)]
                m.d.comb += owns[p][ln].eq((want[p] == ln) & ~_any(lower))
        port_owns = [_any(owns[p]) for p in range(n)]
        link_owned = [_any(owns[p][ln] for p in range(n)) for ln in range(n)]

        for ln in range(n):
            for p in range(n):
                with m.If(owns[p][ln]):
                    wiring.connect(m, wiring.flipped(mac_tx[p]), wiring.flipped(link_tx[ln]))
                    wiring.connect(m, wiring.flipped(link_rx[ln]), wiring.flipped(mac_rx[p]))
        tx_drain = Signal(n)
        rx_drain = Signal(n)
        for p in range(n):
            with m.If(~port_owns[p]):
                m.d.comb += mac_tx[p].ready.eq(1)
            m.d.comb += tx_drain[p].eq(~port_owns[p] & mac_tx[p].valid & mac_tx[p].payload.last)
        for ln in range(n):
            with m.If(~link_owned[ln]):
                m.d.comb += link_rx[ln].ready.eq(1)
            m.d.comb += rx_drain[ln].eq(~link_owned[ln] & link_rx[ln].valid
                                        & link_rx[ln].payload.last)

        st = self.status
        m.d.sync += [st.tx_unmapped.eq(st.tx_unmapped + sum(tx_drain[p] for p in range(n))),
                     st.rx_unmapped.eq(st.rx_unmapped + sum(rx_drain[ln] for ln in range(n)))]
        return m


def _any(bits) -> object:
    bits = list(bits)
    out = Signal()
    if bits:
        out = bits[0]
        for b in bits[1:]:
            out = out | b
    return out
