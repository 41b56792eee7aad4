"""The Verilog cache (mcf.hdl.convert): a design is converted once per (name, description,
sources); a hit returns the same text without calling the factory; another description or a
changed source misses; the folder follows MCF_BUILD_DIR; two converters of one entry at once
convert it once."""

import threading

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
    assert [p.name.split("-")[0] for p in (tmp_path / "verilog-cache").glob("*.v")] == ["ctr"]
    assert convert.verilog_text("ctr", make, "Counter()") == first and len(made) == 1
    convert.verilog_text("ctr", make, "Counter(), other parameters")
    assert len(made) == 2
    monkeypatch.setattr(convert, "source_digest", lambda: "edited")
    convert.verilog_text("ctr", make, "Counter()")
    assert len(made) == 3
    assert len(list((tmp_path / "verilog-cache").glob("*.v"))) == 3


def test_a_second_converter_waits_and_reads_the_first_ones_text(tmp_path, monkeypatch):
    """B asks for the entry while A is converting it: B waits on the entry's lock and returns
    A's text without converting (each thread opens the lock file itself, so ``flock`` makes
    them take turns as it does two processes)."""
    monkeypatch.setenv("MCF_BUILD_DIR", str(tmp_path))
    made, entered, release = [], threading.Event(), threading.Event()
    texts = {}

    def make():
        made.append(1)
        entered.set()
        release.wait(timeout=60)
        return Counter()

    a = threading.Thread(target=lambda: texts.update(a=convert.verilog_text("ctr", make, "C")))
    b = threading.Thread(target=lambda: texts.update(b=convert.verilog_text("ctr", make, "C")))
    a.start()
    assert entered.wait(timeout=60)
    b.start()
    b.join(timeout=0.5)
    assert b.is_alive()                       # B waits for A's lock (or had not started yet)
    release.set()
    a.join()
    b.join()
    assert len(made) == 1 and texts["a"] == texts["b"] and "module ctr" in texts["b"]


def test_the_digest_covers_every_source():
    digest = convert.source_digest()
    assert len(digest) == 16 and digest == convert.source_digest()
