"""The ``mcf`` command line: ``abi`` and ``verilog``."""

from mcf.abi import META
from mcf.abi.framing import MAX_PAYLOAD
from mcf.cli import main
from mcf.hdl.tops import TOPS


def test_abi_prints_layout_and_map(capsys):
    assert main(["abi"]) == 0
    out = capsys.readouterr().out
    assert f"Meta ({META.size} bits)" in out
    for name, _ in META:
        assert name in out
    assert "KV_REPLICA" in out and "SOFTMAX_MERGE" in out and "BUS_ERRORS" in out
    for record in ("Decode query header", "DMA descriptor", "GEMM job", "Attention job",
                   "Reduction configuration entry"):
        assert record in out
    assert f"MAX_PAYLOAD   {MAX_PAYLOAD} B" in out
    assert main(["abi", "--markdown"]) == 0
    assert "| `kv_id` |" in capsys.readouterr().out


def test_verilog_writes_every_top(tmp_path, capsys):
    assert main(["verilog", "--out", str(tmp_path)]) == 0
    written = sorted(p.stem for p in tmp_path.glob("*.v"))
    assert written == sorted(TOPS)
    for path in tmp_path.glob("*.v"):
        assert f"module {path.stem}" in path.read_text()


def test_verilog_unknown_top(capsys, tmp_path):
    assert main(["verilog", "--out", str(tmp_path), "--only", "nope"]) == 2
    assert "unknown top(s) nope" in capsys.readouterr().err
