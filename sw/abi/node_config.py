"""The two configurations of the node top from one parameter set (docs/node.md §12, issue #11 §1.6).

``kr260`` is the bitstream's configuration (compute sized to the K26); ``sim`` is a small geometry
the cluster simulates quickly. Both have the same ports and the same register map, so one driver,
one block design and one cocotb bench fit both; what differs is visible to software through the
``CAPS`` register (:func:`caps_register`), which the driver reads at bind time.
"""

from __future__ import annotations

from dataclasses import dataclass

from .compute import GemmLimits
from .framing import MAX_PAYLOAD
from .kv_channel import KV_GROUP, KVFormat
from .meta import META
from .node import CMD_RING_MAX_LOG2
from .platform import HP_PORTS, NODE_LINKS
from .quant import GROUP_SIZE
from .regs import Access, Field, Register

__all__ = ["NodeConfig", "KR260", "KR260_ENGINE", "SIM", "NODE_CONFIGS", "caps_register",
           "PACKET_WIDTH", "AXI_WIDTH", "TOP_ADDR_BITS", "TOP_ID_BITS"]

PACKET_WIDTH = 64
"""Every packet stream of the node (docs/node.md §1)."""
AXI_WIDTH = 128
"""Every AXI4 master of the node: the HP port width."""
TOP_ADDR_BITS = 49
"""Address width of the node top's ``m_axi_hp*`` ports (the PS's HP slave ports take 49 bits;
inside, the DMA keeps :data:`mcf.abi.compute.DMA_ADDR_BITS` and the top bits are zero)."""
TOP_ID_BITS = 6
"""AXI ID width of the node top's ``m_axi_hp*`` ports (the HP slave ports' ID width)."""
_TILE_CHUNK_BITS = 4
"""Width of ``CAPS.tile_chunk_log2``."""


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
    gemm_tile_ram: str = "ultra"  # GemmEngine ``tile_ram``: the weight tile banks in URAM288
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
    # The tiled prefill (ATTEND PREFILL_TILE: TileUnit → TilePrefill, docs/attention.md).
    # ``tile_keys`` = 0: no tiled path (PREFILL_TILE records are bad records).
    tile_keys: int = 0             # TilePrefill ``keys``: keys per score beat
    tile_lanes: int = 16           # TilePrefill ``lanes``: channels per cycle of its S arrays
    tile_max_chunk: int = 0        # TileUnit ``max_chunk``: query tokens per record (a power of 2)
    tile_query_words: int = 1      # TilePrefill ``query_words``: a query row as that many words
    # S and P·V on the GEMM's arrays (clients of its ArrayShare) instead of arrays of their own
    tile_on_gemm: bool = False
    # every other ATTEND (DECODE, PREFILL, MAX, FIXED) on the GEMM's arrays too (ArrayEngine,
    # today's w: the same bits) instead of the vector AttentionEngine; needs tile_on_gemm
    attn_on_arrays: bool = False
    reduce_slots: int = 12
    kv_count: int = 1 << META["kv_id"].width
    ring_fifo: int = 32

    def __post_init__(self):
        if not 1 <= self.links <= NODE_LINKS:
            raise ValueError(f"{self.name}: links must lie in 1..{NODE_LINKS}")
        if self.kv_count & (self.kv_count - 1) or not 2 <= self.kv_count <= (
                1 << META["kv_id"].width):
            raise ValueError(f"{self.name}: kv_count must be a power of two ≤ 2^kv_id bits")
        if self.tile_keys:
            self._check_tile()
        elif self.tile_max_chunk or self.tile_on_gemm:
            raise ValueError(f"{self.name}: tile_max_chunk / tile_on_gemm without the tiled path "
                             "(tile_keys 0)")
        if self.attn_on_arrays and not self.tile_on_gemm:
            raise ValueError(f"{self.name}: attn_on_arrays shares the GEMM's arrays as the tiled "
                             "path does (tile_on_gemm)")

    def _check_tile(self):
        """The tiled path's sizes against its parts' rules: TilePrefill reads the KV reader's
        beats (``attn_lanes`` channels, PER_TOKEN records only), its key tile
        (``tile_keys · attn_head_dim / tile_lanes`` keys) divides ``KV_GROUP`` and
        ``attn_block``, and ``CAPS.tile_chunk_log2`` carries ``tile_max_chunk``."""
        n, d = self.name, self.attn_head_dim
        if self.kv_format != KVFormat.PER_TOKEN:
            raise ValueError(f"{n}: the tiled path reads PER_TOKEN K/V records only")
        if self.tile_lanes < 1 or d % self.tile_lanes:
            raise ValueError(f"{n}: tile_lanes must divide attn_head_dim")
        kt = self.tile_keys * (d // self.tile_lanes)
        if KV_GROUP % kt or self.attn_block % kt:
            raise ValueError(f"{n}: the key tile ({kt} keys) must divide {KV_GROUP} and "
                             "attn_block")
        if self.tile_on_gemm:
            self._check_tile_on_gemm(kt)
        c = self.tile_max_chunk
        if c < 2 or c & (c - 1) or c.bit_length() - 1 >= 1 << _TILE_CHUNK_BITS:
            raise ValueError(f"{n}: tile_max_chunk must be a power of two in "
                             f"2..2^{(1 << _TILE_CHUNK_BITS) - 1}")

    def _check_tile_on_gemm(self, kt: int):
        """S and P·V on the GEMM's arrays (:class:`~mcf.hdl.compute.array_attend.ArrayAttention`
        through the GEMM's share): one S dot product is one GEMM group (``attn_head_dim`` =
        ``group``) and a P·V group ``group`` keys (dividing ``attn_block``), the arrays' lanes
        are the S lanes (a multiple of ``tile_keys``), and a dot product's ``gemm_rows`` keys
        (even, a multiple of ``tile_keys``) divide the key tile."""
        n = self.name
        if self.attn_head_dim != self.group:
            raise ValueError(f"{n}: tile_on_gemm needs attn_head_dim = the GEMM's group")
        if self.attn_block % self.group:
            raise ValueError(f"{n}: tile_on_gemm needs attn_block a multiple of the group")
        if self.tile_lanes != self.gemm_lanes or self.tile_lanes % self.tile_keys:
            raise ValueError(f"{n}: tile_on_gemm needs tile_lanes = gemm_lanes, a multiple of "
                             "tile_keys")
        r = self.gemm_rows
        if r % 2 or kt % r or r % self.tile_keys:
            raise ValueError(f"{n}: tile_on_gemm needs gemm_rows even, dividing the key tile "
                             f"({kt} keys) and a multiple of tile_keys")

    @property
    def tiled(self) -> bool:
        """The node runs ATTEND PREFILL_TILE records (``CAPS.tile_chunk_log2`` ≠ 0)."""
        return self.tile_keys > 0

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


KR260 = NodeConfig(name="kr260", top="mcf_node", attn_lanes=16, tile_keys=4, tile_lanes=16,
                   tile_max_chunk=256, tile_query_words=4, tile_on_gemm=True,
                   attn_on_arrays=True)
"""Every ATTEND on the GEMM's four arrays (issue #33): PREFILL_TILE records on the tiled path
(S and P·V through the GEMM's share, 4 keys × 16 channels per score beat, chunks of up to 256
tokens, a query row as 4 words), the others on ArrayEngine, the KV reader at 16 lanes, no vector
attention engine (docs/node.md §11: what it costs and what was cut to fit)."""
KR260_ENGINE = NodeConfig(name="kr260_engine", top="mcf_node")
"""The kr260 node before issue #33: the vector ``AttentionEngine`` (32 lanes), no tiled path.
Not a bitstream's (not in :data:`NODE_CONFIGS`): kept so the resource script and the system
model can still measure and price what the arrays replaced."""
SIM = NodeConfig(name="sim", top="mcf_node_sim", gemm_arrays=1, gemm_chain=1, gemm_dsp="fabric",
                 gemm_tile_ram="block",
                 gemm_k_max=256, gemm_m_max=16,
                 vec_n_max=256, attn_head_dim=32, attn_lanes=4, attn_heads=2, attn_block=32,
                 tile_keys=4, tile_lanes=8, tile_max_chunk=32,
                 reduce_slots=4, kv_count=256, ring_fifo=8)
"""The tiny model's geometry (:data:`mcf.golden.qwen_layer.TINY`: hidden 128, head_dim 32,
intermediate 256, 2 query heads per KV head) on one 16 × 16 GEMM array and a 4-lane attention
engine; the tiled prefill at 4 keys × 8 channels per cycle (16-key tiles), chunks of up to 32
tokens (``attn_block``: a slice the host sends is at most one KV block)."""
NODE_CONFIGS: dict[str, NodeConfig] = {c.name: c for c in (KR260, SIM)}

_CAPS_FIELDS: tuple[tuple[str, int, str], ...] = (
    ("kv_count_log2", 5, "log2 of the directory depth: kv_id values the node can hold"),
    ("reduce_slots", 5, "reduction-engine slots (open reductions per node)"),
    ("gemm_arrays", 3, "token-parallel GEMM arrays"),
    ("attn_lanes_log2", 3, "log2 of the attention engine's lanes"),
    ("ring_max_log2", 5, "largest CMDq_SIZE the ring readers accept"),
    ("links", 2, "physical links"),
    ("tile_chunk_log2", _TILE_CHUNK_BITS,
     "log2 of ATTEND PREFILL_TILE's tokens per record; 0: no tiled path (a bad record)"),
)


def caps_register() -> Register:
    """``CAPS``: the configuration's generate-time sizes, read-only (the driver checks them)."""
    return Register("CAPS", tuple(Field(n, w, Access.R, desc=d) for n, w, d in _CAPS_FIELDS),
                    "node configuration (generate-time constants)")


def caps_value(cfg: NodeConfig) -> int:
    vals = {"kv_count_log2": cfg.kv_count.bit_length() - 1, "reduce_slots": cfg.reduce_slots,
            "gemm_arrays": cfg.gemm_arrays, "attn_lanes_log2": cfg.attn_lanes.bit_length() - 1,
            "ring_max_log2": CMD_RING_MAX_LOG2, "links": cfg.links,
            "tile_chunk_log2": cfg.tile_max_chunk.bit_length() - 1 if cfg.tiled else 0}
    word = 0
    for fld, off in caps_register().offsets():
        if not 0 <= vals[fld.name] < (1 << fld.width):
            raise ValueError(f"CAPS.{fld.name}={vals[fld.name]} does not fit in {fld.width} bits")
        word |= vals[fld.name] << off
    return word
