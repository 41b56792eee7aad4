"""Packet path gateware (paper §5): packetization buffer, store-and-forward parser/dispatcher."""

from .packet_buffer import PacketBuffer
from .packetizer import Packetizer
from .parser import Parser

__all__ = ["PacketBuffer", "Packetizer", "Parser"]
