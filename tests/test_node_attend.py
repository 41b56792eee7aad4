"""ATTEND executor (mcf.hdl.node.attend, docs/node.md §3, §7): the ABI (:mod:`mcf.abi.attend`),
the golden model (:mod:`mcf.golden.attend_unit`) and the cocotb + Verilator bench
(``sim/benches/node_attend.py``: ``AttendUnit`` + ``KvReader`` + ``AttentionEngine`` behind an
``AxiPortMux`` on an ``AxiRam``, bit-exact against :func:`mcf.golden.attend_unit.attend_model`,
every ``softmax`` setting: SINGLE, DECODE MAX / FIXED and their split invariance, PREFILL EXACT).
One Verilator build for every case.

Busy-fraction report: ``pytest tests/test_node_attend.py -k rate -s``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.attend import (
    ATTEND_ARG,
    ATTEND_STATUS,
    ENGINE_MODE,
    SOFTMAX_OF_MODE,
    AttendArg,
    AttendBlock,
    AttendHeader,
    AttendMode,
    AttendSoftmax,
    attend_list_bytes,
    attend_registers,
    max_payload_bytes,
)
from mcf.abi.compute import DMA_ADDR_BITS
from mcf.abi.framing import beat_layout
from mcf.abi.kv import AttnMode, attn_status_layout, pack_kv_block
from mcf.abi.node import CMD
from mcf.abi.query import pack_query
from mcf.abi.softmax import pack_state
from mcf.golden.attend_unit import attend_model
from mcf.golden.attention import (
    attend_fixed,
    attend_max,
    attend_single,
    normalize_state,
    random_blocks,
    random_query,
)
from mcf.hdl.compute.attention import AttentionEngine
from mcf.hdl.mem.axi import ADDR_BITS, AXI4Signature
from mcf.hdl.mem.axi_mux import AxiPortMux
from mcf.hdl.node.attend import AttendUnit
from mcf.hdl.node.kv_reader import KvReader

GEOM = {"head_dim": 16, "lanes": 4, "max_heads": 2, "max_block": 32, "max_list": 16}
BENCH = "mcf.sim.benches.node_attend"


# --- ABI and golden model ---------------------------------------------------------------------

def _mem(chunks: dict[int, bytes]):
    def read(addr: int, n: int) -> bytes:
        for base, data in chunks.items():
            if base <= addr and addr + n <= base + len(data):
                return data[addr - base:addr - base + n]
        raise AssertionError(f"read outside the test memory at {addr:#x}")
    return read


@pytest.mark.parametrize("prefill", [False, True])
def test_attend_model_matches_golden(prefill):
    """The model's decode states / prefill rows are mcf.golden.attention's on the same codes."""
    d = 16
    rng = np.random.default_rng(7 + prefill)
    blocks = random_blocks(rng, [5, 9], d, pos0=100)
    q, sq = random_query(rng, 2, d, sigma=1.5)
    kv = [pack_kv_block(b.k, b.sk, b.v, b.sv) for b in blocks]
    ents = [AttendBlock(0x1000, 5, 100), AttendBlock(0x2000, 9, 105)]
    lst = attend_list_bytes(AttendHeader(0x3000, 0x4000), ents)
    mem = _mem({0x1000: kv[0], 0x2000: kv[1], 0x3000: pack_query(q, sq, 109, 0),
                0x5000: lst})
    arg = AttendArg(0, 2, int(prefill), 2).pack()
    res = attend_model(arg, 0x5000, mem, d, 2, 32, 16)
    assert res.bad is None and res.blocks == 2
    st = attend_single(q, sq, blocks, 109, prefill)
    if prefill:
        want = (normalize_state(st).ravel() & 0xFFFF_FFFF).astype("<u4").tobytes()
        assert res.write == (0x4000, want) and res.payloads == []
    else:
        assert res.payloads == [pack_state(st.m[h], st.l[h], st.o[h]) for h in range(2)]
    for mode in (AttendMode.PREFILL_TILE.value, 3):   # no tiled path (max_chunk 0); undefined
        bad = attend_model(AttendArg(0, 2, mode, 2).pack(), 0x5000, mem, d, 2, 32, 16)
        assert bad.bad == "bad_record"
    assert attend_model(AttendArg(0, 2, 0, 1).pack(), 0x5000, mem, d, 2, 32, 16).bad \
        == "bad_list"       # the query holds 2 heads
    # ATT_ALIGN: the list base's low bits are taken as 0; a block's addr, the query's and a
    # used out_addr off a word are a bad list, an unused out_addr (DECODE SINGLE) is not
    assert attend_model(arg, 0x5003, mem, d, 2, 32, 16) == res
    for hdr, ents_ in ((AttendHeader(0x3000, 0x4000), [ents[0], AttendBlock(0x2002, 9, 105)]),
                       (AttendHeader(0x3001, 0x4000), ents),
                       (AttendHeader(0x3000, 0x4002), ents)):
        odd = _mem({0x1000: kv[0], 0x2000: kv[1], 0x3000: pack_query(q, sq, 109, 0),
                    0x5000: attend_list_bytes(hdr, ents_)})
        got = attend_model(arg, 0x5000, odd, d, 2, 32, 16).bad
        assert got == ("bad_list" if prefill or hdr.out_addr == 0x4000 else None)


def _two_phase_mem(d: int, m_fix: np.ndarray | None = None):
    """Two blocks at positions 100.., a 2-head query at position 109, the list at 0x5000 and
    (``m_fix``) maxima at 0x4000."""
    rng = np.random.default_rng(11)
    blocks = random_blocks(rng, [5, 9], d, pos0=100)
    q, sq = random_query(rng, 2, d, sigma=1.5)
    kv = [pack_kv_block(b.k, b.sk, b.v, b.sv) for b in blocks]
    lst = attend_list_bytes(AttendHeader(0x3000, 0x4000),
                            [AttendBlock(0x1000, 5, 100), AttendBlock(0x2000, 9, 105)])
    chunks = {0x1000: kv[0], 0x2000: kv[1], 0x3000: pack_query(q, sq, 109, 0), 0x5000: lst}
    if m_fix is not None:
        chunks[0x4000] = (np.asarray(m_fix) & 0xFFFF_FFFF).astype("<u4").tobytes()
    return _mem(chunks), q, sq, blocks


def test_attend_model_two_phase():
    """MAX / FIXED / EXACT: the model is mcf.golden.attention's attend_max / attend_fixed."""
    d, sm = 16, AttendSoftmax
    mem, q, sq, blocks = _two_phase_mem(d)
    res = attend_model(AttendArg(0, 2, 0, 2, sm.MAX).pack(), 0x5000, mem, d, 2, 32, 16)
    m = attend_max(q, sq, blocks)
    assert res.bad is None and res.blocks == 2 and res.write is None
    assert res.payloads == [(m & 0xFFFF_FFFF).astype("<u4").tobytes()]
    assert len(res.payloads[0]) == max_payload_bytes(2)
    # FIXED against maxima of a larger key set (here: 700 above the list's own)
    m_fix = m + 700
    mem, *_ = _two_phase_mem(d, m_fix)
    res = attend_model(AttendArg(0, 2, 0, 2, sm.FIXED).pack(), 0x5000, mem, d, 2, 32, 16)
    st, bad = attend_fixed(q, sq, blocks, m_fix)
    assert bad == 0 and res.blocks == 2 and res.write is None
    assert res.payloads == [pack_state(st.m[h], st.l[h], st.o[h]) for h in range(2)]
    assert all(int.from_bytes(p[:4], "little", signed=True) == m_fix[h]
               for h, p in enumerate(res.payloads))
    # EXACT: causal MAX then causal FIXED, normalised, written at out_addr; both passes' blocks
    res = attend_model(AttendArg(0, 2, 1, 2, sm.EXACT).pack(), 0x5000, mem, d, 2, 32, 16)
    mc = attend_max(q, sq, blocks, 109, causal=True)
    assert not np.array_equal(mc, m)                      # the mask hides the maximum
    st, bad = attend_fixed(q, sq, blocks, mc, 109, causal=True)
    want = (normalize_state(st).ravel() & 0xFFFF_FFFF).astype("<u4").tobytes()
    assert bad == 0 and res.write == (0x4000, want) and res.payloads == [] and res.blocks == 4
    # the pairs SOFTMAX_OF_MODE does not list are bad records (and PREFILL_TILE on a unit
    # without the tiled path, as this RTL unit is: tests/test_attend_tile_record.py runs it)
    for mode in AttendMode:
        for s in AttendSoftmax:
            r = attend_model(AttendArg(0, 2, mode.value, 2, s).pack(), 0x5000, mem, d, 2, 32, 16)
            assert (r.bad == "bad_record") == (s not in SOFTMAX_OF_MODE[mode]
                                               or mode == AttendMode.PREFILL_TILE), (mode, s)


def test_layouts_and_registers():
    assert ATTEND_ARG.size <= CMD["arg"].shape.width
    assert [f for f, _ in ATTEND_ARG] == ["list", "blocks", "mode", "heads", "softmax"]
    assert AttendArg(3, 2, 1, 2, AttendSoftmax.EXACT).pack() \
        == 3 | 2 << 16 | 1 << 24 | 2 << 26 | 3 << 30
    assert ENGINE_MODE == {AttendSoftmax.SINGLE: AttnMode.SINGLE,
                           AttendSoftmax.MAX: AttnMode.MAX, AttendSoftmax.FIXED: AttnMode.FIXED}
    names = {r.name for r in attend_registers()}
    assert {"ATT_LIST_BASE_LO", "ATT_LIST_BASE_HI"} <= names
    assert {f"att_{n}" for n, _ in ATTEND_STATUS} <= {n.lower() for n in names}


# --- cocotb + Verilator end to end ------------------------------------------------------------

class AttendBench(wiring.Component):
    """Bench top: ``AttendUnit`` → ``KvReader`` + ``AttentionEngine`` → back to the unit; the
    unit's read and write masters and the reader's behind one ``AxiPortMux``."""

    def __init__(self, head_dim, lanes, max_heads, max_block, max_list):
        self.unit = AttendUnit(head_dim, lanes, max_heads, max_block, max_list=max_list)
        self.reader = KvReader(head_dim, lanes, max_block)
        self.engine = AttentionEngine(head_dim, lanes, max_heads, max_block)
        self.mux = AxiPortMux(3, addr_width=ADDR_BITS, data_width=128)
        super().__init__({
            "rec": In(stream.Signature(CMD.size)),
            "done": Out(1),
            "busy": Out(1),
            "list_base": In(DMA_ADDR_BITS),
            "staged": Out(stream.Signature(beat_layout(64))),
            "m_axi": Out(AXI4Signature(ADDR_BITS, 128, self.mux.id_width)),
            "status": Out(ATTEND_STATUS),
            "engine_status": Out(attn_status_layout()),
        })

    def elaborate(self, platform):
        m = Module()
        u, r, e, x = self.unit, self.reader, self.engine, self.mux
        m.submodules.unit, m.submodules.reader, m.submodules.engine = u, r, e
        m.submodules.mux = x
        m.d.comb += [u.rec.valid.eq(self.rec.valid), self.rec.ready.eq(u.rec.ready),
                     u.rec.payload.as_value().eq(self.rec.payload),
                     u.list_base.eq(self.list_base), self.done.eq(u.done),
                     self.busy.eq(u.busy), self.status.eq(u.status),
                     self.engine_status.eq(e.status)]
        wiring.connect(m, u.job, e.job)
        wiring.connect(m, u.q, e.q)
        wiring.connect(m, u.blocks, r.blocks)
        wiring.connect(m, r.k, e.k)
        wiring.connect(m, r.v, e.v)
        wiring.connect(m, e.o, u.o)
        wiring.connect(m, u.staged, wiring.flipped(self.staged))
        wiring.connect(m, u.rd_bus, x.s0)
        wiring.connect(m, u.wr_bus, x.s1)
        wiring.connect(m, r.bus, x.s2)
        wiring.connect(m, x.m, wiring.flipped(self.m_axi))
        return m


def attend_built():
    from mcf.hdl.flat import FlatTop
    from mcf.sim import build
    return build(FlatTop(AttendBench(**GEOM), {"rec": "s_axis_rec", "staged": "m_axis_staged"}),
                 "node_attend", params=GEOM)


@pytest.mark.parametrize("pause", [0.0, 0.4])
def test_attend_bench(pause):
    from mcf.sim import run
    run(attend_built(), BENCH, params={**GEOM, "seed": 3 + int(10 * pause), "pause": pause,
                                       "tests": ["decode", "prefill", "bad", "two_phase",
                                                 "split", "bad_softmax"]})


def test_attend_rate(tmp_path):
    """Engine busy fraction during one ATTEND of 8 blocks (reported with ``-s``)."""
    from mcf.sim import run
    out = tmp_path / "rate.json"
    run(attend_built(), BENCH, params={**GEOM, "seed": 5, "tests": ["rate"], "out": str(out)})
    result = json.loads(out.read_text())
    for r in result:
        print("attend rate:", r)
    assert [r["heads"] for r in result] == [GEOM["max_heads"], 1]
    assert all(0 < r["busy_fraction"] <= 1 for r in result)
