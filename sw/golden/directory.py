"""Golden model of the ``kv_id`` directory (``mcf.hdl.node.directory.Directory``), bit for bit:
its entries (:class:`mcf.abi.directory.DirEntry`) and the
:data:`mcf.abi.directory.DIRECTORY_STATUS` counters. The semantics (land events, FREE, DRAIN,
saturation) are stated in :mod:`mcf.abi.directory`.
"""

from __future__ import annotations

from mcf.abi.directory import DIRECTORY_STATUS, LANDED_MAX, DirEntry, DirOp, DirState

__all__ = ["DirectoryModel"]


class DirectoryModel:
    """Golden model of the directory: ``entries`` (``kv_id`` → :class:`DirEntry`, absent keys
    are zero) and the :data:`DIRECTORY_STATUS` counters (``status``). ``kv_count`` is the
    directory depth."""

    def __init__(self, kv_count: int):
        self.kv_count = kv_count
        self.entries: dict[int, DirEntry] = {}
        self.status = {name: 0 for name, _ in DIRECTORY_STATUS}

    def entry(self, kv_id: int) -> DirEntry:
        return self.entries.get(kv_id, DirEntry())

    def _in_range(self, kv_id: int) -> bool:
        if 0 <= kv_id < self.kv_count:
            return True
        self.status["out_of_range"] += 1
        return False

    def land(self, kv_id: int, owner: bool) -> None:
        if not self._in_range(kv_id):
            return
        e = self.entry(kv_id)
        landed = e.landed + 1
        if e.landed == LANDED_MAX:
            self.status["saturated"] += 1
            landed = LANDED_MAX
        if owner:
            state = DirState.OWNER
        elif e.state is DirState.ABSENT:
            state = DirState.VALID
        else:
            state = e.state
        self.entries[kv_id] = DirEntry(state, landed)
        self.status["landed"] += 1

    def free(self, kv_id: int, count: int) -> None:
        if not self._in_range(kv_id):
            return
        e = self.entry(kv_id)
        if e.state is DirState.OWNER:
            self.status["free_refused_owner"] += 1
        elif count > e.landed:
            self.status["free_refused_count"] += 1
        else:
            left = e.landed - count
            self.entries[kv_id] = DirEntry(e.state if left else DirState.ABSENT, left)
            self.status["frees"] += 1

    def drain(self, kv_id: int) -> None:
        if not self._in_range(kv_id):
            return
        e = self.entry(kv_id)
        if e.state is DirState.OWNER:
            self.status["drain_refused_owner"] += 1
        else:
            self.entries[kv_id] = DirEntry(DirState.DRAINING, e.landed)
            self.status["drains"] += 1

    def op(self, op: DirOp, kv_id: int, count: int = 0) -> None:
        """One :data:`DIR_OP`."""
        if op is DirOp.FREE:
            self.free(kv_id, count)
        else:
            self.drain(kv_id)

    def clear(self) -> None:
        """The clear walk: every entry back to zero."""
        self.entries.clear()
        self.status["clear_walks"] += 1
