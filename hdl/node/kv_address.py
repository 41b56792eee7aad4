"""The ``kv_id`` → DDR address rule in hardware: the ``LAND_OFF`` table and
``KV_BASE + kv_id · KV_SLOT + LAND_OFF[seq].offset`` (docs/node.md §5 "DDR layout and the
kv_id -> address rule"; :func:`mcf.abi.landing.kv_address` is the golden rule). One per user:
the landing engine (:class:`mcf.hdl.node.landing.LandingEngine`) and the send unit
(:class:`mcf.hdl.node.send.SendUnit`) each hold one, written by the same strobe.
"""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.landing import KV_ALIGN, LAND_OFF_ENTRIES, LAND_OFF_ENTRY, LANDING_CONFIG
from mcf.abi.meta import META

from ..mem.axi import ADDR_BITS
from ..mem.dma import align_down

__all__ = ["KvAddress", "kv_table_members"]


def kv_table_members() -> dict:
    """The members through which a :class:`KvAddress` user (the landing engine, the send
    unit) takes the table and the configuration: ``cfg`` (:data:`LANDING_CONFIG`) and the
    ``LAND_OFF`` write port ``land_off_we``, ``land_off_seq``, ``land_off_data``; a user
    passes them on with :meth:`KvAddress.connect_table`."""
    return {"cfg": In(LANDING_CONFIG), "land_off_we": In(1),
            "land_off_seq": In(META["seq"].width), "land_off_data": In(LAND_OFF_ENTRY)}


class KvAddress(wiring.Component):
    """``LAND_OFF`` table and the KV slot address of one packet at a time.

    Parameters
    ----------
    addr_width : int
        Width of ``addr`` (40): the sum is cut to it.

    Members
    -------
    land_off_we, land_off_seq, land_off_data : In
        ``LAND_OFF`` write port: one entry (:data:`mcf.abi.landing.LAND_OFF_ENTRY`) per cycle
        with ``land_off_we``. Write it while no packet is being looked up.
    cfg : In(:data:`mcf.abi.landing.LANDING_CONFIG`)
        ``kv_base`` and ``kv_slot`` (``kv_count`` is the users' check); these and the table's
        offsets are taken with their low 2 bits as 0 (:data:`~mcf.abi.landing.KV_ALIGN`: every
        address is a whole word).
    take : In(1)
        Look up ``kv_id``, ``seq``: the table is read and ``kv_id · kv_slot`` registered at
        this cycle's edge.
    kv_id, seq : In(``Meta.kv_id``, ``Meta.seq`` widths)
        The packet's, sampled with ``take``.
    length : In(``Meta.length`` width)
        The packet's length in bytes, for ``fits`` (combinational: give it in the cycle after
        ``take``).
    entry : Out(:data:`mcf.abi.landing.LAND_OFF_ENTRY`)
        ``LAND_OFF[seq]``.
    addr : Out(addr_width)
        ``kv_base + kv_id · kv_slot + entry.offset`` (``kv_base`` as it is now), a multiple of
        ``KV_ALIGN``.
    fits : Out(1)
        ``entry.valid`` and ``entry.offset + length <= kv_slot``: the packet lies inside its
        slot.

    Latency 1: ``entry``, ``addr`` and ``fits`` hold the lookup from the cycle after
    ``take`` until the cycle after the next ``take`` (``addr``/``fits`` follow ``cfg`` and
    ``length`` combinationally). One lookup per cycle.
    """

    def __init__(self, addr_width: int = ADDR_BITS):
        self.addr_width = addr_width
        super().__init__({
            **kv_table_members(),
            "take": In(1),
            "kv_id": In(META["kv_id"].width),
            "seq": In(META["seq"].width),
            "length": In(META["length"].width),
            "entry": Out(LAND_OFF_ENTRY),
            "addr": Out(addr_width),
            "fits": Out(1),
        })

    def connect_table(self, m: Module, owner) -> None:
        """Drives this block's :func:`kv_table_members` from ``owner``'s members of the same
        names (combinationally, in ``m``)."""
        m.d.comb += [getattr(self, name).eq(getattr(owner, name))
                     for name in kv_table_members()]

    def elaborate(self, platform):
        m = Module()
        m.submodules.land_off = lo_mem = memory.Memory(shape=LAND_OFF_ENTRY,
                                                       depth=LAND_OFF_ENTRIES, init=[])
        lo_wr = lo_mem.write_port()
        m.d.comb += [lo_wr.en.eq(self.land_off_we), lo_wr.addr.eq(self.land_off_seq),
                     lo_wr.data.eq(self.land_off_data)]
        lo_rd = lo_mem.read_port()
        prod = Signal(META["kv_id"].width + LANDING_CONFIG["kv_slot"].shape.width)
        slot = align_down(self.cfg.kv_slot, KV_ALIGN)
        m.d.comb += [lo_rd.en.eq(self.take), lo_rd.addr.eq(self.seq)]
        with m.If(self.take):
            m.d.sync += prod.eq(self.kv_id * slot)
        entry = lo_rd.data
        off = align_down(entry.offset, KV_ALIGN)
        m.d.comb += [
            self.entry.eq(entry),
            self.addr.eq(align_down(self.cfg.kv_base, KV_ALIGN) + prod + off),
            self.fits.eq(entry.valid & (off + self.length <= slot)),
        ]
        return m
