"""Link loop for benches (paper §5, the NIC's link ports): a :class:`LinkTx` whose frames cross a
:class:`LinkModel` into a :class:`LinkRx`, plus a second :class:`LinkRx` fed directly by the bench
with hand-made (malformed) frames. Simulation assembly only: it is not part of the node top."""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.framing import MAX_PAYLOAD, beat_layout, parsed_layout
from mcf.abi.meta import META
from mcf.abi.nic import LINK_RX_STATUS, LINK_TX_STATUS

from .link import LinkRx, LinkTx
from .link_model import LINK_MODEL_STATUS, LinkModel

__all__ = ["LinkLoop", "tap_signature"]


def tap_signature(data_width: int) -> wiring.Signature:
    """A read-only copy of a beat stream's handshake and payload (AXI-Stream field names, so that
    a flat top exposes ``<name>_tvalid`` … for a bus monitor)."""
    return wiring.Signature({"tvalid": Out(1), "tready": Out(1), "tdata": Out(data_width),
                             "tkeep": Out(data_width // 8), "tlast": Out(1)})


class LinkLoop(wiring.Component):
    """``LinkTx → LinkModel → LinkRx`` plus an independent ``LinkRx`` for injected frames.

    Parameters: ``data_width``, ``max_payload`` (both receivers; default ``MAX_PAYLOAD``), and
    the link model's ``latency``, ``rate`` = (num, den) bytes/cycle, ``drop_p16``,
    ``flip_p16``, ``seed`` (see :class:`mcf.hdl.nic.link_model.LinkModel`).

    Members
    -------
    ``i``: ``In(stream.Signature(parsed_layout))`` — packets into the transmitter.
    ``o``: ``Out(stream.Signature(beat_layout))`` — wire packets delivered by the link's receiver.
    ``inj``: ``In(stream.Signature(beat_layout))`` — frames straight into the second receiver.
    ``inj_o``: ``Out(stream.Signature(beat_layout))`` — wire packets that receiver delivers.
    ``tap``: :func:`tap_signature` — the frames as they leave the link model (after drops and
    bit flips), i.e. exactly what the link's receiver sees; observation only.
    ``tx_status`` (``LINK_TX_STATUS``), ``link_status`` (``LINK_MODEL_STATUS``), ``rx_status``
    and ``inj_status`` (``LINK_RX_STATUS``): ``Out``.

    Latency and stream rules are those of the three parts (no registers are added).
    """

    def __init__(self, *, data_width: int = 64, max_payload: int = MAX_PAYLOAD, latency: int = 12,
                 rate: tuple[int, int] = (6, 1), drop_p16: int = 0, flip_p16: int = 0,
                 seed: int = 0xACE1, meta_layout: data.StructLayout = META):
        self._dw = data_width
        self._max_payload = max_payload
        self.tx = LinkTx(data_width=data_width, meta_layout=meta_layout)
        self.link = LinkModel(data_width=data_width, latency=latency, rate=rate,
                              drop_p16=drop_p16, flip_p16=flip_p16, seed=seed,
                              meta_layout=meta_layout)
        self.rx = LinkRx(data_width=data_width, max_payload=max_payload,
                         meta_layout=meta_layout)
        self.inj_rx = LinkRx(data_width=data_width, max_payload=max_payload,
                             meta_layout=meta_layout)
        beat = beat_layout(data_width, meta_layout)
        super().__init__({
            "i": In(stream.Signature(parsed_layout(data_width, meta_layout))),
            "o": Out(stream.Signature(beat)),
            "inj": In(stream.Signature(beat)),
            "inj_o": Out(stream.Signature(beat)),
            "tap": Out(tap_signature(data_width)),
            "tx_status": Out(LINK_TX_STATUS),
            "link_status": Out(LINK_MODEL_STATUS),
            "rx_status": Out(LINK_RX_STATUS),
            "inj_status": Out(LINK_RX_STATUS),
        })

    @property
    def data_width(self) -> int:
        return self._dw

    @property
    def max_payload(self) -> int:
        return self._max_payload

    def elaborate(self, platform):
        m = Module()
        m.submodules.tx = self.tx
        m.submodules.link = self.link
        m.submodules.rx = self.rx
        m.submodules.inj_rx = self.inj_rx
        wiring.connect(m, wiring.flipped(self.i), self.tx.i)
        wiring.connect(m, self.tx.o, self.link.i)
        wiring.connect(m, self.link.o, self.rx.i)
        wiring.connect(m, self.rx.o, wiring.flipped(self.o))
        wiring.connect(m, wiring.flipped(self.inj), self.inj_rx.i)
        wiring.connect(m, self.inj_rx.o, wiring.flipped(self.inj_o))
        w = self.link.o
        m.d.comb += [
            self.tap.tvalid.eq(w.valid), self.tap.tready.eq(w.ready),
            self.tap.tdata.eq(w.payload.data), self.tap.tkeep.eq(w.payload.keep),
            self.tap.tlast.eq(w.payload.last),
            self.tx_status.eq(self.tx.status), self.link_status.eq(self.link.status),
            self.rx_status.eq(self.rx.status), self.inj_status.eq(self.inj_rx.status),
        ]
        return m
