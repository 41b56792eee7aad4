"""The MCF ABI: the one hardware/software contract (metadata, framing, registers, formats).

Everything the HDL, the runtime, the golden models and the docs agree on is defined in this
package and nowhere else.
"""

from .compute import DMA_DESC, GEMM_JOB, DmaDesc, GemmJob
from .fixed import INT4, INT8, INT32, FixedFormat, pack_int4, round_shift, saturate, unpack_int4
from .framing import (
    MAX_PAYLOAD,
    beat_layout,
    encode_packet,
    header_bytes,
    keep_mask,
    parsed_layout,
    payload_beats,
)
from .limits import REDUCE_SLOTS
from .meta import (
    DISPATCH_RULES,
    META,
    Collective,
    DispatchRule,
    InvalidateKind,
    Meta,
    MetaWidths,
    Op,
    Port,
    ReduceOp,
    Stage,
    dispatch_port,
    meta_layout,
    raw_fields,
)
from .platform import HP_PORTS, K26
from .query import (
    QUERY_HEADER,
    QUERY_HEADER_BYTES,
    QUERY_SCALE,
    QueryRecord,
    pack_query,
    query_bytes,
    query_fragments,
    query_head_bytes,
    unpack_query,
)
from .regs import MCF_ID, Access, Field, Register, RegisterMap

__all__ = [
    "INT4", "INT8", "INT32", "FixedFormat", "pack_int4", "unpack_int4", "round_shift", "saturate",
    "MAX_PAYLOAD", "beat_layout", "parsed_layout", "payload_beats", "keep_mask", "encode_packet",
    "header_bytes",
    "META", "Meta", "MetaWidths", "InvalidateKind", "meta_layout", "raw_fields", "Stage", "Op",
    "Collective", "ReduceOp", "Port", "DISPATCH_RULES", "DispatchRule", "dispatch_port",
    "Access", "Field", "Register", "RegisterMap", "MCF_ID",
    "REDUCE_SLOTS",
    "DMA_DESC", "DmaDesc", "GEMM_JOB", "GemmJob", "HP_PORTS", "K26",
    "QUERY_HEADER", "QUERY_HEADER_BYTES", "QUERY_SCALE", "QueryRecord", "pack_query",
    "unpack_query", "query_bytes", "query_head_bytes", "query_fragments",
]
