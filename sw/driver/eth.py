"""The PYNQ driver of the MAC wrapper ``mcf_eth`` (issue #13 item 5; docs/eth.md "Link status
registers (``mcf_eth``)"): :class:`EthDriver` binds to the module reference
``xilinx.com:module_ref:mcf_eth:1.0`` (``ol.eth``), writes ``ETH_LOCAL`` and ``ETH{l}_CFG``
from the same topology rule as the node's ``LINK_MAP`` (:func:`mcf.abi.eth.link_peers` on
:func:`mcf.abi.link_map.link_map_for`) and reads every link's status.

The pure parts — :func:`eth_writes`, :func:`link_status_from`, :func:`check_eth_identity` —
work on register values by name, so they run on plain Python (and on values read from the RTL in
``tests/test_ethlinks.py``); the class is a thin layer over ``read``/``write``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..abi.eth import (
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
           "check_eth_identity"]

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
