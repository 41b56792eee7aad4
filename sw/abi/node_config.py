"""The two configurations of the node top from one parameter set (docs/node.md §12, issue #11 §1.6).

``kr260`` is the bitstream's configuration (compute sized to the K26); ``sim`` is a small geometry
the cluster simulates quickly. Both have the same ports and the same register map, so one driver,
one block design and one cocotb bench fit both; what differs is visible to software through the
``CAPS`` register (:func:`caps_register`), which the driver reads at bind time.
"""

from __future__ import annotations

from dataclasses import dataclass

from .compute import GemmLimits
from .csrmap import NODE_LINKS
from .framing import MAX_PAYLOAD
from .kv import KVFormat
from .meta import META
from .node import CMD_RING_MAX_LOG2
from .platform import HP_PORTS
from .quant import GROUP_SIZE
from .regs import Access, Field, Register

__all__ = ["NodeConfig", "KR260", "SIM", "NODE_CONFIGS", "caps_register", "PACKET_WIDTH",
           "AXI_WIDTH", "TOP_ADDR_BITS", "TOP_ID_BITS"]

PACKET_WIDTH = 64
"""Every packet stream of the node (docs/node.md §1)."""
AXI_WIDTH = 128
"""Every AXI4 master of the node: the HP port width."""
TOP_ADDR_BITS = 49
"""Address width of the node top's ``m_axi_hp*`` ports (the PS's HP slave ports take 49 bits;
inside, the DMA keeps :data:`mcf.abi.compute.DMA_ADDR_BITS` and the top bits are zero)."""
TOP_ID_BITS = 6
"""AXI ID width of the node top's ``m_axi_hp*`` ports (the HP slave ports' ID width)."""


@dataclass(frozen=True)
class NodeConfig:
    """One node's generate-time parameters (docs/node.md §12)."""
    name: str
    top: str                      # the module name ``mcf verilog`` writes
    links: int = NODE_LINKS
    hp_ports: int = HP_PORTS
    max_payload: int = MAX_PAYLOAD
    gemm_rows: int = 16
    gemm_lanes: int = 16
    gemm_arrays: int = 4
    gemm_chain: int = 16          # lanes per DSP cascade (GemmArray ``chain``; 1 = adder tree)
    gemm_dsp: str = "primitive"   # GemmArray ``dsp``: DSP48E2 instances (docs/node.md §11)
    group: int = GROUP_SIZE
    gemm_k_max: int = 8960
    gemm_m_max: int = 64
    vec_lanes: int = 4
    vec_n_max: int = 8960
    attn_head_dim: int = 128
    attn_lanes: int = 32
    attn_heads: int = 6
    attn_block: int = 256
    attn_max_list: int = 64        # AttendUnit ``max_list``: KV blocks per ATTEND list
    kv_format: KVFormat = KVFormat.PER_TOKEN
    reduce_slots: int = 12
    kv_count: int = 1 << META["kv_id"].width
    ring_fifo: int = 32

    def __post_init__(self):
        if not 1 <= self.links <= NODE_LINKS:
            raise ValueError(f"{self.name}: links must lie in 1..{NODE_LINKS}")
        if self.kv_count & (self.kv_count - 1) or not 2 <= self.kv_count <= (
                1 << META["kv_id"].width):
            raise ValueError(f"{self.name}: kv_count must be a power of two ≤ 2^kv_id bits")

    @property
    def macs_per_cycle(self) -> int:
        """INT4 × INT8 multiply-accumulates per cycle of the GEMM."""
        return self.gemm_rows * self.gemm_lanes * self.gemm_arrays

    @property
    def gemm_limits(self) -> GemmLimits:
        """The GEMM jobs this configuration's engine (and template walker) accepts."""
        return GemmLimits(self.gemm_m_max, self.gemm_k_max, self.gemm_lanes, self.group)

    def caps(self) -> int:
        """The ``CAPS`` register's value for this configuration."""
        return caps_value(self)


KR260 = NodeConfig(name="kr260", top="mcf_node")
SIM = NodeConfig(name="sim", top="mcf_node_sim", gemm_arrays=1, gemm_chain=1, gemm_dsp="fabric",
                 gemm_k_max=256, gemm_m_max=16,
                 vec_n_max=256, attn_head_dim=32, attn_lanes=4, attn_heads=2, attn_block=32,
                 reduce_slots=4, kv_count=256, ring_fifo=8)
"""The tiny model's geometry (:data:`mcf.golden.qwen_layer.TINY`: hidden 128, head_dim 32,
intermediate 256, 2 query heads per KV head) on one 16 × 16 GEMM array and a 4-lane attention
engine."""
NODE_CONFIGS: dict[str, NodeConfig] = {c.name: c for c in (KR260, SIM)}

_CAPS_FIELDS: tuple[tuple[str, int, str], ...] = (
    ("kv_count_log2", 5, "log2 of the directory depth: kv_id values the node can hold"),
    ("reduce_slots", 5, "reduction-engine slots (open reductions per node)"),
    ("gemm_arrays", 3, "token-parallel GEMM arrays"),
    ("attn_lanes_log2", 3, "log2 of the attention engine's lanes"),
    ("ring_max_log2", 5, "largest CMDq_SIZE the ring readers accept"),
    ("links", 2, "physical links"),
)


def caps_register() -> Register:
    """``CAPS``: the configuration's generate-time sizes, read-only (the driver checks them)."""
    return Register("CAPS", tuple(Field(n, w, Access.R, desc=d) for n, w, d in _CAPS_FIELDS),
                    "node configuration (generate-time constants)")


def caps_value(cfg: NodeConfig) -> int:
    vals = {"kv_count_log2": cfg.kv_count.bit_length() - 1, "reduce_slots": cfg.reduce_slots,
            "gemm_arrays": cfg.gemm_arrays, "attn_lanes_log2": cfg.attn_lanes.bit_length() - 1,
            "ring_max_log2": CMD_RING_MAX_LOG2, "links": cfg.links}
    word = 0
    for fld, off in caps_register().offsets():
        if not 0 <= vals[fld.name] < (1 << fld.width):
            raise ValueError(f"CAPS.{fld.name}={vals[fld.name]} does not fit in {fld.width} bits")
        word |= vals[fld.name] << off
    return word
