"""The Verilog cache (mcf.hdl.convert): a design is converted once per (name, description,
sources); a hit returns the same text without calling the factory; another description or a
changed source misses; the folder follows MCF_BUILD_DIR."""

from amaranth import Module
from amaranth.back import verilog
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

import mcf.hdl.convert as convert


class Counter(wiring.Component):
    en: In(1)
    count: Out(8)

    def elaborate(self, platform):
        m = Module()
        with m.If(self.en):
            m.d.sync += self.count.eq(self.count + 1)
        return m


def test_hit_miss_and_the_build_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("MCF_BUILD_DIR", str(tmp_path))
    made = []

    def make():
        made.append(1)
        return Counter()

    first = convert.verilog_text("ctr", make, "Counter()")
    assert first == verilog.convert(Counter(), name="ctr", emit_src=False)
    assert "module ctr" in first and len(made) == 1
    assert [p.name.split("-")[0] for p in (tmp_path / "verilog-cache").iterdir()] == ["ctr"]
    assert convert.verilog_text("ctr", make, "Counter()") == first and len(made) == 1
    convert.verilog_text("ctr", make, "Counter(), other parameters")
    assert len(made) == 2
    monkeypatch.setattr(convert, "source_digest", lambda: "edited")
    convert.verilog_text("ctr", make, "Counter()")
    assert len(made) == 3
    assert len(list((tmp_path / "verilog-cache").iterdir())) == 3


def test_the_digest_covers_every_source():
    digest = convert.source_digest()
    assert len(digest) == 16 and digest == convert.source_digest()
