"""The PYNQ driver of the node top (issue #12 item 1; docs/board.md "The driver").

:class:`NodeDriver` needs PYNQ; everything else here (errors, the generated snapshot type, the
identity check, the ring producer) is plain Python on the ABI.
"""

from .ip import HAVE_PYNQ, Clock, NodeDriver, WallClock, module_ref_vlnv, node_vlnvs
from .node_map import (
    BindError,
    CommandRing,
    DriverError,
    RingFull,
    StepTimeout,
    check_identity,
    config_for_top,
    snapshot_type,
    status_registers,
    unpack_halt,
)

__all__ = ["NodeDriver", "HAVE_PYNQ", "Clock", "WallClock", "node_vlnvs", "module_ref_vlnv",
           "BindError", "CommandRing", "DriverError", "RingFull", "StepTimeout", "check_identity",
           "config_for_top", "snapshot_type", "status_registers", "unpack_halt"]
