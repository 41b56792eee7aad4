"""The DDR regions of one node (docs/node.md §5) for a MARS plan on a node configuration."""

from __future__ import annotations

from dataclasses import dataclass

from ..abi.decode_land import mbuf_bytes, obuf_row_bytes, query_slot_bytes
from ..abi.landing import KvLayout, LandingConfig, kv_address, per_token_land_off
from ..abi.node import CMD_BYTES, CMD_RING_MAX_LOG2
from ..abi.node_config import NodeConfig

__all__ = ["NodeLayout", "REGION_ALIGN"]

REGION_ALIGN = 4096
"""Every region starts on a 4 KiB boundary (a burst never crosses one)."""


def _align(x: int) -> int:
    return -(-x // REGION_ALIGN) * REGION_ALIGN


@dataclass(frozen=True)
class NodeLayout:
    """Byte addresses of one node's regions (one PYNQ ``allocate`` buffer at ``base``)."""
    base: int
    cmd_base: tuple[int, int]      # CMD0 (NET), CMD1 (COMPUTE)
    cmd_log2: int                  # entries per ring = 2^cmd_log2
    kv: LandingConfig
    kv_layout: KvLayout
    qbuf_base: int
    qbuf_slot: int
    q_heads: int
    obuf_base: int
    mbuf_base: int
    size: int                      # bytes from ``base`` to the end of the last region

    @classmethod
    def for_plan(cls, plan, config: NodeConfig, base: int = 0,
                 cmd_log2: int = 10) -> NodeLayout:
        """Regions for ``plan`` (a :class:`mcf.mars.plan.Plan`) on ``config``: the KV region
        holds every ``kv_id`` of the plan (``L·C·N`` slots, ``PER_TOKEN`` records); QBUF holds
        two layer parities of ``H_q`` slots, OBUF two parities of ``H_q`` rows, MBUF two parities
        of ``H_q`` maxima slots (the two-phase decode)."""
        if not 1 <= cmd_log2 <= CMD_RING_MAX_LOG2:
            raise ValueError(f"cmd_log2 must lie in 1..{CMD_RING_MAX_LOG2}")
        enc, model = plan.encoder, plan.model
        kv_count = model.layers * plan.num_chunks * plan.cluster.nodes
        if kv_count > config.kv_count:
            raise ValueError(f"the plan needs {kv_count} kv_ids; the {config.name} node's "
                             f"directory holds {config.kv_count}")
        slice_tokens = -(-plan.chunk // plan.cluster.nodes)
        kvl = per_token_land_off(enc, slice_tokens)
        at = base
        cmd = []
        for _ in range(2):
            cmd.append(at)
            at = _align(at + (CMD_BYTES << cmd_log2))
        kv = LandingConfig(kv_base=at, kv_slot=kvl.kv_slot, kv_count=kv_count)
        at = _align(at + kv_count * kvl.kv_slot)
        qslot = query_slot_bytes(model.q_heads, model.head_dim)
        qbuf = at
        at = _align(at + 2 * model.q_heads * qslot)
        obuf = at
        at = _align(at + 2 * model.q_heads * obuf_row_bytes(model.head_dim))
        mbuf = at
        at = _align(at + mbuf_bytes(model.q_heads))
        return cls(base=base, cmd_base=(cmd[0], cmd[1]), cmd_log2=cmd_log2, kv=kv,
                   kv_layout=kvl, qbuf_base=qbuf, qbuf_slot=qslot, q_heads=model.q_heads,
                   obuf_base=obuf, mbuf_base=mbuf, size=at - base)

    def kv_address(self, kv_id: int, seq: int) -> int:
        """Where fragment ``seq`` of ``kv_id`` lives (the landing and send rule)."""
        return kv_address(self.kv, kv_id, seq, self.kv_layout.land_off)
