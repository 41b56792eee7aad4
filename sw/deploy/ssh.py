"""The deploy itself: every host concurrently over SSH with asyncssh (issue #12 item 5).

Per host, in order, stopping at the first failure (which becomes the host's one-line error; the
other hosts go on):

1. connect (``known_hosts`` checked, public-key authentication);
2. ``python3 --version`` must be :data:`~mcf.deploy.spec.BOARD_PYTHON`'s series;
3. ``python3 -c "import pynq; print(pynq.__version__)"`` must satisfy the wheel's ``board``
   extra (:func:`~mcf.deploy.spec.board_pynq_requirement`);
4. SFTP: ``<remote-dir>`` created, ``<name>.bit``, ``<name>.hwh`` and the wheel copied;
5. ``python3 -m pip install <wheel>`` (installs missing dependencies), then
   ``... --force-reinstall --no-deps <wheel>`` (this build even if the version is unchanged) —
   into the environment of the board's ``python3`` (the PYNQ virtualenv's);
6. :data:`~mcf.deploy.spec.PROBE`: ``pynq.Overlay(<remote .bit>)`` loads the bitstream and the
   node's ``ID``/``CAPS`` are read and compared with the installed ABI.

Commands are argument lists joined with :func:`shlex.join`; each has a timeout, so a host that
stops answering fails alone. Latency: one SSH round trip is ≈ 0.08 s on loopback; the pip steps
dominate (seconds each).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import posixpath
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .spec import (
    DeployError,
    HostResult,
    HostSpec,
    OverlayFiles,
    check_pynq,
    check_python,
    evaluate_probe,
    parse_python_version,
    remote_commands,
)

try:
    import asyncssh
except ImportError:     # the board runtime carries no deploy tool: pip install 'mcf[deploy]'
    asyncssh = None

if TYPE_CHECKING:
    from packaging.requirements import Requirement

__all__ = ["DeployConfig", "deploy", "deploy_host", "HAVE_ASYNCSSH", "check_links",
           "link_report", "LINK_TIMEOUT_S"]

HAVE_ASYNCSSH = asyncssh is not None


@dataclass(frozen=True)
class DeployConfig:
    """Everything one deploy needs. ``user``/``port`` apply to hosts that do not name their own;
    None leaves them (and ``key``, ``known_hosts``) to asyncssh's defaults (the local user, 22,
    ``~/.ssh/id_*`` and the agent, ``~/.ssh/known_hosts``). ``timeout`` bounds each remote step
    in seconds, ``connect_timeout`` the connection."""
    hosts: tuple[HostSpec, ...]
    overlay: OverlayFiles
    wheel: Path
    pynq: Requirement
    user: str | None = None
    key: Path | None = None
    port: int | None = None
    known_hosts: Path | None = None
    remote_dir: str = "mcf-deploy"
    python: str = "python3"
    jobs: int = 8
    timeout: float = 600.0
    connect_timeout: float = 20.0


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


async def _run(conn, argv: list[str], step: str, timeout: float) -> str:
    """Run ``argv`` on the host; its stdout, or :class:`DeployError` naming the step."""
    try:
        res = await conn.run(shlex.join(argv), check=False, timeout=timeout)
    except asyncssh.TimeoutError:
        raise DeployError(f"{step}: no answer within {timeout:g} s") from None
    if res.exit_status != 0:
        status = res.exit_status if res.exit_status is not None else f"signal {res.exit_signal}"
        raise DeployError(f"{step} exited {status}: {_last_line(str(res.stderr or res.stdout))}")
    return str(res.stdout)


async def _copy(conn, cfg: DeployConfig) -> dict[Path, str]:
    """``.bit``, ``.hwh`` and wheel into ``cfg.remote_dir`` over SFTP; local → remote path."""
    async with conn.start_sftp_client() as sftp:
        await sftp.makedirs(cfg.remote_dir, exist_ok=True)
        rdir = await sftp.realpath(cfg.remote_dir)
        remote = {p: posixpath.join(rdir, p.name)
                  for p in (cfg.overlay.bit, cfg.overlay.hwh, cfg.wheel)}
        for local, path in remote.items():
            await sftp.put(str(local), path)
            if (await sftp.stat(path)).size != local.stat().st_size:
                raise DeployError(f"copy of {local.name} to {path} is incomplete")
    return remote


async def _deploy(cfg: DeployConfig, spec: HostSpec, res: HostResult) -> None:
    opts = {"known_hosts": str(cfg.known_hosts)} if cfg.known_hosts is not None else {}
    if cfg.key is not None:
        opts["client_keys"] = [str(cfg.key)]
    user = spec.user or cfg.user
    port = spec.port or cfg.port
    conn = await asyncio.wait_for(asyncssh.connect(
        spec.host, **({"port": port} if port else {}), **({"username": user} if user else {}),
        connect_timeout=cfg.connect_timeout, **opts), cfg.connect_timeout + 5)
    async with conn:
        res.steps.append("connect")
        cmds = remote_commands(cfg.python, "", "")
        python = await _run(conn, cmds.python_version, "python3 --version", cfg.timeout)
        res.python = str(parse_python_version(python))
        check_python(python)
        pynq = await _run(conn, cmds.pynq_version, "import pynq", cfg.timeout)
        res.pynq = pynq.strip().splitlines()[-1] if pynq.strip() else ""
        check_pynq(pynq, cfg.pynq)
        res.steps.append("versions")

        try:
            remote = await asyncio.wait_for(_copy(conn, cfg), cfg.timeout)
        except asyncio.TimeoutError:
            raise DeployError(f"sftp copy: not done within {cfg.timeout:g} s") from None
        res.overlay = remote[cfg.overlay.bit]
        res.steps.append("copy")

        cmds = remote_commands(cfg.python, remote[cfg.wheel], remote[cfg.overlay.bit])
        await _run(conn, cmds.install, "pip install", cfg.timeout)
        await _run(conn, cmds.reinstall, "pip install --force-reinstall", cfg.timeout)
        res.steps.append("install")
        probe = evaluate_probe(await _run(conn, cmds.probe, "overlay load", cfg.timeout))
        res.node_id = probe.node_id
        res.steps.append("probe")


def _explain(exc: BaseException, spec: HostSpec, cfg: DeployConfig) -> str:
    """The one line a failed host gets."""
    user = spec.user or cfg.user or getpass.getuser()
    if isinstance(exc, DeployError):
        return str(exc)
    if isinstance(exc, asyncssh.PermissionDenied):
        key = cfg.key or "the default keys"
        return f"permission denied: {spec.host} refused {key} for {user}"
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        where = cfg.known_hosts or "~/.ssh/known_hosts"
        return f"host key not verifiable: {spec.host} is not (or differently) in {where}"
    if isinstance(exc, asyncssh.DisconnectError):
        return f"ssh disconnected: {exc.reason}"
    if isinstance(exc, asyncssh.SFTPError):
        return f"sftp: {exc.reason}"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return f"no answer within {cfg.connect_timeout:g} s"
    if isinstance(exc, OSError):
        why = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else exc.strerror or exc
        return f"cannot connect to {spec.host}: {why}"
    return f"{type(exc).__name__}: {exc}"


async def deploy_host(cfg: DeployConfig, spec: HostSpec) -> HostResult:
    """Deploy to one host; never raises (a failure is the result's ``error``)."""
    res = HostResult(spec.text)
    try:
        await _deploy(cfg, spec, res)
    except (Exception, asyncio.TimeoutError) as exc:   # one host's failure stops only that host
        res.error = _explain(exc, spec, cfg)
    return res


async def deploy(cfg: DeployConfig) -> list[HostResult]:
    """Deploy to every host, at most ``cfg.jobs`` at a time; results in ``cfg.hosts`` order."""
    if asyncssh is None:
        raise ImportError("mcf deploy needs asyncssh: pip install 'mcf[deploy]'")
    gate = asyncio.Semaphore(cfg.jobs)

    async def one(spec: HostSpec) -> HostResult:
        async with gate:
            return await deploy_host(cfg, spec)

    return list(await asyncio.gather(*(one(s) for s in cfg.hosts)))


# ------------------------------------------------------------------------------------------------
# mcf deploy --check-links: the ring check on the deployed boards (mcf.deploy.links)
# ------------------------------------------------------------------------------------------------

LINK_TIMEOUT_S = 10.0
"""How long each board waits for the pings after its GO (the 2N pings take microseconds;
the GOs reach the boards one SSH round trip apart: each after the previous board said STARTED)."""


async def _link_host(cfg: DeployConfig, spec: HostSpec, node: int, n: int, bit: str,
                     ready: asyncio.Future, go: asyncio.Event, abort: list[bool],
                     sent: asyncio.Event, timeout: float):
    """Board ``node``'s side of :func:`check_links`; returns its
    :class:`~mcf.deploy.links.NodeResult` (``error`` set when it failed)."""
    from ..abi.link_map import link_map_for
    from .links import DONE, FAILED, LINK_PROBE, READY, STARTED, NodeResult

    res = NodeResult(node, tuple(link_map_for(node, n, "ring")))
    opts = {"known_hosts": str(cfg.known_hosts)} if cfg.known_hosts is not None else {}
    if cfg.key is not None:
        opts["client_keys"] = [str(cfg.key)]
    user, port = spec.user or cfg.user, spec.port or cfg.port

    async def line(proc, want: str) -> str:
        while True:
            text = await asyncio.wait_for(proc.stdout.readline(), cfg.timeout)
            if not text:
                err = _last_line(str(await proc.stderr.read()))
                raise DeployError(f"link check ended before {want.strip()}: {err}")
            if text.startswith(FAILED):
                raise DeployError(text[len(FAILED):].strip())
            if text.startswith(want):
                return text[len(want):]

    try:
        conn = await asyncio.wait_for(asyncssh.connect(
            spec.host, **({"port": port} if port else {}),
            **({"username": user} if user else {}), connect_timeout=cfg.connect_timeout,
            **opts), cfg.connect_timeout + 5)
        async with conn:
            argv = [cfg.python, "-c", LINK_PROBE, bit, str(node), str(n), f"{timeout:g}"]
            proc = await conn.create_process(shlex.join(argv))
            res = NodeResult.from_json(await line(proc, READY))
            ready.set_result(True)
            await go.wait()
            if abort[0]:
                proc.stdin.write("ABORT\n")
                proc.stdin.write_eof()
                res.error = "not started: another board failed before the pings"
                sent.set()
                # the board has read its ABORT and ended before the connection closes
                # (closing at once could cut the line off: the board would see end of input)
                with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                    await proc.wait(timeout=cfg.timeout)
                return res
            proc.stdin.write("GO\n")
            await line(proc, STARTED)       # this board's pings are out: the next one may go
            sent.set()
            res = NodeResult.from_json(await line(proc, DONE))
            return res
    except (Exception, asyncio.TimeoutError) as exc:   # one board's failure is its result
        res.error = _explain(exc, spec, cfg)
        if not ready.done():
            ready.set_result(False)
        sent.set()
        return res


async def check_links(cfg: DeployConfig, bits: list[str],
                      timeout: float = LINK_TIMEOUT_S) -> list:
    """The ring check on every host of ``cfg`` (host ``v`` is node ``v``, as ``mcf run``'s
    ranks), ``bits[v]`` the overlay on board ``v``: each board loads it afresh and prepares
    (:meth:`~mcf.deploy.links.NodePing.prepare`); once every board is ready the launcher sends
    ``GO`` to node N−1 first and node 0 last, each only after the previous board answered
    ``STARTED``; each returns its
    counters. Returns the :class:`~mcf.deploy.links.NodeResult` s by node."""
    if asyncssh is None:
        raise ImportError("mcf deploy needs asyncssh: pip install 'mcf[deploy]'")
    n = len(cfg.hosts)
    loop = asyncio.get_running_loop()
    ready = [loop.create_future() for _ in range(n)]
    go = [asyncio.Event() for _ in range(n)]
    sent = [asyncio.Event() for _ in range(n)]
    abort = [False]
    tasks = [asyncio.create_task(_link_host(cfg, spec, v, n, bits[v], ready[v], go[v], abort,
                                            sent[v], timeout))
             for v, spec in enumerate(cfg.hosts)]
    abort[0] = not all(await asyncio.gather(*ready))
    for v in reversed(range(n)):            # node N-1 first, node 0 last
        go[v].set()
        await sent[v].wait()
    return list(await asyncio.gather(*tasks))


def link_report(results, file=None) -> bool:
    """Print one line per cable (:func:`~mcf.deploy.links.cable_verdicts`), the nodes that
    missed a ping, and each board's failure; True when every cable passed."""
    from .links import cable_verdicts, missing

    out = file or sys.stdout
    print("link check: a ping over every cable, both ways (mcf.deploy.links)", file=out)
    for v in cable_verdicts(results):
        print(v.line(), file=out)
    failed = [r for r in results if r.error]
    if not failed:
        where = missing(results)
        if where:
            print(where, file=out)
    ok = all(v.ok for v in cable_verdicts(results)) and not failed
    print(f"{'all' if ok else 'not all'} {len(cable_verdicts(results))} cables passed", file=out)
    return ok
