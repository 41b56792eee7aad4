"""The import layering rules (CONTRIBUTING.md "Layering rules"), checked on the source text.

Every ``.py`` under ``sw/`` (``mcf``), ``hdl/`` (``mcf.hdl``) and ``sim/`` (``mcf.sim``) is parsed
with :mod:`ast` — nothing is imported or executed — and every import in it, at any depth (inside
functions, ``try``/``except``, ``if TYPE_CHECKING``), is resolved to an absolute module name
(relative imports against the file's package; ``importlib.import_module`` with a literal name or
an f-string's literal prefix). The rules:

* ``sw/`` outside the command line (``sw/commands/``, ``sw/cli.py``) never imports ``mcf.sim``;
* ``sw/golden/`` (the golden models) never imports ``mcf.hdl`` or ``mcf.sim``;
* ``hdl/`` never imports ``mcf.sim``;
* ``sw/abi/`` (the contract: layouts, enums, widths, limits, formats, registers) imports nothing
  of ``mcf`` outside ``mcf.abi`` — not ``mcf.golden``, ``mcf.hdl`` or ``mcf.sim``: golden models
  import the ABI, never the reverse;
* ``sw/abi/`` defines no golden model (no class named ``*Model``): those live in ``sw/golden/``;
* every golden model lives in ``sw/golden/`` (issue #37): nothing else under ``sw/`` defines a
  class whose name contains ``Golden`` or a function named ``golden_*`` (the model's, the
  cluster run's and the node programs' goldens included);
* no ``sw/golden/`` module is on an import cycle (the static import graph, parent packages
  included): the modules a golden model reaches outside ``mcf.abi`` (``mcf.model``'s checkpoint
  names, ``mcf.node``'s plan helpers) never import it back;
* nothing outside ``sim/benches/`` imports ``mcf.sim.benches`` (the cocotb benches): code
  outside runs a bench through the cocotb runner by its module name
  (:func:`mcf.sim.toolchain.run`), and the helpers benches share with tests and benchmarks live
  in :mod:`mcf.sim.tb`, :mod:`mcf.sim.amsim` and :mod:`mcf.sim.cluster`;
* the board runtime (``sw/driver/``, ``sw/cluster/board*.py``, ``sw/deploy/``) imports no
  ``amaranth_boards`` — neither itself nor through any ``mcf`` module it reaches (the static
  import graph, parent packages included).

A failure names ``file:line`` and the import.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"sw": "mcf", "hdl": "mcf.hdl", "sim": "mcf.sim"}
"""Source folder → package (as ``setup.py`` maps them)."""


@dataclass(frozen=True)
class Import:
    """One import statement: its line, the absolute module names it may load (for
    ``from a import b``: ``a`` and ``a.b``, as ``b`` may be a submodule) and its text."""
    line: int
    modules: tuple[str, ...]
    text: str

    def where(self, path: str) -> str:
        return f"{path}:{self.line}: {self.text}"


def _under(module: str, names: Iterable[str]) -> bool:
    return any(module == n or module.startswith(n + ".") for n in names)


@dataclass(frozen=True)
class Rule:
    """Files matching ``include`` (glob patterns, repo-relative) and no ``exclude`` pattern may
    not import ``banned`` (a module or any module under it) unless it is under ``allow`` (or is a
    parent package of an allowed module, which importing it runs anyway)."""
    name: str
    include: tuple[str, ...]
    banned: tuple[str, ...]
    exclude: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()

    def applies(self, path: str) -> bool:
        return (any(fnmatch(path, p) for p in self.include)
                and not any(fnmatch(path, p) for p in self.exclude))

    def bans(self, imp: Import) -> bool:
        return any(_under(m, self.banned) and not _under(m, self.allow)
                   and not any(a.startswith(m + ".") for a in self.allow)
                   for m in imp.modules)


RULES = (
    Rule("sw outside the CLI never imports mcf.sim", ("sw/*",), ("mcf.sim",),
         exclude=("sw/commands/*", "sw/cli.py")),
    Rule("golden models never import mcf.hdl or mcf.sim", ("sw/golden/*",),
         ("mcf.hdl", "mcf.sim")),
    Rule("hdl never imports mcf.sim", ("hdl/*",), ("mcf.sim",)),
    Rule("the ABI imports only the ABI (not mcf.golden, mcf.hdl, mcf.sim)", ("sw/abi/*",),
         ("mcf",), allow=("mcf.abi",)),
    Rule("only the cocotb benches import mcf.sim.benches", ("sw/*", "hdl/*", "sim/*"),
         ("mcf.sim.benches",), exclude=("sim/benches/*",)),
)

BOARD_RUNTIME = ("sw/driver/*", "sw/cluster/board*.py", "sw/deploy/*")
"""The modules a KR260 runs (PYNQ venv: no amaranth-boards, no simulation extras)."""
BOARD_BANNED = Rule("the board runtime imports no amaranth_boards", BOARD_RUNTIME,
                    ("amaranth_boards",))


def module_of(path: str) -> tuple[str, bool]:
    """``(module name, is a package)`` of a repo-relative ``.py`` path under a source root."""
    parts = Path(path).with_suffix("").parts
    root, rest = ROOTS[parts[0]], list(parts[1:])
    package = rest[-1] == "__init__"
    if package:
        rest.pop()
    return ".".join([root, *rest]), package


def _resolve(level: int, module: str | None, here: str, package: bool) -> str:
    if level == 0:
        return module or ""
    base = here.split(".") if package else here.split(".")[:-1]
    if level - 1 > len(base) - 1:
        raise ImportError(f"relative import beyond the top package in {here}")
    base = base[:len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _literal_prefix(node: ast.expr) -> str | None:
    """The module name an ``import_module`` argument names: a literal, or an f-string's literal
    start up to its last dot (``f"mcf.sim.perf.{n}"`` → ``mcf.sim.perf``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value.rpartition(".")[0] or None
    return None


def imports_in(source: str, module: str, package: bool = False) -> Iterator[Import]:
    """Every import in ``source`` (the text of module ``module``), at any depth."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(node.lineno, (alias.name,), f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.level, node.module, module, package)
            written = "." * node.level + (node.module or "")
            names = ", ".join(a.name for a in node.names)
            subs = tuple(f"{base}.{a.name}" for a in node.names if a.name != "*")
            yield Import(node.lineno, ((base,) if node.module else ()) + subs,
                         f"from {written} import {names}")
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__"):
                target = _literal_prefix(node.args[0])
                if target:
                    yield Import(node.lineno, (target,),
                                 f"{name}({ast.unparse(node.args[0])})")


def violations(rule: Rule, path: str, imports: Iterable[Import]) -> list[str]:
    """``file:line: import`` of every import in ``path`` that ``rule`` forbids."""
    if not rule.applies(path):
        return []
    return [imp.where(path) for imp in imports if rule.bans(imp)]


def check_source(rule: Rule, path: str, source: str) -> list[str]:
    module, package = module_of(path)
    return violations(rule, path, imports_in(source, module, package))


def source_files() -> dict[str, str]:
    """Repo-relative path → text of every ``.py`` under the source roots."""
    out = {}
    for root in ROOTS:
        for file in sorted((REPO / root).rglob("*.py")):
            out[file.relative_to(REPO).as_posix()] = file.read_text(encoding="utf-8")
    return out


@dataclass
class Graph:
    """The static import graph of the repository's modules."""
    path: dict[str, str]                  # module → file
    imports: dict[str, list[Import]]      # module → its imports

    @classmethod
    def of(cls, files: dict[str, str]) -> Graph:
        path, imports = {}, {}
        for file, source in files.items():
            module, package = module_of(file)
            path[module] = file
            imports[module] = list(imports_in(source, module, package))
        return cls(path, imports)

    def known(self, name: str) -> str | None:
        """The longest known module ``name`` is or is inside (``a.b.attr`` → ``a.b``)."""
        while name:
            if name in self.path:
                return name
            name = name.rpartition(".")[0]
        return None

    def edges(self, module: str) -> Iterator[tuple[str, Import]]:
        """Modules that importing ``module`` runs: its imports and their parent packages."""
        for imp in self.imports[module]:
            for name in imp.modules:
                target = self.known(name)
                while target:
                    yield target, imp
                    target = self.known(target.rpartition(".")[0])

    def reach(self, starts: Iterable[str]) -> dict[str, list[str]]:
        """Every module reachable from ``starts`` → the chain of ``file:line`` that reaches it."""
        chains: dict[str, list[str]] = {m: [] for m in starts}
        todo = list(chains)
        while todo:
            here = todo.pop()
            for there, imp in self.edges(here):
                if there not in chains:
                    chains[there] = [*chains[here], imp.where(self.path[here])]
                    todo.append(there)
        return chains


def board_runtime_violations(graph: Graph, rule: Rule = BOARD_BANNED) -> list[str]:
    """Imports of ``rule.banned`` in the board runtime or any module it reaches, each with the
    chain of imports from the runtime to it."""
    starts = [m for m, f in graph.path.items() if rule.applies(f)]
    out = []
    for module, chain in sorted(graph.reach(starts).items()):
        for imp in graph.imports[module]:
            if rule.bans(imp):
                via = "".join(f"\n    via {step}" for step in chain)
                out.append(imp.where(graph.path[module]) + via)
    return out


@pytest.fixture(scope="module")
def graph() -> Graph:
    return Graph.of(source_files())


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_layering(rule, graph):
    found = [v for module, path in graph.path.items()
             for v in violations(rule, path, graph.imports[module])]
    assert not found, f"{rule.name}:\n" + "\n".join(found)


GOLDEN_IN_ABI = "sw/abi/*"


def golden_models_in(path: str, source: str) -> list[str]:
    """``file:line: class Name`` of every class (at any depth) named ``*Model`` in ``source`` —
    a golden model, which belongs in ``sw/golden/``, not in the ABI — if ``path`` is under
    ``sw/abi/``."""
    if not fnmatch(path, GOLDEN_IN_ABI):
        return []
    return [f"{path}:{node.lineno}: class {node.name}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ClassDef) and node.name.endswith("Model")]


def test_the_abi_defines_no_golden_model():
    found = [v for path, source in source_files().items() for v in golden_models_in(path, source)]
    assert not found, "golden models belong in sw/golden/, not sw/abi/:\n" + "\n".join(found)


def test_golden_model_check_flags_a_model_class():
    source = "class LandingConfig:\n    pass\n\n\ndef f():\n    class SendModel:\n        pass\n"
    assert golden_models_in("sw/abi/send.py", source) == ["sw/abi/send.py:6: class SendModel"]
    assert golden_models_in("sw/golden/send.py", source) == []


GOLDEN_HOME = "sw/golden/*"


def goldens_outside_home(path: str, source: str) -> list[str]:
    """``file:line: class Name`` / ``file:line: def name`` of every golden model in ``source``
    (at any depth: a class whose name contains ``Golden``, a function named ``golden_*``) if
    ``path`` is under ``sw/`` but not ``sw/golden/``."""
    if not fnmatch(path, "sw/*") or fnmatch(path, GOLDEN_HOME):
        return []
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and "Golden" in node.name:
            out.append(f"{path}:{node.lineno}: class {node.name}")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and \
                node.name.startswith("golden_"):
            out.append(f"{path}:{node.lineno}: def {node.name}")
    return out


def test_every_golden_model_lives_in_sw_golden():
    found = [v for path, source in source_files().items()
             for v in goldens_outside_home(path, source)]
    assert not found, "golden models belong in sw/golden/:\n" + "\n".join(found)


def test_golden_home_check_flags_a_golden_elsewhere():
    source = ("class StepGolden:\n    pass\n\n\ndef images():\n    def golden_step():\n"
              "        pass\n")
    assert goldens_outside_home("sw/node/tp.py", source) == [
        "sw/node/tp.py:1: class StepGolden", "sw/node/tp.py:6: def golden_step"]
    assert goldens_outside_home("sw/golden/node_tp.py", source) == []
    assert goldens_outside_home("sim/benches/node_tp.py", source) == []


def import_cycles(graph: Graph, prefix: str, ignore: tuple[str, ...] = ()) -> list[list[str]]:
    """The import cycles (strongly connected components of more than one module of the static
    import graph, :meth:`Graph.edges`, without the edges into ``ignore``) that hold a module
    under ``prefix``, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph.path):
        if start in index:
            continue
        work = [(start, iter(sorted({t for t, _ in graph.edges(start)} - set(ignore))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted({t for t, _ in graph.edges(w)} - set(ignore)))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 and any(_under(m, (prefix,)) for m in comp):
                    found.append(sorted(comp))
    return found


def test_golden_models_are_on_no_import_cycle(graph):
    found = import_cycles(graph, "mcf.golden")
    assert not found, "import cycles through sw/golden/:\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_the_abi_is_on_no_import_cycle(graph):
    """``mcf.abi`` is the contract every layer imports: none of its modules is on an import
    cycle among its modules (issue #37: the csrmap circle and the ``kv`` / ``kv_channel``
    re-export are gone). The package's ``__init__``, which gathers the modules' names, is left
    out: every module runs it first, and it imports only them."""
    found = import_cycles(graph, "mcf.abi", ignore=("mcf.abi",))
    assert not found, "import cycles through sw/abi/:\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_cycle_check_flags_a_golden_cycle():
    files = {
        "sw/__init__.py": "",
        "sw/golden/__init__.py": "",
        "sw/golden/a.py": "from ..node.b import x\n",
        "sw/node/__init__.py": "",
        "sw/node/b.py": "def f():\n    from ..golden.a import y\n",
        "sw/node/c.py": "from .d import z\n",
        "sw/node/d.py": "from .c import w\n",
    }
    assert import_cycles(Graph.of(files), "mcf.golden") == [["mcf.golden.a", "mcf.node.b"]]
    assert import_cycles(Graph.of(files), "mcf.node") == [
        ["mcf.golden.a", "mcf.node.b"], ["mcf.node.c", "mcf.node.d"]]
    files["sw/node/b.py"] = "from ..abi import y\n"
    assert import_cycles(Graph.of(files), "mcf.golden") == []


def test_board_runtime_has_no_amaranth_boards(graph):
    starts = [f for f in graph.path.values() if BOARD_BANNED.applies(f)]
    assert any(f.startswith("sw/driver/") for f in starts) and "sw/cluster/board.py" in starts
    found = board_runtime_violations(graph)
    assert not found, f"{BOARD_BANNED.name}:\n" + "\n".join(found)


def test_every_module_parses_and_resolves(graph):
    """The checker sees every file, and every relative import stays inside ``mcf``."""
    files = set(graph.path.values())
    assert len(files) > 200 and {"sw/abi/regs.py", "hdl/csr/bank.py", "sim/toolchain.py"} <= files
    for module, imports in graph.imports.items():
        for imp in imports:
            if imp.text.startswith("from ."):
                assert all(m.startswith("mcf.") for m in imp.modules), imp.where(
                    graph.path[module])


# --- the checker itself: each rule fails on a banned import -------------------------------

BANNED = textwrap.dedent("""\
    from __future__ import annotations
    import numpy as np
    from ..abi.regs import WORD_BYTES

    def later():
        if True:
            from ..hdl.csr.bank import bank_registers
        return bank_registers
    """)


def test_checker_flags_an_import_inside_a_function():
    rule = RULES[1]
    found = check_source(rule, "sw/golden/new.py", BANNED)
    assert found == ["sw/golden/new.py:7: from ..hdl.csr.bank import bank_registers"]
    assert check_source(rule, "sw/golden/new.py", BANNED.replace("..hdl.csr.bank", "..abi.regs")) \
        == []
    assert check_source(rule, "sw/mars/new.py", BANNED) == []   # the rule's scope


@pytest.mark.parametrize("path, source, rule, line", [
    ("sw/mars/x.py", "import mcf.sim.benches.grid\n", 0, 1),
    ("sw/node/x.py", "\n\nfrom mcf import sim\n", 0, 3),
    ("sw/sysmodel/x.py", "from ..sim.benches.node_jobs import tiny_plan\n", 0, 1),
    ("sw/x.py", "import importlib\nm = importlib.import_module(f'mcf.sim.perf.{n}')\n", 0, 2),
    ("sw/abi/x.py", "def f():\n    from mcf.hdl.nic import link\n", 3, 2),
    ("sw/golden/x.py", "def f():\n    import mcf.sim.ddr\n", 1, 2),
    ("sw/golden/x.py", "from ..sim.benches.node_jobs import tiny_plan\n", 1, 1),
    ("sw/abi/x.py", "def f():\n    from ..sim import toolchain\n", 3, 2),
    ("sw/abi/x.py", "from ..golden.landing import LandingModel\n", 3, 1),
    ("sw/golden/sub/__init__.py", "from ...hdl import csr\n", 1, 1),
    ("hdl/eth/x.py", "try:\n    pass\nexcept ImportError:\n    from ...sim.benches import ddr\n",
     2, 4),
    ("sw/abi/x.py", "def model():\n    from mcf.golden.attention import attend_max\n", 3, 2),
    ("sw/abi/x.py", "from .. import golden\n", 3, 1),
    ("sw/abi/x.py", "from mcf import abi, mars\n", 3, 1),
])
def test_checker_flags(path, source, rule, line):
    found = check_source(RULES[rule], path, source)
    assert len(found) == 1 and found[0].startswith(f"{path}:{line}: "), found


@pytest.mark.parametrize("path, source", [
    ("sw/commands/bench.py", "from mcf.sim.perf import packet\n"),   # the CLI may
    ("sw/cli.py", "import mcf.sim\n"),
    ("sw/mars/x.py", "import mcf.simulate\nfrom mcf.abi import sim\n"),  # names, not mcf.sim
    ("sw/golden/x.py", "from ..abi.regs import bank_registers\n"),
    ("sw/abi/x.py", "from .regs import Access\nfrom .. import abi\nimport mcf.abi.kv\n"),
    ("sim/board/x.py", "from ..ddr import ddr_ram\nimport mcf.hdl\n"),
])
def test_checker_allows(path, source):
    assert [v for r in RULES for v in check_source(r, path, source)] == []


def test_only_the_benches_import_the_benches():
    rule = RULES[-1]
    flagged = {   # file → (source, the line flagged)
        "sim/ddr.py": ("from .benches.pauses import pattern\n", 1),
        "sim/perf/nic.py": ("\nfrom mcf.sim.benches.nic_amsim import drive\n", 2),
        "sim/board/x.py": ("def f():\n    from ..benches import ddr\n", 2),
        "hdl/nic/x.py": ("import mcf.sim.benches.nic_link\n", 1),
        "sim/x.py": ("import importlib\nm = importlib.import_module(f'mcf.sim.benches.{n}')", 2),
    }
    for path, (source, line) in flagged.items():
        found = check_source(rule, path, source)
        assert len(found) == 1 and found[0].startswith(f"{path}:{line}: "), found
    allowed = {   # a bench imports benches; outside, the helpers' modules and a bench's name
        "sim/benches/x.py": "from .eth_common import LOCAL\nfrom mcf.sim.benches import grid\n",
        "sim/perf/x.py": "from mcf.sim.tb import MAPS\nfrom mcf.sim.amsim import send\n",
        "sim/x.py": "run(built, 'mcf.sim.benches.eth_mac', testcase='rate')\n",
    }
    for path, source in allowed.items():
        assert check_source(rule, path, source) == [], path


def test_relative_imports_resolve():
    assert module_of("sw/driver/ip.py") == ("mcf.driver.ip", False)
    assert module_of("hdl/nic/__init__.py") == ("mcf.hdl.nic", True)
    [imp] = imports_in("from ..hdl.platform.kr260 import X\n", "mcf.driver.ip")
    assert imp.modules == ("mcf.hdl.platform.kr260", "mcf.hdl.platform.kr260.X")
    [imp] = imports_in("from . import link, crc\n", "mcf.hdl.nic", package=True)
    assert imp.modules == ("mcf.hdl.nic.link", "mcf.hdl.nic.crc")
    with pytest.raises(ImportError):
        list(imports_in("from .... import x\n", "mcf.a.b"))


def test_board_runtime_check_follows_imports():
    files = {
        "sw/__init__.py": "",
        "sw/driver/__init__.py": "",
        "sw/driver/ip.py": "def f():\n    from ..hdl.platform.kr260 import MODULE_REF_VLNV\n",
        "sw/abi/__init__.py": "",
        "sw/abi/platform.py": "MODULE_REF_VLNV = 'x'\n",
        "hdl/__init__.py": "",
        "hdl/platform/__init__.py": "",
        "hdl/platform/kr260.py": "from amaranth_boards.resources import LEDResources\n",
    }
    found = board_runtime_violations(Graph.of(files))
    assert len(found) == 1
    assert found[0].startswith("hdl/platform/kr260.py:1: from amaranth_boards.resources")
    assert "via sw/driver/ip.py:2: from ..hdl.platform.kr260 import MODULE_REF_VLNV" in found[0]
    files["sw/driver/ip.py"] = "from ..abi.platform import MODULE_REF_VLNV\n"
    assert board_runtime_violations(Graph.of(files)) == []
    files["sw/cluster/board_rank.py"] = "import amaranth_boards\n"
    assert board_runtime_violations(Graph.of(files)) == [
        "sw/cluster/board_rank.py:1: import amaranth_boards"]
