"""The PYNQ drivers of the node top (issue #12 item 1; docs/board.md "The driver") and of
the MAC wrapper ``mcf_eth`` (:class:`EthDriver`, docs/eth.md).

:class:`NodeDriver` needs PYNQ; everything else here (errors, the generated snapshot type, the
identity check, the ring producer) is plain Python on the ABI.
"""

from .eth import (
    ETH_TOP,
    EthDriver,
    LinkStatus,
    check_eth_identity,
    eth_writes,
    link_status_from,
)
from .ip import HAVE_PYNQ, Clock, NodeDriver, WallClock, module_ref_vlnv, node_vlnvs
from .node_map import (
    BindError,
    CommandRing,
    DriverError,
    LayoutError,
    NodeLimits,
    RingFull,
    RingLayout,
    StepTimeout,
    check_identity,
    check_layout,
    config_for_top,
    node_limits,
    snapshot_type,
    status_registers,
    unpack_halt,
)

__all__ = ["NodeDriver", "HAVE_PYNQ", "Clock", "WallClock", "node_vlnvs", "module_ref_vlnv",
           "BindError", "CommandRing", "DriverError", "LayoutError", "NodeLimits", "RingFull",
           "RingLayout", "StepTimeout", "check_identity", "check_layout", "config_for_top",
           "node_limits", "snapshot_type", "status_registers", "unpack_halt",
           "EthDriver", "LinkStatus", "ETH_TOP", "check_eth_identity", "eth_writes",
           "link_status_from"]
