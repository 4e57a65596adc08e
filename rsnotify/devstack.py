"""Real Mosquitto, NATS, Redis and rsnotify processes on loopback, and deadline-bound waiting.

Used by ``make demo`` (:mod:`rsnotify.demo`) and by the test suite.
Integration tests run against the real brokers rsnotify meets in production,
never mocks: a mock cannot reproduce a broker that restarts, stalls or drops
a queue.  Each service runs as our own child process on a free loopback port
(brokers already running on 1883/6379 belong to someone else and are never
touched), in its own directory, with its output captured to files so a
failing test can show what the process said.

Every child is started in its own session and tracked by pid only.  Stopping
always reaps the child (no zombies); an ``atexit`` hook kills whatever a
crashed run left behind.

Callers synchronise with :func:`wait_for` / :func:`async_wait_for`, which
poll a condition until a deadline, instead of sleeping and hoping.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import contextlib
import hashlib
import inspect
import itertools
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

import paho.mqtt.client as mqtt
import psutil
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .errors import LocalError

T = TypeVar("T")
StrPath = str | os.PathLike[str]
Message = str | Callable[[], str]
Stream = Literal["stdout", "stderr", "both"]
#: Byte sizes of (stdout, stderr) at some moment; see :meth:`ManagedProcess.mark`.
OutputMark = tuple[int, int]

HOST = "127.0.0.1"
DEFAULT_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0


# --- ports and waiting ---------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago.

    The port is released before returning, so a race with another process is
    possible; services that fail to bind retry on a fresh port (see
    :meth:`Service.start`).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _message_text(message: Message) -> str:
    return message() if callable(message) else message


def wait_for(
    predicate: Callable[[], T],
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = 0.01,
    message: Message = "condition not met",
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    Raises ``AssertionError(message)`` at the deadline so a test fails with a
    reason instead of hanging.  ``message`` may be a callable, evaluated only on
    failure (handy for including a process log).  Exceptions raised by the
    predicate propagate immediately: a predicate that wants to tolerate errors
    must catch them itself.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"{_message_text(message)} (waited {timeout:g} s)")
        time.sleep(min(interval, remaining))


async def async_wait_for(
    predicate: Callable[[], T | Awaitable[T]],
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = 0.01,
    message: Message = "condition not met",
) -> T:
    """:func:`wait_for` for async tests: yields to the event loop between polls.

    ``predicate`` may be a plain function or return an awaitable (e.g. an
    ``async def``); the awaited value is what is tested and returned.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"{_message_text(message)} (waited {timeout:g} s)")
        await asyncio.sleep(min(interval, remaining))


# --- child processes -----------------------------------------------------------

_LIVE: set[ManagedProcess] = set()
_LIVE_LOCK = threading.Lock()


@atexit.register
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
        _interrupt_on_sigterm()
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

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
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


# --- services ------------------------------------------------------------------


class Service:
    """A server process on a fixed loopback port that can be stopped and restarted.

    Subclasses write a config file and say how to probe readiness; this class
    owns the lifecycle.  The port chosen at construction is kept across
    :meth:`restart`, because clients under test reconnect to the same URL.
    """

    name = "service"

    def __init__(self, directory: StrPath, port: int | None = None) -> None:
        self.directory = Path(directory).resolve()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._port_fixed = port is not None
        self._port = port if port is not None else free_port()
        self.process: ManagedProcess | None = None

    # subclass hooks
    def _write_config(self) -> None:
        raise NotImplementedError

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    @property
    def url(self) -> str:
        raise NotImplementedError

    # -- state --

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        return self._port

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.running

    # -- lifecycle --

    def start(self, timeout: float = DEFAULT_TIMEOUT) -> Self:
        """Start and wait until the service really answers its protocol."""
        if self.running:
            return self
        first_start = self.process is None
        for attempt in range(3):
            self._write_config()
            self.process = ManagedProcess(self._argv(), workdir=self.directory, name=self.name)
            self.process.start()
            try:
                wait_for(self._probe, timeout, message=self._failure)
                return self
            except _BindFailed:
                # Someone took our free port between free_port() and bind().
                self.process.kill()
                if self._port_fixed or not first_start or attempt == 2:
                    raise AssertionError(self._failure()) from None
                self._port = free_port()
            except BaseException:
                self.process.kill()
                raise
        raise AssertionError(self._failure())  # pragma: no cover - loop always returns/raises

    def _probe(self) -> bool:
        assert self.process is not None
        if not self.process.running:
            if "in use" in self.process.output():
                raise _BindFailed
            raise AssertionError(
                f"{self.name} exited with {self.process.returncode} while starting\n"
                + self.process.tail()
            )
        # Our own pid must hold the listening socket: otherwise whoever owns the
        # port (a leftover, another test) would answer the probe in our place.
        return _listens_on(self.process.pid, self.port) and self._ready()

    def _failure(self) -> str:
        tail = self.process.tail() if self.process else ""
        return f"{self.name} on port {self._port} did not become ready\n{tail}"

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """Graceful stop (SIGTERM, then SIGKILL after ``timeout``); reaps the process."""
        return self.process.terminate(timeout) if self.process else None

    def kill(self) -> int | None:
        """Crash the service (SIGKILL): no shutdown hooks, no final flush."""
        return self.process.kill() if self.process else None

    def restart(self, timeout: float = DEFAULT_TIMEOUT) -> Self:
        """Stop gracefully and start again on the same port with the same data directory."""
        self.stop()
        return self.start(timeout)

    def pause(self) -> None:
        """SIGSTOP: connections stay open but nothing is answered."""
        self._require_process().pause()

    def resume(self) -> None:
        self._require_process().resume()

    async def async_start(self, timeout: float = DEFAULT_TIMEOUT) -> Self:
        """:meth:`start` without blocking the event loop of an async test."""
        return await asyncio.to_thread(self.start, timeout)

    async def async_stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        return await asyncio.to_thread(self.stop, timeout)

    async def async_restart(self, timeout: float = DEFAULT_TIMEOUT) -> Self:
        return await asyncio.to_thread(self.restart, timeout)

    def _require_process(self) -> ManagedProcess:
        if self.process is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.process

    def log_text(self) -> str:
        """Everything the service printed, over all its runs."""
        if self.process is None:
            return ""
        return self.process.output(whole_history=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} running={self.running}>"


class _BindFailed(LocalError):
    """The service could not bind its port (a race after free_port())."""


def _listens_on(pid: int, port: int) -> bool:
    try:
        sockets = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    return any(s.status == psutil.CONN_LISTEN and s.laddr.port == port for s in sockets)


def _tcp_accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


_probe_ids = itertools.count()


def mqtt_connack(
    host: str,
    port: int,
    *,
    credentials: tuple[str, str] | None = None,
    timeout: float = 2.0,
) -> mqtt.ReasonCode | None:
    """Do a real MQTT CONNECT with paho-mqtt; return the CONNACK reason code, or None.

    ``None`` means no CONNACK arrived (nothing listening, or not speaking MQTT).
    """
    received: list[mqtt.ReasonCode] = []
    client_id = f"rsnotify-test-probe-{os.getpid()}-{next(_probe_ids)}"
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
    if credentials:
        client.username_pw_set(*credentials)

    def on_connect(
        _c: mqtt.Client, _u: object, _f: object, reason: mqtt.ReasonCode, _p: object
    ) -> None:
        received.append(reason)

    client.on_connect = on_connect
    try:
        client.connect(host, port, keepalive=10)
        deadline = time.monotonic() + timeout
        while not received and time.monotonic() < deadline:
            if client.loop(timeout=0.05) != mqtt.MQTT_ERR_SUCCESS:
                break
        if received and not received[0].is_failure:
            client.disconnect()
    except OSError:
        return None
    finally:
        with contextlib.suppress(Exception):
            sock = client.socket()
            if sock is not None:
                sock.close()
    return received[0] if received else None


def _binary(name: str, fallback: str | None = None) -> str:
    found = shutil.which(name)
    if found:
        return found
    if fallback and os.access(fallback, os.X_OK):
        return fallback
    raise AssertionError(
        f"{name} is not installed; run `make services` (installs the Debian package)"
    )


def mosquitto_password_line(user: str, password: str) -> str:
    """A mosquitto 2.x password-file line (``$7$`` = PBKDF2-SHA512, 101 rounds).

    Used only when ``mosquitto_passwd`` is missing; mosquitto 2 refuses plaintext.
    """
    salt = os.urandom(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, 101)
    b64 = base64.b64encode
    return f"{user}:$7$101${b64(salt).decode()}${b64(digest).decode()}"


Users = Mapping[str, str] | Iterable[tuple[str, str]]


class Mosquitto(Service):
    """A private Mosquitto broker on ``127.0.0.1:<free port>``.

    ``password_file`` is either the path of an existing file or the users
    themselves (a mapping or ``(user, password)`` pairs), hashed into
    ``<directory>/passwords``.  ``acl_file`` is a path; ``acl`` is ACL text
    written to ``<directory>/acl``.  ``allow_anonymous`` defaults to true unless
    a password file is configured.  ``extra_config`` lines are appended verbatim.
    """

    name = "mosquitto"

    def __init__(
        self,
        directory: StrPath,
        *,
        port: int | None = None,
        allow_anonymous: bool | None = None,
        max_queued_messages: int | None = None,
        max_inflight_messages: int | None = None,
        persistence: bool = False,
        password_file: StrPath | Users | None = None,
        acl_file: StrPath | None = None,
        acl: str | None = None,
        extra_config: str | Iterable[str] = (),
        verbose: bool = False,
    ) -> None:
        super().__init__(directory, port)
        self.binary = _binary("mosquitto", "/usr/sbin/mosquitto")
        self.config_path = self.directory / "mosquitto.conf"
        self.max_queued_messages = max_queued_messages
        self.max_inflight_messages = max_inflight_messages
        self.persistence = persistence
        self.persistence_location = self.directory / "data"
        self.verbose = verbose
        self.extra_config = [extra_config] if isinstance(extra_config, str) else list(extra_config)
        self.users: dict[str, str] = {}
        self.password_path: Path | None = None
        if isinstance(password_file, str | os.PathLike):
            self.password_path = Path(password_file)
        elif password_file is not None:
            pairs = password_file.items() if isinstance(password_file, Mapping) else password_file
            self.users = dict(pairs)
            self.password_path = self.directory / "passwords"
            self._write_passwords()
        if acl is not None and acl_file is not None:
            raise ValueError("give acl (text) or acl_file (path), not both")
        self.acl_path: Path | None = Path(acl_file) if acl_file is not None else None
        if acl is not None:
            self.acl_path = self.directory / "acl"
            self.acl_path.write_text(acl if acl.endswith("\n") else acl + "\n")
        self.allow_anonymous = (
            allow_anonymous if allow_anonymous is not None else self.password_path is None
        )

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    @property
    def credentials(self) -> tuple[str, str] | None:
        """The first generated user, if any (also what the readiness probe logs in as)."""
        return next(iter(self.users.items()), None)

    def config_text(self) -> str:
        lines = [
            "# generated by rsnotify.devstack",
            # Running as root, mosquitto would drop to user "mosquitto" and lose
            # access to our temp dir; as anyone else this line is ignored.
            f"user {pwd.getpwuid(os.getuid()).pw_name}",
            f"listener {self.port} {self.host}",
            f"allow_anonymous {'true' if self.allow_anonymous else 'false'}",
            "log_dest stderr",
            # One type per line: mosquitto ignores anything after the first word.
            *(
                ["log_type all"]
                if self.verbose
                else [f"log_type {t}" for t in ("error", "warning", "notice", "information")]
            ),
            "log_timestamp true",
            "log_timestamp_format %Y-%m-%dT%H:%M:%S",
            "connection_messages true",
        ]
        if self.persistence:
            lines += ["persistence true", f"persistence_location {self.persistence_location}/"]
        else:
            lines.append("persistence false")
        if self.max_queued_messages is not None:
            lines.append(f"max_queued_messages {self.max_queued_messages}")
        if self.max_inflight_messages is not None:
            lines.append(f"max_inflight_messages {self.max_inflight_messages}")
        if self.password_path is not None:
            lines.append(f"password_file {self.password_path}")
        if self.acl_path is not None:
            lines.append(f"acl_file {self.acl_path}")
        lines += self.extra_config
        return "\n".join(lines) + "\n"

    def _write_config(self) -> None:
        if self.persistence:
            self.persistence_location.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config_text())

    def _write_passwords(self) -> None:
        assert self.password_path is not None
        path = self.password_path
        path.write_text("")
        path.chmod(0o600)
        tool = shutil.which("mosquitto_passwd")
        if tool is None:
            path.write_text(
                "".join(mosquitto_password_line(u, p) + "\n" for u, p in self.users.items())
            )
            return
        for user, password in self.users.items():
            subprocess.run(
                [tool, "-b", str(path), user, password],
                check=True,
                capture_output=True,
                timeout=10,
            )

    def _argv(self) -> list[str]:
        return [self.binary, "-c", str(self.config_path)]

    def _ready(self) -> bool:
        if not _tcp_accepts(self.host, self.port):
            return False
        return mqtt_connack(self.host, self.port, credentials=self.credentials) is not None


class NatsServer(Service):
    """A private ``nats-server`` with its MQTT listener on ``127.0.0.1:<free port>``.

    The second MQTT broker of the tests (Debian's ``nats-server``): MQTT 3.1.1
    only, over JetStream, with its own rules (no ``.`` or space in topics).
    Its JetStream store (retained messages, sessions, QoS 1 queues) lives in
    ``<directory>/jetstream`` and survives :meth:`kill` and :meth:`restart`,
    like a broker with persistence.  The NATS client port is picked by NATS
    itself (``-1``): nothing here uses it.  ``extra_config`` lines are
    appended verbatim.
    """

    name = "nats-server"

    def __init__(
        self,
        directory: StrPath,
        *,
        port: int | None = None,
        extra_config: str | Iterable[str] = (),
    ) -> None:
        super().__init__(directory, port)
        self.binary = _binary("nats-server", "/usr/sbin/nats-server")
        self.config_path = self.directory / "nats.conf"
        self.store = self.directory / "jetstream"
        self.extra_config = [extra_config] if isinstance(extra_config, str) else list(extra_config)

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def config_text(self) -> str:
        lines = [
            "# generated by rsnotify.devstack",
            f"server_name: rsnotify-test-{self.port}",
            f"listen: {self.host}:-1",
            # Limits, not allocations: the defaults are 75% of the machine's memory.
            f'jetstream {{ store_dir: "{self.store}", max_memory_store: 64MB, '
            "max_file_store: 1GB }",
            f"mqtt {{ listen: {self.host}:{self.port} }}",
            *self.extra_config,
        ]
        return "\n".join(lines) + "\n"

    def _write_config(self) -> None:
        self.store.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config_text())

    def _argv(self) -> list[str]:
        return [self.binary, "-c", str(self.config_path)]

    def _ready(self) -> bool:
        # mqtt_connack speaks MQTT 3.1.1 (paho's default), which NATS accepts.
        return mqtt_connack(self.host, self.port) is not None


class Redis(Service):
    """A private redis-server on ``127.0.0.1:<free port>`` with its data in ``directory``.

    AOF is on by default (``appendfsync everysec``), so a graceful
    :meth:`restart` keeps every write.  A test that crashes Redis with
    :meth:`kill` and still expects its last writes wants ``appendfsync="always"``.
    """

    name = "redis"

    def __init__(
        self,
        directory: StrPath,
        *,
        port: int | None = None,
        appendonly: bool = True,
        appendfsync: Literal["always", "everysec", "no"] = "everysec",
        password: str | None = None,
        extra_config: str | Iterable[str] = (),
    ) -> None:
        super().__init__(directory, port)
        self.binary = _binary("redis-server")
        self.config_path = self.directory / "redis.conf"
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.password = password
        self.extra_config = [extra_config] if isinstance(extra_config, str) else list(extra_config)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    def config_text(self) -> str:
        lines = [
            "# generated by rsnotify.devstack",
            f"port {self.port}",
            f"bind {self.host}",
            f'dir "{self.directory}"',
            'save ""',
            f"appendonly {'yes' if self.appendonly else 'no'}",
            f"appendfsync {self.appendfsync}",
            "daemonize no",
            'logfile ""',
        ]
        if self.password:
            lines.append(f'requirepass "{self.password}"')
        lines += self.extra_config
        return "\n".join(lines) + "\n"

    def _write_config(self) -> None:
        self.config_path.write_text(self.config_text())

    def _argv(self) -> list[str]:
        return [self.binary, str(self.config_path)]

    def client(self, **kwargs: Any) -> redis.Redis:
        """A redis-py client for this server (``kwargs`` go to ``from_url``); caller closes."""
        return redis.Redis.from_url(self.url, **kwargs)

    def _ready(self) -> bool:
        # No retries: redis-py's default retry policy would hide a dead server
        # behind seconds of backoff.
        client = redis.Redis(
            host=self.host,
            port=self.port,
            password=self.password,
            socket_timeout=1.0,
            socket_connect_timeout=1.0,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            return bool(client.ping())
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            return False  # includes BusyLoadingError while the AOF is replayed
        finally:
            client.close()
