"""Replica directory and the progressive-convergence lifecycle (paper §4 end, §5).

Each KV slice ``(block, owner)`` has one OWNER copy (never removed) and temporary replicas that go

    VALID ──(replica factor shrinks / memory pressure)──▶ DRAINING ──(dependants done)──▶ freed

A VALID copy serves local attention and remote fetches. A DRAINING copy is excluded from new
scheduling but still serves the chunks that were scheduled against it before it started
draining; it is freed (INVALID: removed, its bytes returned) once those chunks finish. Every
transition checks its invariant and raises :class:`InvariantError` (never ``assert``, which
``python -O`` would strip).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["CopyState", "Copy", "Directory", "InvariantError"]


class InvariantError(RuntimeError):
    """A MARS runtime invariant does not hold (a bug, never bad user input)."""


class CopyState(enum.Enum):
    OWNER = "owner"
    VALID = "valid"
    DRAINING = "draining"


@dataclass
class Copy:
    state: CopyState
    readers: set = field(default_factory=set)    # chunks scheduled to read this copy


class Directory:
    """Which node holds which slice, in which state, and how many bytes each node uses."""

    def __init__(self, nodes: int, budget: int | None):
        self.nodes = nodes
        self.budget = budget                    # None: unbounded (full-replication baseline)
        self.copies: dict[tuple[int, int], dict[int, Copy]] = {}
        self.size: dict[tuple[int, int], int] = {}
        self.used = [0] * nodes
        self.peak = [0] * nodes

    # --- queries -----------------------------------------------------------------------------
    def slices(self) -> list:
        """Every slice key ``(block, owner)`` created so far."""
        return list(self.copies)

    def owner(self, key) -> int:
        owners = [n for n, cp in self.copies[key].items() if cp.state is CopyState.OWNER]
        if len(owners) != 1:
            raise InvariantError(f"slice {key} has {len(owners)} owner copies")
        return owners[0]

    def holders(self, key, *states: CopyState) -> list[int]:
        states = states or (CopyState.OWNER, CopyState.VALID)
        return sorted(n for n, cp in self.copies[key].items() if cp.state in states)

    def schedulable(self, key) -> list[int]:
        """Copies new work may use: the owner and VALID replicas (never DRAINING ones)."""
        return self.holders(key, CopyState.OWNER, CopyState.VALID)

    def state(self, key, node) -> CopyState | None:
        cp = self.copies.get(key, {}).get(node)
        return cp.state if cp else None

    def replica_count(self) -> int:
        return sum(1 for cps in self.copies.values() for cp in cps.values()
                   if cp.state is not CopyState.OWNER)

    def owned_bytes(self) -> list[int]:
        out = [0] * self.nodes
        for key in self.copies:
            out[self.owner(key)] += self.size[key]
        return out

    # --- transitions -------------------------------------------------------------------------
    def _alloc(self, node: int, nbytes: int, what: str) -> None:
        if self.budget is not None and self.used[node] + nbytes > self.budget:
            raise InvariantError(f"node {node} would hold {self.used[node] + nbytes} B of KV, "
                                 f"over its budget of {self.budget} B ({what})")
        self.used[node] += nbytes
        self.peak[node] = max(self.peak[node], self.used[node])

    def add_owner(self, key, node: int, nbytes: int) -> None:
        if key in self.copies:
            raise InvariantError(f"slice {key} created twice")
        self.copies[key] = {}
        self.size[key] = nbytes
        self._alloc(node, nbytes, f"owner copy of {key}")
        self.copies[key][node] = Copy(CopyState.OWNER)

    def add_replica(self, key, node: int) -> None:
        if node in self.copies[key]:
            raise InvariantError(f"node {node} already holds slice {key}")
        self._alloc(node, self.size[key], f"replica of {key}")
        self.copies[key][node] = Copy(CopyState.VALID)

    def mark_draining(self, key, node: int) -> None:
        cp = self.copies[key].get(node)
        if cp is None or cp.state is not CopyState.VALID:
            raise InvariantError(f"only a VALID replica can start draining: {key} on {node} is "
                                 f"{cp.state.value if cp else 'absent'}")
        cp.state = CopyState.DRAINING

    def register_read(self, key, node: int, chunk: int) -> None:
        """Chunk ``chunk`` is scheduled to read the copy of ``key`` on ``node``."""
        cp = self.copies[key].get(node)
        if cp is None or cp.state is CopyState.DRAINING:
            raise InvariantError(f"chunk {chunk} scheduled against "
                                 f"{'a draining' if cp else 'no'} copy of {key} on node {node}")
        cp.readers.add(chunk)

    def serve_reads(self, chunk: int) -> int:
        """Chunk ``chunk`` finished: its reads happen now. Returns the reads served by DRAINING
        copies. Every read must hit an OWNER, VALID or DRAINING copy registered for it."""
        from_draining = 0
        for key, cps in self.copies.items():
            for node, cp in cps.items():
                if chunk in cp.readers:
                    if cp.state not in (CopyState.OWNER, CopyState.VALID, CopyState.DRAINING):
                        raise InvariantError(f"read of {key} on {node} hit an invalid copy")
                    from_draining += cp.state is CopyState.DRAINING
                    cp.readers.discard(chunk)
        return from_draining

    def free_drained(self) -> list[tuple[tuple[int, int], int]]:
        """Invalidate every DRAINING copy whose dependants have finished; returns them."""
        freed = []
        for key, cps in self.copies.items():
            for node in [n for n, cp in cps.items()
                         if cp.state is CopyState.DRAINING and not cp.readers]:
                del cps[node]
                self.used[node] -= self.size[key]
                freed.append((key, node))
        return freed

    def move_owner(self, key, dst: int) -> None:
        """Hand the owner copy to ``dst`` (PD disaggregation's KV hand-off)."""
        src = self.owner(key)
        if len(self.copies[key]) != 1:
            raise InvariantError(f"hand-off of {key} with replicas still present")
        self._alloc(dst, self.size[key], f"hand-off of {key}")
        self.copies[key] = {dst: Copy(CopyState.OWNER)}
        self.used[src] -= self.size[key]

    # --- invariants --------------------------------------------------------------------------
    def check(self) -> None:
        used = [0] * self.nodes
        for key, cps in self.copies.items():
            self.owner(key)                         # exactly one owner copy
            for node in cps:
                used[node] += self.size[key]
        if used != self.used:
            raise InvariantError(f"byte accounting drifted: {used} != {self.used}")
        if self.budget is not None and max(used, default=0) > self.budget:
            raise InvariantError(f"KV budget exceeded: {max(used)} > {self.budget}")

    def check_owner_only(self) -> None:
        for key, cps in self.copies.items():
            if len(cps) != 1 or next(iter(cps.values())).state is not CopyState.OWNER:
                raise InvariantError(f"slice {key} is not owner-only at the end of prefill")
