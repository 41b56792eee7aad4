"""Golden model of the EMIT executor (``mcf.hdl.node.emit.EmitUnit``), bit for bit: the K/V ACT
rows a record reads, the INT4 fragment it makes, the local packet and the staged payload, and
the :data:`mcf.abi.emit.EMIT_STATUS` counters. The record, the ACT row layout and the bad-record
rule (:func:`mcf.abi.emit.emit_check`) are the ABI's (:mod:`mcf.abi.emit`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mcf.abi.emit import EMIT_STATUS, EmitArg, EmitConfig, emit_check, kv_pair_bytes
from mcf.abi.kv import (
    KV_SCALE,
    KVQ_SCALE_SHIFT,
    kvq_scale_mult,
    pack_kv_block,
    quantize_kv_rows,
)
from mcf.abi.meta import Meta

__all__ = ["act_kv_rows", "EmitResult", "emit_fragment", "EmitModel"]


def act_kv_rows(mem: bytes | bytearray, cfg: EmitConfig, head_dim: int, row: int, head: int,
                tokens: int, base: int = 0):
    """Read a fragment's (K rows, V rows) ``[tokens, head_dim]`` ACT codes from a memory image
    ``mem`` that starts at address ``base``."""
    pb = kv_pair_bytes(head_dim)
    out = np.zeros((tokens, 2 * head_dim), dtype=np.int64)
    for t in range(tokens):
        a = cfg.pair_address(head_dim, row + t, head) - base
        out[t] = np.frombuffer(bytes(mem[a:a + pb]), dtype="<i4")
    return out[:, :head_dim], out[:, head_dim:]


def _saturated(x) -> int:
    """Rows whose KV scale saturates (the quantizer's ``scale_sat``)."""
    s = (np.abs(x).max(axis=-1) * kvq_scale_mult() + (1 << (KVQ_SCALE_SHIFT - 1))) \
        >> KVQ_SCALE_SHIFT
    return int(np.sum(s > KV_SCALE.max_int))


@dataclass(frozen=True)
class EmitResult:
    """What one EMIT record produces: the local packet ``(meta, payload)`` (``None`` for a bad
    record or a read error), the staged payload (``None`` unless replicated), the counters
    touched, and the scale saturations."""
    local: tuple[Meta, bytes] | None
    staged: bytes | None
    bad: bool = False
    read_error: bool = False
    scale_sat: int = 0


def emit_fragment(meta: Meta, arg: EmitArg, replicate: bool, k, v, local_id: int,
                  read_error: bool = False) -> EmitResult:
    """The emitter, bit for bit: K/V ACT rows ``[tokens, head_dim]`` → INT4 fragment payload
    (:func:`mcf.abi.kv.quantize_kv_rows`, :func:`mcf.abi.kv.pack_kv_block`) → the local packet
    (``meta.src = local_id``) and, when ``replicate``, the same payload staged."""
    k, v = np.asarray(k, dtype=np.int64), np.asarray(v, dtype=np.int64)
    head_dim = k.shape[1]
    if not emit_check(meta, arg, head_dim):
        return EmitResult(None, None, bad=True)
    k4, sk = quantize_kv_rows(k)
    v4, sv = quantize_kv_rows(v)
    sat = _saturated(k) + _saturated(v)
    if read_error:
        return EmitResult(None, None, read_error=True, scale_sat=sat)
    payload = pack_kv_block(k4, sk, v4, sv)
    return EmitResult((meta.replace(src=local_id), payload), payload if replicate else None,
                      scale_sat=sat)


class EmitModel:
    """Golden model of a run of EMIT records against a memory image: keeps the counters of
    :data:`EMIT_STATUS` and the lists of local packets and staged payloads, in order."""

    def __init__(self, cfg: EmitConfig, head_dim: int, local_id: int, mem: bytes, base: int = 0):
        self.cfg, self.head_dim, self.local_id = cfg, head_dim, local_id
        self.mem, self.base = mem, base
        self.status = {name: 0 for name, _ in EMIT_STATUS}
        self.local: list[tuple[Meta, bytes]] = []
        self.staged: list[bytes] = []

    def run(self, meta: Meta, arg: EmitArg, replicate: bool,
            read_error: bool = False) -> EmitResult:
        st = self.status
        st["records"] += 1
        if not emit_check(meta, arg, self.head_dim):
            st["bad_record"] += 1
            return EmitResult(None, None, bad=True)
        k, v = act_kv_rows(self.mem, self.cfg, self.head_dim, arg.row, arg.head, arg.tokens,
                           self.base)
        res = emit_fragment(meta, arg, replicate, k, v, self.local_id, read_error)
        st["tokens"] += arg.tokens
        st["scale_sat"] += res.scale_sat
        if read_error:
            st["read_errors"] += 1
            return res
        st["local"] += 1
        self.local.append(res.local)
        if replicate:
            st["staged"] += 1
            self.staged.append(res.staged)
        return res
