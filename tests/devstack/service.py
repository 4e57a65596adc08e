"""The lifecycle every server of the tests shares: :class:`Service`.

A service is a server process on a fixed loopback port that can be started,
stopped, crashed, paused and restarted.  Subclasses (brokers, Redis, static
web servers) write a config file and say how to probe readiness; this class
owns the rest.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Self

from .ports import HOST, free_port, listens_on
from .process import STOP_TIMEOUT, ManagedProcess, StrPath
from .waiting import DEFAULT_TIMEOUT, wait_for

__all__ = ["Service", "installed_binary"]


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
        return listens_on(self.process.pid, self.port) and self._ready()

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

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} running={self.running}>"


class _BindFailed(Exception):
    """The service could not bind its port (a race after free_port())."""


def installed_binary(name: str, fallback: str | None = None) -> str:
    found = shutil.which(name)
    if found:
        return found
    if fallback and os.access(fallback, os.X_OK):
        return fallback
    raise AssertionError(
        f"{name} is not installed; run `make services` (installs the Debian package)"
    )
