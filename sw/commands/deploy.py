"""``mcf deploy --hostfile FILE|--hosts h0,h1,... --overlay build/<board>/<name> [--user U]
[--key PATH] [--port P] [--known-hosts PATH] [--remote-dir DIR] [--jobs N] [--python PY]
[--wheel WHL] [--timeout S]``: the overlay and the runtime onto boards over SSH (issue #12 item 5).

Builds the ``mcf`` wheel of this checkout (unless ``--wheel``), then per host concurrently:
versions checked, ``.bit``/``.hwh``/wheel copied over SFTP, the wheel installed with the board's
pip, the overlay loaded and the node's ``ID`` read (:mod:`mcf.deploy.ssh`). Prints a table and one
line per failed host; exit 0 when every host deployed, 1 when any failed, 2 on bad arguments.
``--check-links`` then checks the ring's cables (:mod:`mcf.deploy.links`): 1 if one fails.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

__all__ = ["register", "run"]


def _targets(args):
    """``--hosts`` and ``--overlay`` checked (before the seconds-long wheel build)."""
    from ..cli import UsageError
    from ..deploy import OverlayFiles, parse_hosts
    from ._checks import hostfile_hosts

    if (args.hosts is None) == (args.hostfile is None):
        raise UsageError("name the boards once: --hostfile FILE (as for mcf run) or --hosts "
                         "a,b,...")
    text = args.hosts if args.hostfile is None else \
        ",".join(hostfile_hosts("--hostfile", args.hostfile))
    try:
        return tuple(parse_hosts(text)), OverlayFiles.find(args.overlay)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _config(args, hosts, overlay, wheel: Path):
    from ..deploy import DeployConfig, board_pynq_requirement

    return DeployConfig(
        hosts=hosts, overlay=overlay, wheel=wheel, pynq=board_pynq_requirement(wheel),
        user=args.user, key=Path(args.key) if args.key else None, port=args.port,
        known_hosts=Path(args.known_hosts) if args.known_hosts else None,
        remote_dir=args.remote_dir, python=args.python, jobs=args.jobs, timeout=args.timeout)


def _check(args) -> None:
    from ..cli import UsageError

    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, not {args.jobs}")
    if args.port is not None and not 1 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} outside 1..65535")
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be positive, not {args.timeout:g}")
    for opt in ("key", "known_hosts", "wheel"):
        value = getattr(args, opt)
        if value is not None and (not Path(value).exists() or Path(value).is_dir()):
            raise UsageError(f"--{opt.replace('_', '-')} {value}: no such file")
    if args.wheel is not None and not args.wheel.endswith(".whl"):
        raise UsageError(f"--wheel {args.wheel}: not a .whl file")
    if args.wheel is not None:
        import zipfile

        from ..deploy.spec import wheel_metadata
        try:                    # a zip with one .dist-info/METADATA
            wheel_metadata(Path(args.wheel))
        except (ValueError, OSError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UsageError(f"--wheel {args.wheel}: not a valid mcf wheel ({first})") from None
    if not args.remote_dir.strip():
        raise UsageError("--remote-dir is empty")
    if not args.python.strip():
        raise UsageError("--python is empty")


def run(args) -> int:
    from ..cli import UsageError
    from ..deploy import HAVE_ASYNCSSH, deploy
    from ..deploy.report import print_report
    from ..deploy.runtime import build_wheel, source_root

    _check(args)
    if not HAVE_ASYNCSSH:
        raise UsageError("needs the deploy extra (asyncssh, rich): pip install -e '.[deploy]'")
    hosts, overlay = _targets(args)
    if args.check_links and len(hosts) < 2:
        raise UsageError("--check-links needs the boards of a ring: at least two hosts")
    with tempfile.TemporaryDirectory(prefix="mcf-deploy-") as tmp:
        if args.wheel is not None:
            wheel = Path(args.wheel)
        else:
            root = source_root()
            if root is None:
                raise UsageError("mcf is not imported from a checkout: pass --wheel")
            try:
                wheel = build_wheel(root, Path(tmp))
            except RuntimeError as exc:
                print(f"mcf deploy: {exc}", file=sys.stderr)
                return 1
            print(f"runtime: {wheel.name} (pip wheel of {root})")
        try:
            cfg = _config(args, hosts, overlay, wheel)
        except (ValueError, OSError) as exc:
            raise UsageError(f"--wheel {wheel}: {exc}") from None
        results = asyncio.run(deploy(cfg))
    print_report(results)
    ok = all(r.ok for r in results)
    if ok and args.check_links:             # mcf.deploy.links: a ping over each cable each way
        from ..deploy.ssh import check_links, link_report
        ok = link_report(asyncio.run(check_links(cfg, [r.overlay for r in results])))
    return 0 if ok else 1


def register(subs) -> None:
    from ._checks import description
    p = subs.add_parser("deploy", help="copy an overlay and the runtime to KR260 boards over "
                        "SSH, load it, read the node ID", description=description(__doc__))
    p.add_argument("--hostfile", default=None, metavar="FILE",
                   help="the boards: the Open MPI hostfile mcf run --hostfile takes (one host "
                        "per line); or --hosts")
    p.add_argument("--hosts", default=None, help="the boards as a comma-separated "
                   "[user@]host[:port] list (for a user or port per board); or --hostfile")
    p.add_argument("--overlay", required=True, help="the overlay: build/<board>/<name> (or its "
                   ".bit, or the folder) with <name>.bit and <name>.hwh side by side")
    p.add_argument("--user", default=None, help="SSH user (default: the local user)")
    p.add_argument("--key", default=None, help="SSH private key (default: ~/.ssh/id_* and "
                   "the agent)")
    p.add_argument("--port", type=int, default=None, help="SSH port (default 22)")
    p.add_argument("--known-hosts", default=None, help="known_hosts file (default "
                   "~/.ssh/known_hosts)")
    p.add_argument("--remote-dir", default="mcf-deploy", help="folder on each board, relative "
                   "to the user's home (default %(default)s)")
    p.add_argument("--jobs", type=int, default=8, help="hosts deployed at once (default "
                   "%(default)s)")
    p.add_argument("--python", default="python3", help="the board's interpreter, the PYNQ "
                   "virtualenv's (default %(default)s)")
    p.add_argument("--wheel", default=None, help="install this mcf wheel instead of building "
                   "one from the checkout")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each remote step may "
                   "take (default %(default)g)")
    p.add_argument("--check-links", action="store_true", help="after the deploy, read every "
                   "link's status and ping over every cable both ways (host order = "
                   "node order); one verdict per cable (docs/deploy.md)")
    p.set_defaults(handler=run)
