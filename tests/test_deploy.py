"""``mcf deploy`` against SSH servers started here on 127.0.0.1 (issue #12 item 5, Tests).

Each test "board" is an asyncssh server (its own host key, its own authorised client key, its
own port) over a folder that is a real Python virtualenv: ``bin/`` is the board's ``PATH``,
``home/`` the SSH user's home. What the client asks runs for real: the server splits the command
the client sent (``shlex.split``, as a login shell would), looks the program up in ``bin/`` and
runs it in ``home/`` with a clean environment; SFTP serves the real filesystem with relative
paths taken from ``home/``. The boards' interpreters are real CPython 3.10 (the KR260 image's
series) and 3.8 venvs (pyenv); their pip is the interpreter's own bundled pip with the runtime's
dependencies pre-installed for 3.10 (a provisioned board) and no index (``PIP_NO_INDEX``), so
the wheel's install and the dependency check are pip's own, offline.

The one stand-in is ``pynq`` on the server side: no FPGA here. Its ``Overlay`` reads the copied
``.hwh`` (IP types and addresses, as PYNQ does), "programs" by copying the copied ``.bit`` to
``fpga/loaded.bit``, and answers register reads from that bitstream, which in these tests is a
JSON register image built from the ABI. Everything the deploy does — versions, copy, install,
overlay load, ID read through the installed ``mcf`` — goes through the SSH protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import io
import json
import os
import posixpath
import shlex
import shutil
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

asyncssh = pytest.importorskip("asyncssh")

from mcf.abi.csrmap import node_regmap  # noqa: E402
from mcf.abi.node_config import NODE_CONFIGS  # noqa: E402
from mcf.cli import main  # noqa: E402
from mcf.deploy import (  # noqa: E402
    BOARD_PYTHON,
    PROBE,
    DeployConfig,
    DeployError,
    OverlayFiles,
    board_pynq_requirement,
    check_pynq,
    check_python,
    deploy,
    evaluate_probe,
    parse_hosts,
    remote_commands,
)
from mcf.deploy.runtime import build_wheel, source_root  # noqa: E402
from mcf.deploy.spec import wheel_metadata  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "build" / "deploy-test"
TOP = "mcf_node"
CTRL_BASE = 0xA000_0000   # where the synthetic .hwh puts the node (M_AXI_HPM0_FPD's window)


# ------------------------------------------------------------------------------------------------
# Interpreters, the runtime wheel, the provisioned board site
# ------------------------------------------------------------------------------------------------

def find_python(series: tuple[int, int]) -> str | None:
    """A CPython of ``series`` on this machine (PATH or pyenv), or None."""
    name = f"python{series[0]}.{series[1]}"
    cands = [shutil.which(name)] + sorted(
        str(p) for p in Path.home().glob(f".pyenv/versions/{series[0]}.{series[1]}.*/bin/{name}"))
    for c in filter(None, cands):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([c, "-c", "import sys; print(sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30)
            if out.returncode == 0 and out.stdout.strip() == str(series):
                return c
    return None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    root = source_root()
    assert root == ROOT
    return build_wheel(root, tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def py310() -> str:
    py = find_python(BOARD_PYTHON)
    if py is None:
        pytest.skip(f"no Python {BOARD_PYTHON[0]}.{BOARD_PYTHON[1]} here for the test board")
    return py


@pytest.fixture(scope="module")
def py38() -> str:
    py = find_python((3, 8))
    if py is None:
        pytest.skip("no Python 3.8 here for the old-Python board")
    return py


@pytest.fixture(scope="module")
def board_site(wheel, py310) -> Path:
    """site-packages of a provisioned board: the wheel's runtime dependencies for 3.10 and the
    interpreter's bundled pip, installed once with ``pip install --target`` and kept in
    ``build/deploy-test`` (keyed by the requirements)."""
    from packaging.requirements import Requirement

    reqs = sorted(r for r in wheel_metadata(wheel).get_all("Requires-Dist")
                  if Requirement(r).marker is None)
    bundled = subprocess.run(
        [py310, "-c", "import ensurepip, glob, os; print(glob.glob(os.path.join("
         "os.path.dirname(ensurepip.__file__), '_bundled', 'pip-*.whl'))[0])"],
        capture_output=True, text=True, check=True).stdout.strip()
    key = hashlib.sha256("\n".join([*reqs, Path(bundled).name]).encode()).hexdigest()[:12]
    site = CACHE / f"board-site-{key}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not site.is_dir():
            tmp = CACHE / f".tmp-{key}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target",
                            str(tmp), "--python-version", "{}.{}".format(*BOARD_PYTHON),
                            "--implementation", "cp", "--only-binary=:all:",
                            "--disable-pip-version-check", *reqs, bundled],
                           check=True, timeout=600)
            tmp.rename(site)
    return site


# ------------------------------------------------------------------------------------------------
# The overlay: a synthetic .hwh (Vivado's structure) and a register-image "bitstream"
# ------------------------------------------------------------------------------------------------

def write_overlay(folder: Path, id_word: int | None = None) -> OverlayFiles:
    from mcf.abi.platform import MODULE_REF_VLNV

    rm = node_regmap()
    cfg = next(c for c in NODE_CONFIGS.values() if c.top == TOP)
    folder.mkdir(parents=True, exist_ok=True)
    hwh = folder / f"{TOP}.hwh"
    hwh.write_text(f"""<?xml version="1.0" encoding="UTF-8" standalone="no" ?>
<EDKSYSTEM EDWVERSION="1.2" VIVADOVERSION="2023.2">
  <MODULES>
    <MODULE FULLNAME="/ps" INSTANCE="ps" MODTYPE="zynq_ultra_ps_e"
            VLNV="xilinx.com:ip:zynq_ultra_ps_e:3.5">
      <MEMORYMAP>
        <MEMRANGE BASEVALUE="{CTRL_BASE:#x}" HIGHVALUE="{CTRL_BASE + rm.size - 1:#x}"
                  INSTANCE="node" MASTERBUSINTERFACE="M_AXI_HPM0_FPD" MEMTYPE="REGISTER"
                  SLAVEBUSINTERFACE="s_axi_ctrl"/>
      </MEMORYMAP>
    </MODULE>
    <MODULE FULLNAME="/node" INSTANCE="node" MODTYPE="{TOP}"
            VLNV="{MODULE_REF_VLNV.format(name=TOP)}"/>
  </MODULES>
</EDKSYSTEM>
""")
    image = {hex(CTRL_BASE + rm.addr("ID")): rm.id_word if id_word is None else id_word,
             hex(CTRL_BASE + rm.addr("CAPS")): cfg.caps()}
    (folder / f"{TOP}.bit").write_text(json.dumps(image))
    return OverlayFiles.find(folder / TOP)


FAKE_PYNQ = '''\
"""Server-side stand-in for PYNQ on a test board of tests/test_deploy.py (no FPGA here)."""
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

__version__ = "{version}"
_FPGA = Path(__file__).resolve().parents[2] / "fpga"


class _IP:
    def __init__(self, mem, desc):
        self._mem, self._desc = mem, desc

    def read(self, offset=0):
        if offset % 4 or not 0 <= offset < self._desc["addr_range"]:
            raise ValueError("offset %#x outside the IP" % offset)
        return self._mem.get(self._desc["phys_addr"] + offset, 0)


class Overlay:
    def __init__(self, bitfile, download=True):
        bit = Path(bitfile).resolve()
        hwh = bit.with_suffix(".hwh")
        if not bit.is_file():
            raise OSError("Bitstream file %s does not exist." % bitfile)
        if not hwh.is_file():
            raise ValueError("Cannot find metadata file %s" % hwh)
        root = ET.parse(hwh).getroot()
        vlnv = {{m.get("INSTANCE"): m.get("VLNV") for m in root.iter("MODULE")}}
        self.ip_dict = {{}}
        for r in root.iter("MEMRANGE"):
            name = r.get("INSTANCE")
            if r.get("MEMTYPE") == "REGISTER" and name in vlnv:
                base, high = int(r.get("BASEVALUE"), 0), int(r.get("HIGHVALUE"), 0)
                self.ip_dict[name] = {{"type": vlnv[name], "phys_addr": base,
                                      "addr_range": high - base + 1, "fullpath": name}}
        if download:
            _FPGA.mkdir(exist_ok=True)
            shutil.copyfile(bit, _FPGA / "loaded.bit")
        image = json.loads((_FPGA / "loaded.bit").read_text())
        self._mem = {{int(k, 0): v for k, v in image.items()}}

    def __getattr__(self, name):
        ips = self.__dict__.get("ip_dict", {{}})
        if name in ips:
            return _IP(self.__dict__["_mem"], ips[name])
        raise AttributeError(name)
'''


# ------------------------------------------------------------------------------------------------
# The boards and their SSH servers
# ------------------------------------------------------------------------------------------------

@dataclass
class Board:
    """One test board: ``root`` is a virtualenv (or an empty folder for a board never reached)
    with ``home/``; ``authorized`` the public key its server accepts; ``port`` once started."""
    root: Path
    host_key: object
    authorized: str
    port: int = 0
    interactive: bool = False     # stream stdin/stdout line by line (the link check's protocol)

    @property
    def home(self) -> Path:
        return self.root / "home"


def make_board(root: Path, authorized: str, python: str | None = None, pynq: str = "",
               site: Path | None = None) -> Board:
    (root / "home").mkdir(parents=True)
    if python is not None:
        subprocess.run([python, "-m", "venv", "--without-pip", str(root)], check=True)
        purelib = subprocess.run([str(root / "bin" / "python"), "-c",
                                  "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        (root / "pynq-lib" / "pynq").mkdir(parents=True)
        (root / "pynq-lib" / "pynq" / "__init__.py").write_text(FAKE_PYNQ.format(version=pynq))
        (Path(purelib) / "board.pth").write_text(
            "".join(f"{p}\n" for p in (site, root / "pynq-lib") if p is not None))
    return Board(root, asyncssh.generate_private_key("ssh-ed25519"), authorized)


class HomeSFTP(asyncssh.SFTPServer):
    """SFTP on the real filesystem, relative paths from the board's home (like sshd's)."""

    def __init__(self, chan, home: Path):
        super().__init__(chan)
        self._home = os.fsencode(home)

    def map_path(self, path: bytes) -> bytes:
        return path if path.startswith(b"/") else posixpath.join(self._home, path)


class Servers:
    """An event loop in a thread serving every board until ``close``."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servers = []
        self.procs = []         # every program a board ran, killed at close if still running

    def call(self, coro, timeout=60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self, board: Board) -> int:
        async def listen():
            async def run(process):
                await self._execute(board, process)

            server = await asyncssh.listen(
                "127.0.0.1", 0, server_host_keys=[board.host_key],
                authorized_client_keys=asyncssh.import_authorized_keys(board.authorized),
                process_factory=run, sftp_factory=lambda chan: HomeSFTP(chan, board.home),
                encoding="utf-8")
            self.servers.append(server)
            return server.sockets[0].getsockname()[1]
        board.port = self.call(listen())
        return board.port

    async def _execute(self, board: Board, process) -> None:
        argv = shlex.split(process.command or "")
        exe = shutil.which(argv[0], path=str(board.root / "bin")) if argv else None
        if exe is None:
            process.stderr.write(f"sh: 1: {argv[0] if argv else ''}: not found\n")
            process.exit(127)
            return
        env = {"PATH": str(board.root / "bin"), "HOME": str(board.home), "LANG": "C.UTF-8",
               "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PYTHONNOUSERSITE": "1"}
        if board.interactive:
            await self._stream(exe, argv, board, env, process)
            return
        proc = await asyncio.create_subprocess_exec(
            exe, *argv[1:], cwd=board.home, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        self.procs.append(proc)
        out, err = await proc.communicate()
        with contextlib.suppress(OSError, asyncssh.Error):   # the client may have gone
            process.stdout.write(out.decode(errors="replace"))
            process.stderr.write(err.decode(errors="replace"))
            process.exit(proc.returncode if proc.returncode >= 0 else 255)

    async def _stream(self, exe, argv, board: Board, env, process) -> None:
        """Run the program with the SSH channel's stdin forwarded to it and its stdout
        forwarded line by line as it comes (an interactive remote process)."""
        proc = await asyncio.create_subprocess_exec(
            exe, *argv[1:], cwd=board.home, env=env, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        self.procs.append(proc)

        async def feed():
            with contextlib.suppress(Exception):
                while line := await process.stdin.readline():
                    proc.stdin.write(line.encode())
                    await proc.stdin.drain()

        feeder = asyncio.ensure_future(feed())
        while line := await proc.stdout.readline():
            with contextlib.suppress(OSError, asyncssh.Error):
                process.stdout.write(line.decode(errors="replace"))
        err = await proc.stderr.read()
        await proc.wait()
        feeder.cancel()
        with contextlib.suppress(OSError, asyncssh.Error):
            process.stderr.write(err.decode(errors="replace"))
            process.exit(proc.returncode if proc.returncode >= 0 else 255)

    def close(self):
        async def stop():
            for proc in self.procs:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            for s in self.servers:
                s.close()
                await s.wait_closed()
        self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def servers():
    s = Servers()
    yield s
    s.close()


@pytest.fixture
def client_key(tmp_path, monkeypatch):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)     # only the key under test is offered
    key = asyncssh.generate_private_key("ssh-ed25519")
    path = tmp_path / "id_ed25519"
    key.write_private_key(str(path))
    path.chmod(0o600)
    return path, key.export_public_key().decode()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------------
# The deploy, end to end through `mcf deploy`
# ------------------------------------------------------------------------------------------------

def test_deploy_hosts_fail_alone(tmp_path, servers, client_key, wheel, board_site, py310, py38,
                                 capsys):
    key_path, key_pub = client_key
    other_pub = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    req = board_pynq_requirement(wheel)
    boards = {
        "good": make_board(tmp_path / "good", key_pub, py310, "3.0.1", board_site),
        "badkey": make_board(tmp_path / "badkey", other_pub),
        "py38": make_board(tmp_path / "py38", key_pub, py38, "3.0.1"),
        "oldpynq": make_board(tmp_path / "oldpynq", key_pub, py310, "2.7.0", board_site),
        "stranger": make_board(tmp_path / "stranger", key_pub),
    }
    assert not req.specifier.contains("2.7.0") and req.specifier.contains("3.0.1")
    for b in boards.values():
        servers.start(b)
    known = tmp_path / "known_hosts"
    known.write_text("".join(
        f"[127.0.0.1]:{b.port} {b.host_key.export_public_key().decode()}"
        for name, b in boards.items() if name != "stranger"))
    dead = closed_port()
    hosts = {name: f"127.0.0.1:{b.port}" for name, b in boards.items()}
    hosts["dead"] = f"127.0.0.1:{dead}"
    overlay = write_overlay(tmp_path / "build" / "kr260")

    rc = main(["deploy", "--hosts", ",".join(hosts.values()), "--overlay",
               str(tmp_path / "build" / "kr260" / TOP), "--key", str(key_path),
               "--known-hosts", str(known), "--wheel", str(wheel), "--jobs", "3",
               "--timeout", "120"])
    out = capsys.readouterr().out
    assert rc == 1, out
    lines = {h: [ln for ln in out.splitlines() if ln.startswith(h + ": ")]
             for h in hosts.values()}

    # The good board: everything real happened there.
    good = boards["good"]
    assert lines[hosts["good"]] == []
    rdir = good.home / "mcf-deploy"
    assert (rdir / f"{TOP}.bit").read_bytes() == overlay.bit.read_bytes()
    assert (rdir / f"{TOP}.hwh").read_bytes() == overlay.hwh.read_bytes()
    assert (rdir / wheel.name).read_bytes() == wheel.read_bytes()
    assert (good.root / "fpga" / "loaded.bit").read_bytes() == overlay.bit.read_bytes()
    installed = list(good.root.glob("lib/python3.*/site-packages/mcf/abi/csrmap.py"))
    assert len(installed) == 1
    assert installed[0].read_bytes() == (ROOT / "sw" / "abi" / "csrmap.py").read_bytes()
    assert len(list(good.root.glob("lib/python3.*/site-packages/mcf-*.dist-info"))) == 1
    rm = node_regmap()
    row = next(ln for ln in out.splitlines() if hosts["good"] in ln and "ok" in ln)
    assert f"{rm.id_word:#010x}" in row and "3.10." in row and "3.0.1" in row

    # Each failure is one line naming its cause, and stops that board before any copy.
    assert len(lines[hosts["badkey"]]) == 1 and "permission denied" in lines[hosts["badkey"]][0]
    (py38_line,) = lines[hosts["py38"]]
    assert "3.8." in next(ln for ln in out.splitlines() if hosts["py38"] in ln and "FAILED" in ln)
    assert "Python 3.8." in py38_line and "needs Python 3.10.x" in py38_line
    (pynq_line,) = lines[hosts["oldpynq"]]
    assert "PYNQ 2.7.0" in pynq_line and str(req.specifier) in pynq_line
    (stranger,) = lines[hosts["stranger"]]
    assert "host key not verifiable" in stranger
    (dead_line,) = lines[hosts["dead"]]
    assert "cannot connect to 127.0.0.1: Connection refused" in dead_line
    for name in ("badkey", "py38", "oldpynq", "stranger"):
        assert not (boards[name].home / "mcf-deploy").exists(), name
    assert "1 of 6 hosts deployed" in out

    # A redeploy of the same version replaces the board's files (here: one damaged by hand).
    installed[0].write_text("damaged")
    rc = main(["deploy", "--hosts", hosts["good"], "--overlay", str(overlay.bit), "--key",
               str(key_path), "--known-hosts", str(known), "--wheel", str(wheel)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert installed[0].read_bytes() == (ROOT / "sw" / "abi" / "csrmap.py").read_bytes()
    assert "1 of 1 hosts deployed" in out


def test_deploy_step_timeout(tmp_path, servers, client_key, wheel):
    """A board whose python3 never answers fails alone after --timeout, it does not hang."""
    key_path, key_pub = client_key
    board = make_board(tmp_path / "stuck", key_pub)
    (board.root / "bin").mkdir()
    stuck = board.root / "bin" / "python3"
    stuck.write_text(f"#!/bin/sh\nexec {shutil.which('sleep')} 60\n")
    stuck.chmod(0o755)
    servers.start(board)
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{board.port} {board.host_key.export_public_key().decode()}")
    cfg = DeployConfig(hosts=tuple(parse_hosts(f"127.0.0.1:{board.port}")),
                       overlay=write_overlay(tmp_path / "o"), wheel=wheel,
                       pynq=board_pynq_requirement(wheel), key=key_path, known_hosts=known,
                       timeout=0.5)
    (res,) = asyncio.run(deploy(cfg))
    assert res.error == "python3 --version: no answer within 0.5 s"
    assert res.steps == ["connect"]


# ------------------------------------------------------------------------------------------------
# Arguments and rules
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, words", [
    (["--hosts", "a,,b"], "comma-separated"),
    (["--hosts", "a:70000"], "outside 1..65535"),
    (["--hosts", "a,a"], "named twice"),
    (["--jobs", "0"], "--jobs"),
    (["--port", "0"], "--port"),
    (["--timeout", "0"], "--timeout"),
    (["--key", "/nonexistent/key"], "no such file"),
    (["--wheel", "/nonexistent/mcf.whl"], "no such file"),
    (["--overlay", "/nonexistent/mcf_node"], "not found"),
])
def test_bad_arguments(tmp_path, capsys, argv, words):
    write_overlay(tmp_path)
    base = {"--hosts": "h0,h1", "--overlay": str(tmp_path / TOP)}
    for k, v in zip(argv[::2], argv[1::2]):
        base[k] = v
    rc = main(["deploy", *[x for kv in base.items() for x in kv]])
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and words in err, err


def test_overlay_forms(tmp_path):
    ov = write_overlay(tmp_path / "kr260")
    assert OverlayFiles.find(tmp_path / "kr260") == ov
    assert OverlayFiles.find(ov.bit) == ov == OverlayFiles.find(tmp_path / "kr260" / TOP)
    ov.hwh.unlink()
    with pytest.raises(ValueError, match="hwh not found"):
        OverlayFiles.find(ov.bit)


def test_hosts_parse():
    specs = parse_hosts("board0,ubuntu@board1:2222,[::1]:22")
    assert [(s.host, s.port, s.user) for s in specs] == [
        ("board0", None, None), ("board1", 2222, "ubuntu"), ("::1", 22, None)]
    for bad in ("", "a b", "@x", "x:", "u@[zz]"):
        with pytest.raises(ValueError):
            parse_hosts(bad)


def test_version_rules(wheel):
    assert str(check_python("Python 3.10.12\n")) == "3.10.12"
    for text in ("Python 3.8.18", "Python 3.11.7", "Python 2.7.18"):
        with pytest.raises(DeployError, match=r"needs Python 3\.10\.x"):
            check_python(text)
    with pytest.raises(DeployError, match="not a version"):
        check_python("bash: python3: command not found")
    req = board_pynq_requirement(wheel)          # the pyproject's `board` extra, via the wheel
    assert req.name == "pynq"
    spec_text = next(r for r in wheel_metadata(wheel).get_all("Requires-Dist")
                     if r.startswith("pynq") and '"board"' in r)
    assert str(req.specifier) in spec_text
    with pytest.raises(DeployError, match="not a version"):
        check_pynq("Traceback ...\nModuleNotFoundError: No module named 'pynq'", req)


def test_probe_verdicts():
    rm = node_regmap()
    cfg = next(c for c in NODE_CONFIGS.values() if c.top == TOP)
    good = {"ips": ["node"], "nodes": ["node"], "ip": "node", "top": TOP,
            "phys_addr": CTRL_BASE, "id": rm.id_word, "caps": cfg.caps(),
            "id_fields": rm.register("ID").unpack(rm.id_word), "want_id": rm.id_word,
            "want_caps": cfg.caps()}
    res = evaluate_probe("noise\n" + json.dumps(good))
    assert res.id_word == rm.id_word and res.node_id.startswith(f"{rm.id_word:#010x}")
    with pytest.raises(DeployError, match="do not match"):
        evaluate_probe(json.dumps({**good, "id": rm.id_word ^ 1}))
    with pytest.raises(DeployError, match="CAPS"):
        evaluate_probe(json.dumps({**good, "caps": cfg.caps() ^ 1}))
    with pytest.raises(DeployError, match="0 node IPs"):
        evaluate_probe(json.dumps({"ips": ["ps"], "nodes": []}))
    with pytest.raises(DeployError, match="no result"):
        evaluate_probe("")


def test_remote_commands_are_argument_lists():
    cmds = remote_commands("/usr/local/share/pynq-venv/bin/python3", "/h/x y/mcf.whl",
                           "/h/x y/mcf_node.bit")
    for argv in vars(cmds).values():
        assert shlex.split(shlex.join(argv)) == argv
    assert cmds.probe[-2:] == [PROBE, "/h/x y/mcf_node.bit"]
    assert "--force-reinstall" in cmds.reinstall and "--no-deps" in cmds.reinstall


# ------------------------------------------------------------------------------------------------
# --check-links: the launcher's protocol over SSH (the ring itself: tests/test_deploy_links.py)
# ------------------------------------------------------------------------------------------------

LINK_SHIM = """#!{python}
# A board's python3 for the link check's launcher test: answers LINK_PROBE's protocol as a
# node of a healthy ring would (READY, then on GO one token each way), or fails before READY.
import json, sys
from pathlib import Path
_, _, _, bit, node, n, timeout = sys.argv
node, n = int(node), int(n)
home = Path.cwd()
links = [[0, 1, 2], [1, 0, 2]][node % 2]
def result(**kw):
    return json.dumps({{"node": node, "links": links, "before": {{}}, "after": {{}},
                       "pings": 0, "marks": 0, "eth": None, "error": "", **kw}})
(home / "argv.json").write_text(json.dumps(sys.argv[2:]))
if {fail}:
    print("MCF-LINKS-FAILED RuntimeError: the overlay has no MCF node (ol.node)", flush=True)
    sys.exit(1)
print("MCF-LINKS-READY " + result(), flush=True)
line = sys.stdin.readline().strip()
(home / "go.txt").write_text(line)
with open({log!r}, "a") as log:
    log.write(f"{{node}} {{line}}\\n")
if line != "GO":
    sys.exit(1)
print("MCF-LINKS-STARTED", flush=True)
frames = {{f"link{{p}}_{{c}}": 1 for p in (0, 1) for c in ("tx_frames", "rx_frames_ok")}}
print("MCF-LINKS-DONE " + result(after=frames, pings=2, marks=1), flush=True)
"""


def _shim_board(root: Path, key_pub: str, fail: bool = False) -> Board:
    """A board whose python3 answers the link check (LINK_SHIM); every board of a test appends
    what it was told to ``root.parent / "go.log"``, in the order the launcher told them."""
    board = make_board(root, key_pub)
    board.interactive = True
    (board.root / "bin").mkdir()
    shim = board.root / "bin" / "python3"
    shim.write_text(LINK_SHIM.format(python=sys.executable, fail=fail,
                                     log=str(root.parent / "go.log")))
    shim.chmod(0o755)
    return board


def test_check_links_launcher(tmp_path, servers, client_key, wheel):
    """Every board prepared (READY) before any GO; GO to node 1 before node 0; the verdict per
    cable from what the boards returned; a board failing before READY stops the others without
    a GO."""
    from mcf.deploy.links import LINK_PROBE
    from mcf.deploy.ssh import check_links, link_report

    key_path, key_pub = client_key
    boards = [_shim_board(tmp_path / f"b{v}", key_pub) for v in range(2)]
    for b in boards:
        servers.start(b)
    known = tmp_path / "known_hosts"
    known.write_text("".join(f"[127.0.0.1]:{b.port} {b.host_key.export_public_key().decode()}"
                             for b in boards))
    cfg = DeployConfig(hosts=tuple(parse_hosts(",".join(f"127.0.0.1:{b.port}"
                                                        for b in boards))),
                       overlay=write_overlay(tmp_path / "o"), wheel=wheel,
                       pynq=board_pynq_requirement(wheel), key=key_path, known_hosts=known,
                       timeout=30)
    results = asyncio.run(check_links(cfg, ["mcf-deploy/mcf_node.bit"] * 2, timeout=2.5))
    assert [r.error for r in results] == ["", ""] and [r.marks for r in results] == [1, 1]
    for v, b in enumerate(boards):
        assert json.loads((b.home / "argv.json").read_text()) == [
            LINK_PROBE, "mcf-deploy/mcf_node.bit", str(v), "2", "2.5"]
    # node 0, which starts the tokens, last: node 1 had answered STARTED before node 0's GO
    assert (tmp_path / "go.log").read_text().splitlines() == ["1 GO", "0 GO"]
    out = io.StringIO()
    assert link_report(results, file=out)
    lines = out.getvalue().splitlines()
    assert lines[1].startswith("node 0 link 0 (SFP+) <-> node 1 link 0 (SFP+): ok")
    assert lines[-1] == "all 2 cables passed"

    # a board that cannot prepare: the other gets no GO, both are named
    bad = [_shim_board(tmp_path / f"c{v}", key_pub, fail=v == 1) for v in range(2)]
    for b in bad:
        servers.start(b)
    known.write_text("".join(f"[127.0.0.1]:{b.port} {b.host_key.export_public_key().decode()}"
                             for b in bad))
    cfg = DeployConfig(hosts=tuple(parse_hosts(",".join(f"127.0.0.1:{b.port}" for b in bad))),
                       overlay=cfg.overlay, wheel=wheel, pynq=cfg.pynq, key=key_path,
                       known_hosts=known, timeout=30)
    results = asyncio.run(check_links(cfg, ["x.bit"] * 2))
    assert results[1].error == "RuntimeError: the overlay has no MCF node (ol.node)"
    assert results[0].error.startswith("not started")
    assert not (bad[0].home / "go.txt").exists() or \
        (bad[0].home / "go.txt").read_text() == "ABORT"
    out = io.StringIO()
    assert not link_report(results, file=out)
    assert "FAILED" in out.getvalue() and "node 1: RuntimeError" in out.getvalue()


def test_check_links_needs_a_ring(tmp_path, capsys):
    write_overlay(tmp_path)
    rc = main(["deploy", "--hosts", "h0", "--overlay", str(tmp_path / TOP), "--check-links"])
    err = capsys.readouterr().err
    assert rc == 2 and "--check-links needs the boards of a ring" in err
