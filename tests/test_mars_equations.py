"""Hand-computed checks of the MARS equations (paper eq 1, 3, 4, 6, 11, 12, 15, 16, 21, 22)."""

from fractions import Fraction

import pytest

from mcf.mars import (
    c_access,
    c_full,
    c_rep,
    c_ring,
    get_model,
    make_cluster,
    r_feasible,
    r_mem,
    r_reuse,
    replica_factor,
    t_attn_eq6,
)
from mcf.mars.layout import causal_keys, chunk_ranges, node_token_counts

MIB = 2 ** 20


def test_eq1_m_token():
    q = get_model("qwen2.5-1.5b")
    # 2 · L · H_kv · d · b = 2 · 28 · 2 · 128 · 0.5 = 7168 bytes
    assert q.m_token == 2 * 28 * 2 * 128 // 2 == 7168
    assert get_model("qwen2.5-1.5b", "int8").m_token == 2 * 28 * 2 * 128 * 1 == 14336
    assert get_model("qwen2.5-1.5b", "fp16").m_token == 2 * 28 * 2 * 128 * 2 == 28672
    # tiny (the golden TINY layer, 2 layers): 2 · 2 · 2 · 32 · 0.5 = 128 bytes
    assert get_model("tiny").m_token == 128
    assert q.kv_bytes == Fraction(1, 2)


def test_eq3_eq4_chunk_and_history():
    q = get_model("qwen2.5-1.5b")
    # M_chunk = B · M_token = 1024 · 7168 = 7,340,032 B = 7 MiB
    assert q.m_chunk(1024) == 7_340_032 == 7 * MIB
    # M_hist(16) = 16 · 7 MiB = 112 MiB (the whole 16K prompt)
    assert q.m_hist(16, 1024) == 112 * MIB


def test_eq11_eq12_memory_factor():
    # N = 8, S_node = 64 MiB, M_hist(c) = c · 7 MiB
    # c = 1: ⌊8·64/7⌋ = ⌊73.14⌋ = 73 -> eq 12 clamps to N = 8
    assert r_mem(8, 64 * MIB, 7 * MIB) == 73
    assert r_feasible(8, 73) == 8
    # c = 16: ⌊512/112⌋ = ⌊4.57⌋ = 4
    assert r_mem(8, 64 * MIB, 112 * MIB) == 4
    assert r_feasible(8, 4) == 4
    # a budget below the average: ⌊2·1/3⌋ = 0 -> eq 12 gives 1
    assert r_mem(2, 1, 3) == 0 and r_feasible(2, 0) == 1


def test_eq15_reuse_factor():
    # C = 16, N = 8, α = 0.5: c = 1 -> 1 + ⌊0.5·15⌋ = 1 + 7 = 8
    assert r_reuse(1, 16, 8, 0.5) == 8
    # c = 3 -> 1 + ⌊6.5⌋ = 7 ; c = 9 -> 1 + ⌊3.5⌋ = 4 ; c = 16 -> 1 + 0 = 1
    assert r_reuse(3, 16, 8, 0.5) == 7
    assert r_reuse(9, 16, 8, 0.5) == 4
    assert r_reuse(16, 16, 8, 0.5) == 1
    # α = 2, c = 1 -> 1 + 30 = 31, clamped to N = 8; α = 0 -> 1
    assert r_reuse(1, 16, 8, 2) == 8
    assert r_reuse(1, 16, 8, 0) == 1
    # α = 0.1 is exact (no float drift): c = 6 of C = 16 -> 1 + ⌊0.1·10⌋ = 2
    assert r_reuse(6, 16, 8, 0.1) == 2


def test_eq16_eq29_final_factor():
    # min(N, r_mem, r_reuse) = min(8, 73, 8) = 8
    assert replica_factor(1, 16, 8, 73, 8) == 8
    # memory-bound: min(8, 3, 7) = 3
    assert replica_factor(5, 16, 8, 3, 7) == 3
    # r_mem = 0 still leaves the owner: max(1, 0) = 1
    assert replica_factor(5, 16, 8, 0, 7) == 1
    # eq 29: the last chunk is never replicated
    assert replica_factor(16, 16, 8, 99, 8) == 1


def test_eq6_attention_time():
    q = get_model("qwen2.5-1.5b")
    cl = make_cluster(8, 64, node_config="kr260", dsps=1000,
                      clock_hz=250e6)                 # P = 4·1000·250e6 = 1e12 ops/s
    assert cl.p_node == 1e12
    # 4·L·H_q·d·B·cB / (N·P) = 4·28·12·128 · 1024 · 2·1024 / (8·1e12)
    expect = 4 * 28 * 12 * 128 * 1024 * 2048 / 8e12
    assert t_attn_eq6(q, cl, 1024, 2) == pytest.approx(expect)
    assert expect == pytest.approx(0.04509715, rel=1e-6)


def test_eq17_eq19_eq21_eq22_traffic():
    m = 7 * MIB
    # eq 17: M_chunk · (r − 1) · h_dis = 7 MiB · 3 · 1.5 = 31.5 MiB
    assert c_rep(m, 4, 1.5) == 31.5 * MIB
    # eq 19 at c = 2 with r = (4, 2), N = 8, h = 1: 7 MiB · (4 + 6) = 70 MiB
    assert c_access(m, 8, [4, 2], 1.0) == 70 * MIB
    # eq 21: 7 MiB · (8 − 1) · 1 · 16·17/2 = 7 · 7 · 136 MiB = 6664 MiB
    assert c_ring(m, 8, 16, 1.0) == 6664 * MIB
    # eq 22: 7 MiB · 7 · 1 · 16 = 784 MiB
    assert c_full(m, 8, 16, 1.0) == 784 * MIB


def test_layouts_balance_and_causal_keys():
    # 10 tokens over 4 nodes: 3,3,2,2 in chunk 1; the 2 extra tokens go round robin (nodes 2,3)
    assert node_token_counts(1, 10, 4) == [3, 3, 2, 2]
    assert node_token_counts(2, 10, 4) == [2, 2, 3, 3]
    # zigzag, chunk 1 of 8 tokens on 2 nodes: pieces [0,2) n0, [2,4) n1, [4,6) n1, [6,8) n0
    assert chunk_ranges(1, 8, 2, "zigzag") == [[(0, 2), (6, 8)], [(2, 4), (4, 6)]]
    assert chunk_ranges(1, 8, 2, "contiguous") == [[(0, 4)], [(4, 8)]]
    # causal keys: tokens 0..3 see 1+2+3+4 = 10 keys; zigzag balances 1+2+7+8 vs 3+4+5+6
    assert causal_keys([(0, 4)]) == 10
    assert causal_keys([(0, 2), (6, 8)]) == 18 == causal_keys([(2, 4), (4, 6)])


def test_eq8_chunk_is_the_smallest_that_hides_propagation():
    from mcf.mars import choose_chunk, r_mem, r_reuse, replica_factor, t_prop
    from mcf.mars.chunking import chunk_candidates
    q = get_model("qwen2.5-1.5b")
    cl = make_cluster(4, 64, node_config="kr260", buffer_mib=512, topology="switch")
    ch = choose_chunk(q, cl, 16384, 0.5)
    assert ch.bound == "overlap" and ch.overlap_ok

    def hides(b):
        num = 16384 // b
        for c in range(1, num + 1):
            rm = r_mem(4, cl.kv_budget, q.m_hist(c, b))
            r = replica_factor(c, num, 4, rm, r_reuse(c, num, 4, 0.5))
            if t_attn_eq6(q, cl, b, c) < cl.gamma * t_prop(q, cl, b, r)[0]:
                return False
        return True

    smaller = [b for b in chunk_candidates(q, cl, 16384) if b < ch.chunk]
    assert hides(ch.chunk) and not any(hides(b) for b in smaller)
    # eq 5 binds on the KR260 ring (1G links): no B within 8 MiB hides propagation, so the
    # largest buffer-feasible B is taken: ⌊8 MiB / 7168 B⌋ = 1170 tokens -> divisor 1024
    ring = make_cluster(8, 64, node_config="kr260", buffer_mib=8, topology="kr260-ring")
    ch = choose_chunk(q, ring, 16384, 0.5)
    assert ch.bound == "buffer" and ch.chunk == 1024 and ch.buffer_max_tokens == 1170
    assert not ch.overlap_ok and "buffer bound" in ch.explanation


def test_eq7_propagation_time_on_a_switch():
    from mcf.mars import t_prop
    q = get_model("qwen2.5-1.5b")
    cl = make_cluster(4, 64, node_config="kr260", topology="switch", link_gbps=10,
                      link_latency_us=2)
    # r = 2 on a 4-node switch: each owner sends its 256-token slice (256·7168 B) once up its
    # uplink and the switch once down to its replica holder; the busiest link carries one slice:
    # 1,835,008 B / (10e9/8 · 0.9 B/s) = 1.6311 ms, plus uplink + downlink latency 4 µs
    t, h_prop, depth = t_prop(q, cl, 1024, 2)
    assert h_prop == 1 and depth == 1
    assert t == pytest.approx(256 * 7168 / (10e9 / 8 * 0.9) + 4e-6)
    assert t_prop(q, cl, 1024, 1) == (0.0, 0.0, 0)
