"""Decode query payload (mcf.abi.query): exact byte layout, pack/unpack round trip, sizes and
fragmenting into whole heads."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcf.abi import META
from mcf.abi.framing import MAX_PAYLOAD
from mcf.abi.kv import KV_POS_BITS, Q_ELEM, quantize_q
from mcf.abi.quant import SCALE_EXP_BITS, SCALE_MANT_BITS
from mcf.abi.query import (
    QUERY_HEADER,
    QUERY_HEADER_BYTES,
    pack_query,
    query_bytes,
    query_fragments,
    query_head_bytes,
    unpack_query,
)

E_MIN, E_MAX = -(1 << (SCALE_EXP_BITS - 1)), (1 << (SCALE_EXP_BITS - 1)) - 1


@st.composite
def queries(draw):
    heads = draw(st.integers(1, 12))
    head_dim = draw(st.integers(1, 40))
    codes = draw(st.lists(st.integers(Q_ELEM.min_int, Q_ELEM.max_int),
                          min_size=heads * head_dim, max_size=heads * head_dim))
    m = draw(st.lists(st.integers(0, (1 << SCALE_MANT_BITS) - 1), min_size=heads,
                      max_size=heads))
    e = draw(st.lists(st.integers(E_MIN, E_MAX), min_size=heads, max_size=heads))
    pos = draw(st.integers(0, (1 << KV_POS_BITS) - 1))
    layer = draw(st.integers(0, (1 << META["seq"].width) - 1))
    head0 = draw(st.integers(0, (1 << QUERY_HEADER["head0"].shape.width) - 1))
    return (np.array(codes).reshape(heads, head_dim), np.stack([m, e], axis=-1), pos, layer,
            head0)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(queries())
def test_pack_unpack_round_trip_and_size(q):
    codes, scales, pos, layer, head0 = q
    heads, head_dim = codes.shape
    payload = pack_query(codes, scales, pos, layer, head0)
    assert len(payload) == query_bytes(heads, head_dim)
    assert len(payload) % 4 == 0
    r = unpack_query(payload, head_dim)
    assert (r.pos, r.layer, r.head0, r.heads) == (pos, layer, head0, heads)
    assert np.array_equal(r.codes, codes) and np.array_equal(r.scales, scales)
    assert pack_query(r.codes, r.scales, r.pos, r.layer, r.head0) == payload


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(1, 256), st.integers(1, 300), st.integers(1, 3 * MAX_PAYLOAD),
       st.one_of(st.none(), st.integers(1, 16)))
def test_fragments_are_whole_heads_within_the_payload(heads, head_dim, max_payload, max_heads):
    one = query_bytes(1, head_dim)
    if one > max_payload:
        with pytest.raises(ValueError, match="exceeds the largest payload"):
            query_fragments(heads, head_dim, max_payload, max_heads)
        return
    frags = query_fragments(heads, head_dim, max_payload, max_heads)
    assert [h0 for h0, _ in frags] == [sum(n for _, n in frags[:i]) for i in range(len(frags))]
    assert sum(n for _, n in frags) == heads
    counts = [n for _, n in frags]
    assert max(counts) - min(counts) <= 1
    fit = (max_payload - QUERY_HEADER_BYTES) // query_head_bytes(head_dim)
    if max_heads is not None:
        fit = min(fit, max_heads)
    assert all(query_bytes(n, head_dim) <= max_payload and n <= fit for n in counts)
    assert len(frags) == -(-heads // fit)      # as few payloads as the limits allow


def test_exact_layout_little_endian():
    codes = np.array([[1, -1, 127, -128, 5], [0, 2, -3, 4, -5]])
    scales = np.array([[0xBEEF, -3], [0x8001, 7]])
    p = pack_query(codes, scales, pos=0x12345, layer=27, head0=4)
    # header: pos in bits 0..19, layer 20..27, head0 28..35, heads 36..43, 8 bytes
    hdr = 0x12345 | 27 << 20 | 4 << 28 | 2 << 36
    assert QUERY_HEADER_BYTES == 8 and p[:8] == hdr.to_bytes(8, "little")
    # per head: scale word (m | e << 16, e two's complement), then 5 codes padded to 8 bytes
    assert p[8:12] == bytes([0xEF, 0xBE, 0xFD, 0x00])
    assert p[12:20] == bytes([1, 0xFF, 127, 0x80, 5, 0, 0, 0])
    assert p[20:24] == bytes([0x01, 0x80, 0x07, 0x00])
    assert p[24:32] == bytes([0, 2, 0xFD, 4, 0xFB, 0, 0, 0])
    assert len(p) == 32 == query_bytes(2, 5)


def test_qwen_sizes():
    # Qwen2.5-1.5B: 12 query heads of 128 -> 8 + 12 x (4 + 128) = 1592 B, one payload
    assert query_head_bytes(128) == 132
    assert query_bytes(12, 128) == 1592 <= MAX_PAYLOAD
    assert query_fragments(12, 128) == [(0, 12)]
    assert query_fragments(12, 128, max_heads=4) == [(0, 4), (4, 4), (8, 4)]
    assert query_fragments(12, 128, max_payload=600) == [(0, 4), (4, 4), (8, 4)]


def test_carries_what_the_vector_unit_produces():
    rng = np.random.default_rng(3)
    x = rng.normal(0, 4, size=(12, 128))
    q, sq = quantize_q(x)
    r = unpack_query(pack_query(q, sq, pos=4095, layer=3), 128)
    assert np.array_equal(r.codes, q) and np.array_equal(r.scales, sq)


@pytest.mark.parametrize("kw, msg", [
    (dict(codes=[[128]]), "codes"), (dict(codes=[[-129]]), "codes"),
    (dict(scales=[[1 << 16, 0]]), "mantissas"), (dict(scales=[[1, E_MAX + 1]]), "exponents"),
    (dict(pos=1 << KV_POS_BITS), "pos"), (dict(layer=256), "layer"), (dict(head0=-1), "head0"),
    (dict(scales=[[1, 0], [1, 0]]), "scales must be"),
])
def test_bad_fields_are_rejected(kw, msg):
    args = dict(codes=[[1]], scales=[[1, 0]], pos=0, layer=0, head0=0) | kw
    with pytest.raises(ValueError, match=msg):
        pack_query(**args)


def test_bad_lengths_are_rejected():
    p = pack_query([[1, 2, 3, 4]], [[9, 1]], 0, 0)
    with pytest.raises(ValueError, match="does not hold"):
        unpack_query(p + b"\0\0\0\0", 4)
    with pytest.raises(ValueError, match="does not hold"):
        unpack_query(p, 8)
    with pytest.raises(ValueError, match="at least"):
        unpack_query(p[:4], 4)
