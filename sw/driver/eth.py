"""The PYNQ driver of the MAC wrapper ``mcf_eth`` (issue #13 item 5; docs/eth.md "Link status
registers (``mcf_eth``)"): :class:`EthDriver` binds to the module reference
``xilinx.com:module_ref:mcf_eth:1.0`` (``ol.eth``), writes ``ETH_LOCAL`` and ``ETH{l}_CFG``
from the same topology rule as the node's ``LINK_MAP`` (:func:`mcf.abi.eth.link_peers` on
:func:`mcf.abi.link_map.link_map_for`) and reads every link's status.

The pure parts — :func:`eth_writes`, :func:`link_status_from`, :func:`check_eth_identity` —
work on register values by name, so they run on plain Python (and on values read from the RTL in
``tests/test_ethlinks.py``); the class is a thin layer over ``read``/``write``.

PHY set-up (issue #36): :func:`phy_setup_ops` is the register conversation that sets one
DP83867 to :data:`mcf.abi.mdio.RGMII_DELAY_MODE` through its link's MDIO station — a generator
of ``("read", name)`` / ``("write", name, fields)`` operations (it is sent each read's word) —
so the same code runs over PYNQ's MMIO (:meth:`EthDriver.phy_setup`, via :func:`run_ops`) and
against the RTL in amaranth.sim (``tests/test_mdio.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass

from ..abi import mdio as md
from ..abi.eth import (
    ETH_LINK_RGMII,
    ETH_LINK_SFP,
    ETH_LINKS,
    ETH_STATUS,
    PCS_STATUS,
    RGMII_STATUS,
    RXCLK_WINDOW,
    SFP_STATUS,
    eth_regmap,
    link_peers,
    rxclk_min,
)
from ..abi.regs import RegisterMap
from .ip import HAVE_PYNQ, module_ref_vlnv
from .node_map import BindError, status_registers

try:
    from pynq import DefaultIP as _Base
except ImportError:
    class _Base:          # noqa: D101 - placeholder base; EthDriver() raises below
        def __init__(self, description):
            raise ImportError("mcf.driver.EthDriver needs PYNQ (pip install 'mcf[board]')")

__all__ = ["EthDriver", "LinkStatus", "ETH_TOP", "eth_writes", "link_status_from",
           "check_eth_identity", "PhySetup", "PhySetupError", "phy_setup_ops", "mdio_ops",
           "run_ops", "MDIO_POLLS"]

ETH_TOP = "mcf_eth"
_RX_DROPS = [n for n, _ in ETH_STATUS if n.startswith("rx_") and n not in ("rx_frames",
                                                                            "rx_bytes")]


@dataclass(frozen=True)
class LinkStatus:
    """One physical link as its registers report it (counters wrap at 2**32).

    ``link_up``: ``ETH_LINK.link<l>_up``. ``drops``: every receive drop counter added.
    SFP+ only (``None`` on RGMII): ``block_lock``, ``hi_ber``, ``ber_count``,
    ``errored_blocks``, ``lock_losses``, ``sfp`` (:data:`SFP_STATUS` by name). RGMII only:
    ``rx_clk_count`` and, given aclk's frequency, ``rx_clk_hz``."""
    link: int
    kind: str
    link_up: bool
    peer_id: int
    tx_frames: int
    tx_bytes: int
    tx_underruns: int
    rx_frames: int
    rx_bytes: int
    fcs_errors: int
    foreign_drops: int
    drops: int
    block_lock: int | None = None
    hi_ber: int | None = None
    ber_count: int | None = None
    errored_blocks: int | None = None
    lock_losses: int | None = None
    sfp: dict | None = None
    rx_clk_count: int | None = None
    rx_clk_hz: float | None = None


def eth_writes(node: int, n_nodes: int, topology: str = "ring", *,
               aclk_hz: float | None = None,
               regmap: RegisterMap | None = None) -> list[tuple[str, dict[str, int]]]:
    """The register writes (name, fields) that configure ``mcf_eth`` of board ``node``:
    ``ETH_LOCAL.local_id`` = ``node`` (as ``NODE.local_id``), ``ETH{l}_CFG.peer_id`` for every
    link the topology uses (:func:`mcf.abi.eth.link_peers`), and with ``aclk_hz`` the RGMII
    link-up threshold ``ETH_RXCLK_MIN`` (:func:`mcf.abi.eth.rxclk_min`)."""
    rm = regmap or eth_regmap()
    out = [("ETH_LOCAL", {"local_id": node})]
    for lk, peer in enumerate(link_peers(node, n_nodes, topology)):
        if peer is not None:
            out.append((f"ETH{lk}_CFG", {"peer_id": peer}))
    if aclk_hz is not None:
        out.append(("ETH_RXCLK_MIN", {"edges": rxclk_min(aclk_hz)}))
    for name, fields in out:
        rm.register(name).pack(**fields)            # a value the field cannot hold raises
    return out


def link_status_from(values: dict[str, int], *, aclk_hz: float | None = None,
                     regmap: RegisterMap | None = None) -> list[LinkStatus]:
    """Every link's :class:`LinkStatus` from register values read by name (every status
    register of :func:`mcf.abi.eth.eth_regmap`, plus ``ETH{l}_CFG``)."""
    rm = regmap or eth_regmap()
    up = rm.register("ETH_LINK").unpack(values["ETH_LINK"])
    out = []
    for lk in range(ETH_LINKS):
        def v(name, lk=lk):
            return int(values[f"eth{lk}_{name}"])
        common = dict(
            link=lk, kind="sfp+" if lk == ETH_LINK_SFP else "rgmii",
            link_up=bool(up[f"link{lk}_up"]),
            peer_id=rm.register(f"ETH{lk}_CFG").unpack(values[f"ETH{lk}_CFG"])["peer_id"],
            tx_frames=v("tx_frames"), tx_bytes=v("tx_bytes"), tx_underruns=v("tx_underruns"),
            rx_frames=v("rx_frames"), rx_bytes=v("rx_bytes"), fcs_errors=v("rx_fcs_errors"),
            foreign_drops=v("rx_foreign_dst"), drops=sum(v(n) for n in _RX_DROPS))
        if lk == ETH_LINK_SFP:
            extra = {n: v(n) for n, _ in PCS_STATUS}
            extra["sfp"] = {n: v(n) for n, _ in SFP_STATUS}
        else:
            count = v(next(n for n, _ in RGMII_STATUS))
            extra = {"rx_clk_count": count,
                     "rx_clk_hz": None if aclk_hz is None else count * aclk_hz / RXCLK_WINDOW}
        out.append(LinkStatus(**common, **extra))
    return out


def check_eth_identity(id_word: int, regmap: RegisterMap | None = None) -> None:
    """Raise :class:`BindError` unless ``ID`` is :func:`mcf.abi.eth.eth_regmap`'s word."""
    rm = regmap or eth_regmap()
    if id_word != rm.id_word:
        got, want = rm.register("ID").unpack(id_word), rm.register("ID").unpack(rm.id_word)
        raise BindError(f"mcf_eth ID register reads {id_word:#010x} (ident {got['ident']:#06x},"
                        f" version {got['version']:#06x}); this driver speaks ident "
                        f"{want['ident']:#06x} version {want['version']:#06x}")


# ---- PHY set-up over MDIO (issue #36) -------------------------------------------------------

MDIO_POLLS = 10_000
"""Status reads :func:`mdio_ops` waits for one frame (a frame is 25.6 µs at MDC 2.5 MHz; a
PYNQ register read takes about 1 µs) before it gives up."""

Ops = Generator[tuple, int | None, object]


class PhySetupError(RuntimeError):
    """A PHY did not answer, is not a DP83867, or did not keep what was written."""


@dataclass(frozen=True)
class PhySetup:
    """One PHY after :func:`phy_setup_ops`, every value read back over MDIO: ``phy_id``
    (``PHYIDR1 << 16 | PHYIDR2``), ``cfg4``, ``rgmiictl``, ``rgmiidctl``, ``phycr`` and the
    delays ``RGMIIDCTL`` gives (ns)."""
    link: int
    phy: int
    phy_id: int
    cfg4: int
    rgmiictl: int
    rgmiidctl: int
    phycr: int
    tx_delay_ns: float
    rx_delay_ns: float


def mdio_ops(link: int, *, read: bool, phy: int, reg: int, data: int = 0,
             regmap: RegisterMap | None = None) -> Ops:
    """One clause 22 frame on RGMII link ``link``'s station: write ``ETH{l}_MDIO_CMD``, poll
    ``ETH{l}_MDIO`` until it is done; returns the read data (``None`` for a write). Raises
    :class:`PhySetupError` when no PHY answers a read or the station stays busy."""
    rm = regmap or eth_regmap()
    yield ("write", f"ETH{link}_MDIO_CMD",
           {"read": int(read), "phy": phy, "reg": reg, "data": data})
    for _ in range(MDIO_POLLS):
        st = rm.register(f"ETH{link}_MDIO").unpack((yield ("read", f"ETH{link}_MDIO")))
        if st["done"] and not st["busy"]:
            break
    else:
        raise PhySetupError(f"link {link}: the MDIO station stayed busy for {MDIO_POLLS} reads")
    if not read:
        return None
    if st["no_answer"]:
        raise PhySetupError(f"link {link}: no PHY answers at MDIO address {phy} "
                            f"(read {reg:#04x} gave {st['rdata']:#06x})")
    return st["rdata"]


def _ext_ops(link: int, phy: int, addr: int, rm: RegisterMap, write: int | None = None) -> Ops:
    """A DP83867 extended register through ``REGCR``/``ADDAR``: read it, or write ``write``."""
    for reg, data in ((md.REGCR, md.REGCR_ADDRESS | md.REGCR_DEVAD), (md.ADDAR, addr),
                      (md.REGCR, md.REGCR_DATA | md.REGCR_DEVAD)):
        yield from mdio_ops(link, read=False, phy=phy, reg=reg, data=data, regmap=rm)
    return (yield from mdio_ops(link, read=write is None, phy=phy, reg=md.ADDAR,
                                data=write or 0, regmap=rm))


def phy_setup_ops(link: int, phy: int, *, tx_delay_ns: float = md.RGMII_TX_DELAY_NS,
                  rx_delay_ns: float = md.RGMII_RX_DELAY_NS,
                  regmap: RegisterMap | None = None) -> Ops:
    """Set the DP83867 at MDIO address ``phy`` on RGMII link ``link`` to ``rgmii-id``: check
    its ID (``0x2000``/``0xA231``, the revision nibble ignored), clear ``CFG4`` bit 7 (the
    RX_CTRL strap quirk), set both delay enables in ``RGMIICTL``, write ``RGMIIDCTL`` with the
    delays, set ``PHYCR``'s TX FIFO depth to 4 nibbles; then read all four back. Returns a
    :class:`PhySetup`; raises :class:`PhySetupError` (one line) on a foreign ID, no answer,
    or a value that did not stick."""
    if md.RGMII_DELAY_MODE != "rgmii-id":
        raise PhySetupError(f"no PHY set-up written for RGMII mode {md.RGMII_DELAY_MODE!r}")
    rm = regmap or eth_regmap()
    dctl = md.rgmiidctl(tx_delay_ns, rx_delay_ns)

    def read(reg):
        return mdio_ops(link, read=True, phy=phy, reg=reg, regmap=rm)

    def write(reg, data):
        return mdio_ops(link, read=False, phy=phy, reg=reg, data=data, regmap=rm)

    id1 = yield from read(md.PHYIDR1)
    id2 = yield from read(md.PHYIDR2)
    want1, want2 = md.DP83867_ID
    if id1 != want1 or id2 & md.PHY_ID_MODEL_MASK != want2 & md.PHY_ID_MODEL_MASK:
        raise PhySetupError(f"link {link}: the PHY at MDIO address {phy} has ID "
                            f"{id1:#06x}:{id2:#06x}, not a DP83867 ({want1:#06x}:{want2:#06x})")
    cfg4 = (yield from _ext_ops(link, phy, md.CFG4, rm)) & ~md.CFG4_RXCTRL_STRAP
    yield from _ext_ops(link, phy, md.CFG4, rm, cfg4)
    ctl = (yield from _ext_ops(link, phy, md.RGMIICTL, rm))
    ctl |= md.RGMIICTL_TX_DELAY_EN | md.RGMIICTL_RX_DELAY_EN
    yield from _ext_ops(link, phy, md.RGMIICTL, rm, ctl)
    yield from _ext_ops(link, phy, md.RGMIIDCTL, rm, dctl)
    phycr = (yield from read(md.PHYCR)) & ~md.PHYCR_FIFO_MASK
    phycr |= md.PHYCR_FIFO_4_NIBBLES << md.PHYCR_FIFO_SHIFT
    yield from write(md.PHYCR, phycr)
    got = {"CFG4": (yield from _ext_ops(link, phy, md.CFG4, rm)),
           "RGMIICTL": (yield from _ext_ops(link, phy, md.RGMIICTL, rm)),
           "RGMIIDCTL": (yield from _ext_ops(link, phy, md.RGMIIDCTL, rm)),
           "PHYCR": (yield from read(md.PHYCR))}
    want = {"CFG4": cfg4, "RGMIICTL": ctl, "RGMIIDCTL": dctl, "PHYCR": phycr}
    for name, value in want.items():
        if got[name] != value:
            raise PhySetupError(f"link {link}: PHY {phy} {name} reads {got[name]:#06x} after "
                                f"writing {value:#06x}")
    return PhySetup(link=link, phy=phy, phy_id=id1 << 16 | id2, cfg4=got["CFG4"],
                    rgmiictl=got["RGMIICTL"], rgmiidctl=got["RGMIIDCTL"], phycr=got["PHYCR"],
                    tx_delay_ns=md.delay_ns(dctl >> 4), rx_delay_ns=md.delay_ns(dctl & 0xF))


def run_ops(ops: Ops, read: Callable[[str], int], write: Callable[..., None]):
    """Run a generator of :func:`phy_setup_ops`'s kind with ``read(name) -> word`` and
    ``write(name, **fields)``; returns its result."""
    try:
        op = next(ops)
        while True:
            if op[0] == "read":
                op = ops.send(read(op[1]))
            else:
                write(op[1], **op[2])
                op = ops.send(None)
    except StopIteration as stop:
        return stop.value


class EthDriver(_Base):
    """``mcf_eth`` behind its AXI-Lite window ``s_axi_eth`` (``ol.eth``). Raises
    :class:`BindError` when ``ID`` is not the ABI's. ``aclk_hz``: the frequency of
    ``pl_clk0`` (PYNQ's ``Clocks.fclk0_mhz`` × 1e6 on the board) for the RGMII clock rule;
    ``None`` leaves ``ETH_RXCLK_MIN`` at its reset (:data:`mcf.abi.eth.RXCLK_MIN_RESET`,
    computed for :data:`mcf.abi.platform.ACLK_HZ`)."""

    bindto = [module_ref_vlnv(ETH_TOP)] if HAVE_PYNQ else []

    def __init__(self, description):
        self.regmap = eth_regmap()
        description = dict(description)
        description["registers"] = self.regmap.pynq_registers()
        super().__init__(description)
        self.aclk_hz: float | None = None
        check_eth_identity(self.read_reg("ID"), self.regmap)

    def read_reg(self, name: str) -> int:
        return int(self.read(self.regmap.addr(name)))

    def write_fields(self, name: str, **fields: int) -> None:
        self.write(self.regmap.addr(name), self.regmap.register(name).pack(**fields))

    def configure(self, node: int, n_nodes: int, *, topology: str = "ring",
                  aclk_hz: float | None = None) -> None:
        """Write :func:`eth_writes` (before any traffic: the MACs take ``local_id``/``peer_id``
        through synchronisers and expect them quasi-static)."""
        if aclk_hz is not None:
            self.aclk_hz = aclk_hz
        for name, fields in eth_writes(node, n_nodes, topology, aclk_hz=self.aclk_hz,
                                       regmap=self.regmap):
            self.write_fields(name, **fields)

    def link_status(self) -> list[LinkStatus]:
        """Every link's :class:`LinkStatus`, read now (one register read per value)."""
        names = [r.name for r in status_registers(self.regmap)]
        names += [f"ETH{lk}_CFG" for lk in range(ETH_LINKS)]
        return link_status_from({n: self.read_reg(n) for n in names}, aclk_hz=self.aclk_hz,
                                regmap=self.regmap)

    def phy_setup(self, *, tx_delay_ns: float = md.RGMII_TX_DELAY_NS,
                  rx_delay_ns: float = md.RGMII_RX_DELAY_NS) -> tuple[PhySetup, ...]:
        """Set both PL RGMII PHYs (link ``ETH_LINK_RGMII[i]`` at MDIO address
        ``mcf.abi.mdio.PHY_ADDRS[i]``) with :func:`phy_setup_ops`, before the RGMII links carry
        traffic (after ``configure``). Raises :class:`PhySetupError` on the first PHY that
        fails."""
        return tuple(run_ops(phy_setup_ops(lk, addr, tx_delay_ns=tx_delay_ns,
                                           rx_delay_ns=rx_delay_ns, regmap=self.regmap),
                             self.read_reg, self.write_fields)
                     for lk, addr in zip(ETH_LINK_RGMII, md.PHY_ADDRS))
