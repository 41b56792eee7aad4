"""What ``mcf deploy`` checks and runs on a board, as plain data and pure functions (no SSH here).

* :data:`BOARD_PYTHON` — the board runtime's Python series, the one version rule.
* :func:`board_pynq_requirement` — the PYNQ rule, read from the runtime wheel's own metadata (the
  ``board`` extra of ``pyproject.toml``), never typed here.
* :class:`HostSpec` — one ``[user@]host[:port]`` of ``--hosts``.
* :class:`OverlayFiles` — the ``<name>.bit`` + ``<name>.hwh`` pair ``mcf build`` writes.
* :func:`remote_commands` — every command a host runs, as argument lists (the SSH layer quotes
  them with :func:`shlex.join`; no shell string is ever assembled by hand).
* :data:`PROBE` — the Python snippet run on the board after the install: it loads the overlay
  with ``pynq.Overlay`` and reads the node's ``ID`` and ``CAPS`` registers at the offsets of
  :func:`mcf.abi.csrmap.node_regmap` — it imports the *installed* ``mcf``, so no offset or value
  is typed anywhere; :func:`evaluate_probe` turns its JSON line into a verdict.
* :class:`HostResult` — one row of the report.
"""

from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:     # packaging comes with the deploy extra; the board runtime imports this too
    from packaging.requirements import Requirement
    from packaging.version import Version

__all__ = ["BOARD_PYTHON", "BOARD_EXTRA", "PROBE", "DeployError", "HostSpec", "OverlayFiles",
           "RemoteCommands", "HostResult", "parse_hosts", "parse_python_version",
           "check_python", "wheel_metadata", "board_pynq_requirement", "check_pynq",
           "remote_commands", "evaluate_probe", "ProbeResult"]

BOARD_PYTHON = (3, 10)
"""The Python series (major, minor) of the KR260's PYNQ virtualenv (Kria-PYNQ on Ubuntu 22.04,
platform.md): a board whose ``python3 --version`` is not ``3.10.x`` is refused before anything is
copied. CI checks the runtime itself on this series (``scripts/check_board_runtime.py``)."""

BOARD_EXTRA = "board"
"""The ``pyproject.toml`` extra whose ``pynq`` requirement is the board's PYNQ rule."""


class DeployError(Exception):
    """One host's deploy stopped: ``str(exc)`` is the one line the report prints."""


@dataclass(frozen=True)
class HostSpec:
    """One board: ``host`` (name or address), ``port`` (None: ``--port`` or SSH's default),
    ``user`` (None: ``--user`` or SSH's default). ``text`` is how the user wrote it."""
    text: str
    host: str
    port: int | None = None
    user: str | None = None


_HOST = re.compile(r"^(?:(?P<user>[^@\s:/]+)@)?"
                   r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[^@\s:/\[\]]+))"
                   r"(?::(?P<port>\d+))?$")


def parse_hosts(text: str) -> list[HostSpec]:
    """``h0,user@h1,h2:2222,[::1]:22`` → host specs. Raises :class:`ValueError` on an empty
    list, a malformed entry, a port outside 1..65535 or a host named twice."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise ValueError(f"--hosts {text!r}: expected a comma-separated list of [user@]host[:port]")
    out: list[HostSpec] = []
    seen: set[tuple[str, int | None]] = set()
    for item in items:
        m = _HOST.match(item)
        if m is None:
            raise ValueError(f"--hosts: {item!r} is not [user@]host[:port]")
        port = int(m["port"]) if m["port"] is not None else None
        if port is not None and not 1 <= port <= 65535:
            raise ValueError(f"--hosts: {item!r}: port {port} outside 1..65535")
        spec = HostSpec(item, m["v6"] or m["name"], port, m["user"])
        if (spec.host, spec.port) in seen:
            raise ValueError(f"--hosts: {item!r} is named twice")
        seen.add((spec.host, spec.port))
        out.append(spec)
    return out


@dataclass(frozen=True)
class OverlayFiles:
    """The overlay ``mcf build --board kr260`` leaves in its output folder: ``<name>.bit`` and
    ``<name>.hwh`` side by side (PYNQ finds the ``.hwh`` by swapping the extension)."""
    bit: Path
    hwh: Path

    @property
    def name(self) -> str:
        return self.bit.stem

    @classmethod
    def find(cls, path: str | Path) -> OverlayFiles:
        """``path`` is the ``.bit``, the common stem (``build/kr260/mcf_node``) or a folder
        holding exactly one ``.bit``. Raises :class:`ValueError` when the pair is incomplete."""
        p = Path(path)
        if p.is_dir():
            bits = sorted(p.glob("*.bit"))
            if len(bits) != 1:
                raise ValueError(f"--overlay {path}: expected one .bit in the folder, found "
                                 f"{len(bits)}" + (f" ({', '.join(b.name for b in bits)})"
                                                   if bits else "; run mcf build and Vivado"))
            bit = bits[0]
        elif p.suffix in (".bit", ".hwh"):
            bit = p.with_suffix(".bit")
        else:
            bit = p.with_name(p.name + ".bit")
        hwh = bit.with_suffix(".hwh")
        for f in (bit, hwh):
            if not f.is_file():
                raise ValueError(f"--overlay {path}: {f} not found (mcf build writes "
                                 "<name>.bit and <name>.hwh side by side)")
        return cls(bit, hwh)


def parse_python_version(text: str) -> Version:
    """``Python 3.10.12`` (what ``python3 --version`` prints) → a version."""
    from packaging.version import InvalidVersion, Version
    m = re.search(r"Python\s+(\S+)", text)
    try:
        return Version(m[1]) if m else Version("")
    except InvalidVersion:
        raise DeployError(f"python3 --version printed {text.strip()!r}, not a version") from None


def check_python(text: str, series: tuple[int, int] = BOARD_PYTHON) -> Version:
    """The board's Python version, or :class:`DeployError` unless it is ``series``."""
    v = parse_python_version(text)
    if (v.major, v.minor) != series:
        want = ".".join(map(str, series))
        raise DeployError(f"Python {v} on the board; the board runtime needs Python {want}.x "
                          "(the KR260 PYNQ image's)")
    return v


def wheel_metadata(wheel: Path):
    """The ``METADATA`` headers of a wheel (an :class:`email.message.Message`)."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise ValueError(f"{wheel}: not a wheel (no single .dist-info/METADATA)")
        return HeaderParser().parsestr(zf.read(names[0]).decode("utf-8"))


def board_pynq_requirement(wheel: Path) -> Requirement:
    """The ``pynq`` requirement of the wheel's :data:`BOARD_EXTRA` extra."""
    from packaging.requirements import Requirement
    for text in wheel_metadata(wheel).get_all("Requires-Dist") or []:
        req = Requirement(text)
        if req.name.lower() == "pynq" and req.marker is not None and \
                req.marker.evaluate({"extra": BOARD_EXTRA}):
            return req
    raise ValueError(f"{wheel.name} declares no pynq requirement in its {BOARD_EXTRA!r} extra")


def check_pynq(text: str, req: Requirement) -> Version:
    """The board's PYNQ version (what ``print(pynq.__version__)`` printed), or
    :class:`DeployError` unless ``req`` admits it."""
    from packaging.version import InvalidVersion, Version
    line = text.strip().splitlines()[-1] if text.strip() else ""
    try:
        v = Version(line)
    except InvalidVersion:
        raise DeployError(f"pynq.__version__ is {line!r}, not a version") from None
    if not req.specifier.contains(v, prereleases=True):
        raise DeployError(f"PYNQ {v} on the board; the runtime needs pynq{req.specifier} "
                          f"(pyproject's {BOARD_EXTRA!r} extra)")
    return v


# The snippet runs on the board as ``python3 -c PROBE <remote .bit>``; it must run on Python 3.10
# with only the installed mcf and PYNQ. It prints one JSON line.
PROBE = """\
import json, sys
from mcf.abi.csrmap import node_regmap
from mcf.abi.node_config import NODE_CONFIGS
from pynq import Overlay
rm = node_regmap()
tops = {c.top: c for c in NODE_CONFIGS.values()}
ol = Overlay(sys.argv[1])
nodes = sorted(n for n, d in ol.ip_dict.items()
               if str(d.get("type", "")).split(":")[2:3] and d["type"].split(":")[2] in tops)
out = {"ips": sorted(ol.ip_dict), "nodes": nodes}
if len(nodes) == 1:
    name = nodes[0]
    top = ol.ip_dict[name]["type"].split(":")[2]
    ip = getattr(ol, name)
    idw, caps = ip.read(rm.addr("ID")), ip.read(rm.addr("CAPS"))
    out.update(ip=name, top=top, phys_addr=ol.ip_dict[name]["phys_addr"], id=idw, caps=caps,
               id_fields=rm.register("ID").unpack(idw), want_id=rm.id_word,
               want_caps=tops[top].caps())
print(json.dumps(out))
"""


@dataclass(frozen=True)
class ProbeResult:
    """What :data:`PROBE` read: the node IP's name, its top, the ``ID`` word and its fields."""
    ip: str
    top: str
    phys_addr: int
    id_word: int
    id_fields: dict
    caps: int

    @property
    def node_id(self) -> str:
        fields = " ".join(f"{k} {v:#x}" for k, v in self.id_fields.items())
        return f"{self.id_word:#010x} ({fields})"


def evaluate_probe(stdout: str) -> ProbeResult:
    """The last stdout line of :data:`PROBE` → the result, or :class:`DeployError` when the
    overlay holds no (or several) node IPs, or ``ID``/``CAPS`` differ from the installed ABI."""
    lines = stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise DeployError(f"the overlay probe printed no result: {stdout.strip()[-200:]!r}") \
            from None
    nodes = out.get("nodes", [])
    if len(nodes) != 1:
        raise DeployError(f"the overlay has {len(nodes)} node IPs ({', '.join(nodes) or 'none'}) "
                          f"among {', '.join(out.get('ips', [])) or 'no IPs'}")
    res = ProbeResult(out["ip"], out["top"], out["phys_addr"], out["id"], out["id_fields"],
                      out["caps"])
    if out["id"] != out["want_id"]:
        raise DeployError(f"node ID reads {out['id']:#010x}, the installed mcf expects "
                          f"{out['want_id']:#010x}: the bitstream and the runtime do not match")
    if out["caps"] != out["want_caps"]:
        raise DeployError(f"node CAPS reads {out['caps']:#010x}, the {res.top} configuration "
                          f"has {out['want_caps']:#010x}: the bitstream and the runtime differ")
    return res


@dataclass(frozen=True)
class RemoteCommands:
    """Each step's argument list (``python`` is the board's interpreter, ``--python``)."""
    python_version: list[str]
    pynq_version: list[str]
    install: list[str]          # the wheel and whatever of its dependencies is missing
    reinstall: list[str]        # this build's files even when the same version is installed
    probe: list[str]


def remote_commands(python: str, wheel: str, bit: str) -> RemoteCommands:
    """The commands one host runs, for remote paths ``wheel`` and ``bit``."""
    pip = [python, "-m", "pip", "install", "--no-input", "--disable-pip-version-check"]
    return RemoteCommands(
        python_version=[python, "--version"],
        pynq_version=[python, "-c", "import pynq; print(pynq.__version__)"],
        install=[*pip, wheel],
        reinstall=[*pip, "--force-reinstall", "--no-deps", wheel],
        probe=[python, "-c", PROBE, bit],
    )


@dataclass
class HostResult:
    """One row of the report; fields stay empty past the step that failed. ``error`` is the one
    line that says why (empty when the host deployed)."""
    host: str
    python: str = ""
    pynq: str = ""
    overlay: str = ""
    node_id: str = ""
    steps: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def status(self) -> str:
        return "ok" if self.ok else f"failed: {self.error}"
