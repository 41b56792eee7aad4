"""What every block of the packet path states about itself: its data width and its metadata
layout (read-only after construction)."""

from __future__ import annotations

from amaranth.lib import data, wiring

__all__ = ["PacketStage"]


class PacketStage(wiring.Component):
    """Base of :class:`~mcf.hdl.packet.packetizer.Packetizer` and
    :class:`~mcf.hdl.packet.parser.Parser`: ``data_width`` (bits per beat) and ``meta_layout``
    (the :class:`~mcf.abi.meta.Meta` layout its beats carry), then the members ``members`` (no
    logic of its own)."""

    def __init__(self, data_width: int, meta_layout: data.StructLayout, members: dict):
        self._data_width = data_width
        self._meta_layout = meta_layout
        super().__init__(members)

    @property
    def data_width(self) -> int:
        return self._data_width

    @property
    def meta_layout(self) -> data.StructLayout:
        return self._meta_layout
