"""Child processes started, watched and always reaped: :class:`ManagedProcess`.

Every child is started in its own session and tracked by pid only.  Stopping
always reaps the child (no zombies).  Two safety nets are installed by the
first start, never by importing this module: an ``atexit`` hook that kills
whatever a crashed run left behind, and (from the main thread, over the
default handler only) a SIGTERM handler that unwinds like Ctrl-C so fixture
teardown runs.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, Self

from .waiting import DEFAULT_TIMEOUT, wait_for

__all__ = ["STOP_TIMEOUT", "ManagedProcess", "OutputMark", "StrPath", "rsnotify_command"]

StrPath = str | os.PathLike[str]
Stream = Literal["stdout", "stderr", "both"]
#: Byte sizes of (stdout, stderr) at some moment; see :meth:`ManagedProcess.mark`.
OutputMark = tuple[int, int]

STOP_TIMEOUT = 5.0

_LIVE: set[ManagedProcess] = set()
_LIVE_LOCK = threading.Lock()
_atexit_registered = False


def _install_safety_nets() -> None:
    """Called by every start: the atexit hook once, the SIGTERM handler when it can be."""
    global _atexit_registered
    with _LIVE_LOCK:
        if not _atexit_registered:
            atexit.register(_kill_leftovers)
            _atexit_registered = True
    _interrupt_on_sigterm()


def _kill_leftovers() -> None:
    """Last line of defence when a test run dies without running teardown."""
    with _LIVE_LOCK:
        leftovers = list(_LIVE)
    for process in leftovers:
        with contextlib.suppress(Exception):
            process.kill()


def _interrupt_on_sigterm() -> None:
    """Make SIGTERM (CI timeouts, ``kill <pytest pid>``) unwind like Ctrl-C.

    By default SIGTERM ends Python without teardown or ``atexit``, which would
    orphan every broker we started (they live in sessions of their own).  As a
    KeyboardInterrupt, pytest stops, runs fixture teardown, and exits.  Only
    installed over the default handler, and only from the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def _proc_state(pid: int) -> str | None:
    """The one-letter scheduler state from /proc (``T`` = stopped), if readable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def rsnotify_command(*args: StrPath) -> list[str]:
    """The argv that runs the ``rsnotify`` CLI from this interpreter's environment."""
    return [sys.executable, "-m", "rsnotify.cli", *(os.fspath(a) for a in args)]


class ManagedProcess:
    """One child process, its captured output, and a guaranteed clean end.

    Output goes to ``<workdir>/<name>.stdout.log`` and ``.stderr.log``, opened in
    append mode so a restarted service keeps one history; each start records
    where its own output begins, so :meth:`wait_for_line` never matches a line
    printed by a previous run.  ``PYTHONUNBUFFERED=1`` is set so Python children
    (``rsnotify ...``) write lines as they happen, not when a buffer fills.
    """

    def __init__(
        self,
        argv: Sequence[StrPath],
        *,
        workdir: StrPath,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: StrPath | None = None,
    ) -> None:
        if not argv:
            raise ValueError("argv must name a program")
        self.argv = [os.fspath(a) for a in argv]
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.name = name or Path(self.argv[0]).name
        self.stdout_path = self.workdir / f"{self.name}.stdout.log"
        self.stderr_path = self.workdir / f"{self.name}.stderr.log"
        self.env = dict(env or {})
        self.cwd = Path(cwd) if cwd is not None else None
        self._popen: subprocess.Popen[bytes] | None = None
        self._start_mark: OutputMark = (0, 0)

    @classmethod
    def rsnotify(
        cls,
        *args: StrPath,
        workdir: StrPath,
        name: str = "rsnotify",
        env: Mapping[str, str] | None = None,
        cwd: StrPath | None = None,
    ) -> ManagedProcess:
        """A (not yet started) ``rsnotify <args>`` subprocess."""
        return cls(rsnotify_command(*args), workdir=workdir, name=name, env=env, cwd=cwd)

    # -- lifecycle --

    def start(self) -> Self:
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        _install_safety_nets()
        self._start_mark = self.mark()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with open(self.stdout_path, "ab") as out, open(self.stderr_path, "ab") as err:
            # A session of its own: a Ctrl-C aimed at pytest does not race our
            # teardown, and kill() can reach helpers the child forked.
            self._popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=self.cwd,
                env=env,
                start_new_session=True,
            )
        with _LIVE_LOCK:
            _LIVE.add(self)
        return self

    def terminate(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL; always reaps. Returns the exit code.

        A paused (SIGSTOPped) child is continued after SIGTERM so it can act on it.
        """
        popen = self._popen
        if popen is None:
            return None
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                popen.send_signal(signal.SIGTERM)
                popen.send_signal(signal.SIGCONT)
            try:
                popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill_now(popen)
        self._forget()
        return popen.returncode

    def kill(self) -> int | None:
        """SIGKILL (the child and anything it forked) and reap. Returns the exit code."""
        popen = self._popen
        if popen is None:
            return None
        if popen.poll() is None:
            self._kill_now(popen)
        self._forget()
        return popen.returncode

    def _kill_now(self, popen: subprocess.Popen[bytes]) -> None:
        # The child is not reaped yet, so its pid (== its session's process
        # group id) cannot have been reused: the group is ours alone.
        try:
            os.killpg(popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                popen.kill()
        popen.wait()

    def _forget(self) -> None:
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def send_signal(self, sig: int) -> None:
        if self._popen is None or self._popen.poll() is not None:
            raise RuntimeError(f"{self.name} is not running")
        self._popen.send_signal(sig)

    def pause(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing (a stalled peer)."""
        self.send_signal(signal.SIGSTOP)
        pid = self.pid
        wait_for(
            lambda: _proc_state(pid) in ("T", None),
            timeout,
            message=f"{self.name} (pid {pid}) did not stop",
        )

    def resume(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """SIGCONT after :meth:`pause`."""
        self.send_signal(signal.SIGCONT)
        pid = self.pid
        wait_for(
            lambda: _proc_state(pid) != "T",
            timeout,
            message=f"{self.name} (pid {pid}) did not continue",
        )

    def wait(self, timeout: float = DEFAULT_TIMEOUT) -> int:
        """Wait for the child to exit on its own; AssertionError at the deadline."""
        if self._popen is None:
            raise RuntimeError(f"{self.name} was never started")
        try:
            code = self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} still running after {timeout:g} s\n{self.tail()}"
            ) from None
        self._forget()
        return code

    # -- state --

    @property
    def pid(self) -> int:
        if self._popen is None:
            raise RuntimeError(f"{self.name} was never started")
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit code once the child has exited (and been reaped), else None."""
        return None if self._popen is None else self._popen.poll()

    @property
    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    # -- output --

    def mark(self) -> OutputMark:
        """Current output sizes: pass as ``after=`` to wait only for lines printed later."""
        return (_size(self.stdout_path), _size(self.stderr_path))

    def output(self, stream: Stream = "both", *, whole_history: bool = False) -> str:
        """Captured output of this run (or of every run with ``whole_history``)."""
        start = (0, 0) if whole_history else self._start_mark
        parts = []
        for path, offset in self._streams(stream, start):
            parts.append(_read_from(path, offset).decode("utf-8", "replace"))
        return "".join(parts)

    def tail(self, lines: int = 40) -> str:
        """The last lines of both streams, for failure messages."""
        chunks = []
        for label, path, offset in (
            ("stdout", self.stdout_path, self._start_mark[0]),
            ("stderr", self.stderr_path, self._start_mark[1]),
        ):
            text = _read_from(path, offset).decode("utf-8", "replace").splitlines()
            if text:
                chunks.append(f"--- {self.name} {label} ---\n" + "\n".join(text[-lines:]))
        return "\n".join(chunks) or f"--- {self.name}: no output ---"

    def wait_for_line(
        self,
        pattern: str | re.Pattern[str],
        timeout: float = DEFAULT_TIMEOUT,
        *,
        stream: Stream = "both",
        after: OutputMark | None = None,
    ) -> re.Match[str]:
        """Wait for an output line matching ``pattern`` (``re.search``) and return the match.

        Only complete lines count while the process runs, so ``:80`` is never
        mistaken for ``:8080`` half-written.  Fails at once, with the output,
        if the process exits without printing the line.
        """
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        positions = dict(self._streams(stream, after or self._start_mark))

        def scan() -> re.Match[str] | None:
            alive = self.running  # before reading: if dead now, the output is final
            for path, offset in positions.items():
                data = _read_from(path, offset)
                end = len(data) if not alive else data.rfind(b"\n") + 1
                for line in data[:end].decode("utf-8", "replace").splitlines():
                    found = regex.search(line)
                    if found:
                        return found
                positions[path] = offset + end
            if not alive:
                raise AssertionError(
                    f"{self.name} exited with {self.returncode} before printing a line "
                    f"matching {regex.pattern!r}\n{self.tail()}"
                )
            return None

        return wait_for(
            scan,
            timeout,
            interval=0.02,
            message=lambda: (
                f"{self.name} printed no line matching {regex.pattern!r}\n" + self.tail()
            ),
        )

    def _streams(self, stream: Stream, start: OutputMark) -> list[tuple[Path, int]]:
        chosen = []
        if stream in ("stdout", "both"):
            chosen.append((self.stdout_path, start[0]))
        if stream in ("stderr", "both"):
            chosen.append((self.stderr_path, start[1]))
        return chosen

    # -- context manager --

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()

    def __repr__(self) -> str:
        state = f"pid {self._popen.pid}, " if self._popen else ""
        return f"<ManagedProcess {self.name} {state}returncode={self.returncode}>"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read()
    except FileNotFoundError:
        return b""
