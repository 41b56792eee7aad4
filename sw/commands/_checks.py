"""What every subcommand checks before it starts work (issue #36 item 1), and its progress on
stderr (item 2). A failed check raises :class:`mcf.cli.UsageError`: one line on stderr, exit 2,
before any build, simulation or file is written."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

from ..cli import UsageError

__all__ = ["writable_dir", "writable_file", "hostfile_hosts", "Progress", "description",
           "add_alias", "spelling"]


def _nearest_existing(path: Path) -> Path:
    p = path.absolute().parent
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def writable_dir(flag: str, path) -> Path:
    """``path`` as a folder the command creates (parents too) or writes into. Refuses when it
    exists and is not a writable directory, or when the nearest existing folder above it is not
    a directory or not writable."""
    p = Path(path)
    if p.exists():
        if not p.is_dir():
            raise UsageError(f"{flag} {path} exists and is not a directory")
        if not os.access(p, os.W_OK | os.X_OK):
            raise UsageError(f"{flag} {path}: the directory is not writable")
        return p
    above = _nearest_existing(p)
    if not above.is_dir():
        raise UsageError(f"{flag} {path}: {above} is not a directory")
    if not os.access(above, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: cannot create it, {above} is not writable")
    return p


def writable_file(flag: str, path) -> Path:
    """``path`` as a file the command writes. Refuses a directory, a missing or unwritable
    parent folder, and an existing file that cannot be written."""
    p = Path(path)
    if str(path) == "" or p.is_dir():
        raise UsageError(f"{flag} {path!r} is a directory, not a file name")
    parent = p.absolute().parent
    if not parent.exists():
        raise UsageError(f"{flag} {path}: no folder {parent}")
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: {parent} is not a directory")
    if p.exists() and not os.access(p, os.W_OK):
        raise UsageError(f"{flag} {path}: the file is not writable")
    if not p.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: {parent} is not writable")
    return p


_HOST = re.compile(r"^(?:[\w.-]+@)?(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]"
                   r"|[0-9A-Fa-f:]+:[0-9A-Fa-f:.]*)$")
_SLOT_KEYS = ("slots", "max_slots", "max-slots")


def hostfile_hosts(flag: str, path) -> list[str]:
    """The hosts of an Open MPI hostfile, in order: one ``host [slots=N] [max_slots=N]`` per
    line, ``#`` comments and blank lines skipped. Refuses a missing, unreadable, empty or
    malformed file and a host named twice (one line per board)."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{flag} {path}: no such file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{flag} {path}: cannot be read ({exc})") from None
    hosts: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        host, *opts = words
        where = f"{flag} {path} line {number}"
        if not _HOST.match(host) or "=" in host:
            raise UsageError(f"{where}: {host!r} is not a host name (Open MPI hostfile: "
                             "'host [slots=N]' per line)")
        for opt in opts:
            key, eq, value = opt.partition("=")
            if not eq or key not in _SLOT_KEYS:
                raise UsageError(f"{where}: {opt!r} is not slots=N or max_slots=N")
            if not value.isdigit() or int(value) < 1:
                raise UsageError(f"{where}: {opt!r} needs a whole number >= 1")
        if host in hosts:
            raise UsageError(f"{where}: {host} is named twice (one line per board)")
        hosts.append(host)
    if not hosts:
        raise UsageError(f"{flag} {path}: no hosts in it (one 'host slots=1' line per board)")
    return hosts


def node_counts(flag: str, text: str) -> tuple[int, ...]:
    """``text`` (``"1,2,4"``) as node counts, each at least 1, or :class:`UsageError`."""
    try:
        out = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"{flag} must be a comma-separated list of integers, got {text!r}") \
            from None
    if any(n < 1 for n in out):
        raise UsageError(f"{flag} must all be >= 1, got {text!r}")
    return out


def description(doc: str) -> str:
    """A parser's description from a module docstring: its first paragraph as one line of
    whole sentences, the reST markup taken out."""
    para = doc.strip().split("\n\n", 1)[0]
    text = " ".join(para.split())
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text)
    return text.replace("``", "")


class _Alias(argparse.Action):
    """Stores like ``store`` and remembers the spelling used (:func:`spelling`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        spelt = dict(getattr(namespace, "spelling", None) or {})
        spelt[self.dest] = option_string
        namespace.spelling = spelt


def add_alias(parser, old: str, dest: str, **kwargs) -> None:
    """``old``: a former spelling of the option whose ``dest`` is given, still accepted (kept
    for one release, issue #36) but left out of ``--help``; messages name the spelling the
    user typed (:func:`spelling`)."""
    parser.add_argument(old, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                        action=_Alias, **kwargs)


def spelling(args, dest: str, flag: str) -> str:
    """``flag``, or the former spelling of it the command line used."""
    return (getattr(args, "spelling", None) or {}).get(dest, flag)


class Progress:
    """Progress of a long command on stderr: a tqdm bar on a terminal. Elsewhere (a log, a
    pipe) lines: none while the command is quick; once it has run ``delay`` seconds, the step
    under way, then at most one line every ``every`` seconds, and one when it ends. ``step`` is
    called before each of the ``total`` steps (``label``: what starts)."""

    def __init__(self, prog: str, total: int, desc: str, unit: str, *, enabled: bool = True,
                 every: float = 5.0, delay: float = 2.0, stream=None):
        import threading

        self.prog, self.total, self.desc, self.unit = prog, total, desc, unit
        self.enabled, self.every, self.delay = enabled, every, delay
        self.stream = sys.stderr if stream is None else stream
        self.done, self.label = 0, ""
        self.start = time.monotonic()
        self.last: float | None = None
        self.bar = None
        self.timer = None
        self.lock = threading.Lock()
        if enabled and self.stream.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc=desc, unit=unit, leave=False, file=self.stream)

    def _line(self) -> None:
        self.last = time.monotonic()
        print(f"{self.prog}: {self.desc} {self.done}/{self.total}"
              + (f": {self.label}" if self.label else "") + " ...", file=self.stream, flush=True)

    def _late(self) -> None:
        with self.lock:
            if self.enabled and self.last is None:
                self._line()

    def step(self, label: str = "") -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            if self.done:
                self.bar.update(1)
            self.bar.set_postfix_str(label)
            self.done += 1
            return
        with self.lock:
            self.done, self.label = self.done + 1, label
            now = time.monotonic()
            if self.last is None and now - self.start >= self.delay or \
                    self.last is not None and now - self.last >= self.every:
                self._line()
            elif self.last is None and self.timer is None:
                import threading
                self.timer = threading.Timer(self.delay - (now - self.start), self._late)
                self.timer.daemon = True
                self.timer.start()

    def close(self) -> None:
        if not self.enabled:
            return
        if self.timer is not None:
            self.timer.cancel()
        with self.lock:
            if self.bar is not None:
                self.bar.update(self.done - self.bar.n)
                self.bar.close()
                self.bar = None
            elif self.last is not None:
                print(f"{self.prog}: {self.desc}: {self.done} {self.unit}(s) in "
                      f"{time.monotonic() - self.start:.0f} s", file=self.stream, flush=True)
            self.enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
