"""The register-map builder and the node map (mcf.abi.regs, mcf.abi.csrmap)."""

import pytest

from mcf.abi import MCF_ID, Access, Field, Register, RegisterMap
from mcf.abi.compute import DMA_STATUS, GEMM_STATUS, VECTOR_STATUS
from mcf.abi.csrmap import PARSER_PORTS, PARSER_STATUS, node_regmap
from mcf.abi.doc import regmap_text
from mcf.abi.kv import attn_status_layout
from mcf.abi.kv_channel import kvq_status_layout
from mcf.abi.platform import HP_PORTS


def test_builder_assigns_word_addresses():
    regs = RegisterMap("t", version=0x0102)
    assert regs.addr("ID") == 0 and regs.addr("BUS_ERRORS") == 4
    a = regs.add(Register.single("CTRL", 8, Access.RW, reset=5))
    b = regs.add(Register("STAT", (Field("busy", 1, Access.R), Field("err", 3, Access.RW1C))))
    assert (a, b) == (8, 12)
    assert regs.size == 16
    assert regs.id_word == (MCF_ID << 16) | 0x0102
    assert regs.register("CTRL").reset == 5
    assert [(f.name, off) for f, off in regs.register("STAT").offsets()] == [("busy", 0),
                                                                             ("err", 1)]
    regs.add(Register.single("X", 1, Access.W))
    assert regs.size == 32  # rounded up to a power of two


def test_builder_rejects_bad_registers():
    regs = RegisterMap("t", version=1)
    with pytest.raises(ValueError, match="already in map"):
        regs.add(Register.single("ID", 1, Access.R))
    with pytest.raises(ValueError, match="exceed 32 bits"):
        Register("R", (Field("a", 20, Access.R), Field("b", 13, Access.R)))
    with pytest.raises(ValueError, match="reset"):
        Field("a", 2, Access.RW, reset=4)
    with pytest.raises(KeyError):
        regs.addr("NOPE")


def test_node_map_has_every_status_counter():
    regs = node_regmap()
    names = {r.name for _, r in regs}
    for port in range(PARSER_PORTS):
        for field, _ in PARSER_STATUS:
            assert f"parser{port}_{field}" in names
    assert f"parser{PARSER_PORTS}_rx_packets" not in names
    for prefix, layout in [*((f"dma{p}", DMA_STATUS) for p in range(HP_PORTS)),
                           ("gemm", GEMM_STATUS), ("vector", VECTOR_STATUS),
                           ("attn", attn_status_layout()), ("kvq", kvq_status_layout())]:
        for field, _ in layout:
            assert f"{prefix}_{field}" in names
    assert regs.register("NODE").fields[1].reset == 1  # num_nodes defaults to 1
    pynq = regs.pynq_registers()
    assert pynq["ID"]["access"] == "read-only"
    assert pynq["NODE"]["fields"]["num_nodes"]["bit_offset"] == 5
    text = regmap_text(regs)
    assert "parser1_drop_truncated" in text and "0x0000" in text


def test_register_pack_unpack_round_trip():
    from mcf.abi.csrmap import node_regmap
    reg = node_regmap().register("NODE")
    word = reg.pack(local_id=3, num_nodes=4)
    assert reg.unpack(word) == {"local_id": 3, "num_nodes": 4}
    assert reg.pack() == reg.reset
    with pytest.raises(ValueError):
        reg.pack(bogus=1)
    with pytest.raises(ValueError):
        reg.pack(local_id=1 << 16)
