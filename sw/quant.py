"""Host-side quantiser: float32 tensors → the INT4/INT8/ACT formats of :mod:`mcf.abi.quant`, and
the DDR layouts the GEMM engine streams (paper §6.1: weights and KV in INT4).

* :func:`quantize_weight` — symmetric INT4 with one scale per row and group of K; the group
  scales of a tensor share one exponent (the largest that keeps every mantissa in 16 bits).
* :func:`weight_tile_bytes` / :func:`scale_tile_bytes` — the engine's tiled layouts: for each
  tile of ``rows`` output rows, one word per k-step of ``lanes`` elements holding
  ``rows × lanes`` nibbles (row-major, packed as :func:`mcf.abi.fixed.pack_int4`), and one word
  per group holding ``rows`` 16-bit little-endian mantissas.
* :func:`to_act` / :func:`from_act` — float ↔ ACT codes.
* :func:`gemm_stripe_image` — a matrix as the four weight stripes the stripe readers read in
  lockstep (docs/node.md §4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .abi.compute import STRIPE_ALIGN, WEIGHT_STRIPES, StripeJob, gemm_w_stream, gemm_w_stripes
from .abi.fixed import pack_int4, saturate
from .abi.quant import ACT, GROUP_SIZE, SCALE_MANT_BITS, WEIGHT, Scale

__all__ = ["QuantWeight", "quantize_weight", "weight_tile_bytes", "scale_tile_bytes",
           "to_act", "from_act", "token_scale_words", "pack_token_scale", "gemm_tile_blob",
           "gemm_x_blob", "gemm_stripe_image"]


@dataclass
class QuantWeight:
    """``W ≈ q · m[:, k // group] · 2^e``."""
    q: np.ndarray        # [N, K] int8 codes in -8..7
    m: np.ndarray        # [N, K / group] scale mantissas (uint16 range)
    e: int               # shared scale exponent
    group: int

    @property
    def shape(self):
        return self.q.shape

    def dequantize(self) -> np.ndarray:
        s = self.m.astype(np.float64) * 2.0 ** self.e
        return self.q.astype(np.float64) * np.repeat(s, self.group, axis=1)


def quantize_weight(w, group: int = GROUP_SIZE) -> QuantWeight:
    """Symmetric group-wise INT4: ideal scale ``absmax / 7`` per (row, group), mantissas
    rounded half-even under the tensor's shared exponent, codes ``round_half_even(w / s)``
    saturated to -8..7 (with the rounded scale, so the stored scale is the one applied)."""
    w = np.asarray(w, dtype=np.float64)
    n, k = w.shape
    if k % group:
        raise ValueError(f"K = {k} is not a multiple of the group size {group}")
    g = w.reshape(n, k // group, group)
    ideal = np.max(np.abs(g), axis=2) / WEIGHT.max_int
    top = float(ideal.max())
    if top == 0.0:
        e = 0
    else:
        e = math.floor(math.log2(((1 << SCALE_MANT_BITS) - 1) / top))
        e = -e
        while np.rint(top * 2.0 ** -e) > (1 << SCALE_MANT_BITS) - 1:
            e += 1
    m = np.rint(ideal * 2.0 ** -e).astype(np.int64)
    Scale(int(m.max()), e)  # range check of mantissa and exponent
    s = (m.astype(np.float64) * 2.0 ** e)[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s > 0, np.rint(g / np.where(s > 0, s, 1.0)), 0)
    q = saturate(q.astype(np.int64), WEIGHT.width).reshape(n, k).astype(np.int8)
    return QuantWeight(q, m, e, group)


def weight_tile_bytes(q, rows: int, lanes: int) -> bytes:
    """Tiled INT4 layout: tiles of ``rows`` rows, inside a tile one word per k-step of
    ``rows × lanes`` nibbles (row r, lane l at nibble ``r·lanes + l``). ``N`` and ``K`` must be
    multiples of ``rows`` and ``lanes``."""
    q = np.asarray(q, dtype=np.int64)
    n, k = q.shape
    if n % rows or k % lanes:
        raise ValueError("weight shape must be a multiple of (rows, lanes)")
    t = q.reshape(n // rows, rows, k // lanes, lanes).transpose(0, 2, 1, 3)
    return pack_int4(t.ravel()).tobytes()


def scale_tile_bytes(m, rows: int) -> bytes:
    """One word per (tile, group): ``rows`` little-endian 16-bit mantissas."""
    m = np.asarray(m, dtype=np.int64)
    n, groups = m.shape
    if n % rows:
        raise ValueError("rows must divide N")
    t = m.reshape(n // rows, rows, groups).transpose(0, 2, 1)
    return t.astype("<u2").tobytes()


def pack_token_scale(m, e) -> np.ndarray:
    """Per-token scale words: mantissa in bits 0..15, exponent (two's complement) in 16..23."""
    m = np.asarray(m, dtype=np.int64)
    e = np.asarray(e, dtype=np.int64)
    return (m & 0xFFFF) | ((e & 0xFF) << SCALE_MANT_BITS)


def token_scale_words(m, e) -> bytes:
    return pack_token_scale(m, e).astype("<u4").tobytes()


def to_act(x) -> np.ndarray:
    """float → ACT codes (round half-even, saturate)."""
    return ACT.quantize(x, "half_even")


def from_act(code) -> np.ndarray:
    return ACT.to_float(code)


def gemm_tile_blob(qw: QuantWeight, rows: int, lanes: int, bias=None) -> bytes:
    """The GEMM engine's weight stream: per tile of ``rows`` rows, its weight words
    (:func:`weight_tile_bytes`), its scale words (:func:`scale_tile_bytes`) and ``rows`` 32-bit
    ACT bias codes (zeros when ``bias`` is None). Tiles follow each other contiguously, so a
    whole matrix is one DMA descriptor."""
    n, k = qw.q.shape
    bias = np.zeros(n, dtype=np.int64) if bias is None else np.asarray(bias, dtype=np.int64)
    out = bytearray()
    for t in range(n // rows):
        sl = slice(t * rows, (t + 1) * rows)
        out += weight_tile_bytes(qw.q[sl], rows, lanes)
        out += scale_tile_bytes(qw.m[sl], rows)
        out += (bias[sl] & 0xFFFFFFFF).astype("<u4").tobytes()
    return bytes(out)


def gemm_stripe_image(qw: QuantWeight, rows: int, lanes: int, bias=None, *, base: int = 0,
                      ports: int = WEIGHT_STRIPES, beat_bytes: int = 16,
                      align: int = STRIPE_ALIGN) -> tuple[bytes, StripeJob]:
    """A weight matrix as the driver lays it in DDR for the stripe readers (docs/node.md §4):
    the tile blob (:func:`gemm_tile_blob`) as the engine's stream for a ``w_in`` of ``ports ·
    beat_bytes`` bytes (:func:`mcf.abi.compute.gemm_w_stream`), split into ``ports`` stripes
    (:func:`mcf.abi.compute.gemm_w_stripes`: stripe ``p`` = beats ``ports·i + p``), stripe ``p``
    at offset ``p · pitch`` (the stripe length rounded up to ``align``; zeros between). Returns
    the image (to place at ``base``) and its job descriptor."""
    n, k = qw.q.shape
    if base % beat_bytes or align % beat_bytes:
        raise ValueError(f"stripe image at {base:#x}, pitch unit {align}: stripes start on "
                         f"{beat_bytes}-byte beats")
    ws = gemm_w_stream(gemm_tile_blob(qw, rows, lanes, bias), k // lanes, n // rows, rows, lanes,
                       ports * beat_bytes, qw.group)
    stripes = gemm_w_stripes(ws, ports, beat_bytes)
    length = len(stripes[0])
    pitch = -(-length // align) * align
    image = b"".join(s + bytes(pitch - length) for s in stripes[:-1]) + stripes[-1]
    return image, StripeJob(base, length, pitch)


def gemm_x_blob(xq, x_m, x_e, beat_bytes: int) -> bytes:
    """The GEMM engine's activation stream: INT8 codes token-major, then the per-token scale
    words padded to whole beats."""
    xq = np.asarray(xq, dtype=np.int64)
    words = token_scale_words(x_m, x_e)
    pad = (-len(words)) % beat_bytes
    return (xq & 0xFF).astype(np.uint8).tobytes() + words + bytes(pad)
