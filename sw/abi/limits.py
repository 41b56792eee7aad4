"""Capacity limits of the NIC engines that the host runtime (MARS) must plan within.

The engines take these as elaboration parameters (``mcf.hdl.nic``); the planner takes the same
constants, so a plan never asks more of the hardware than it was built with.
"""

from __future__ import annotations

__all__ = ["REDUCE_SLOTS"]

REDUCE_SLOTS = 4
"""Reductions (tags ``(route_id, kv_id, seq)``) one reduction engine holds open at once: its
``n_slots`` (``mcf.hdl.nic.reduce.ReduceEngine``; the NIC block's ``reduce_slots``). A
contribution that would open one more tag is dropped (``ReduceDrop.NO_SLOT``), so MARS issues
decode state reductions in waves of at most this many tags (see ``docs/mars.md``)."""
