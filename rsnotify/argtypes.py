"""argparse ``type=`` functions: one per kind of value, shared by every subcommand.

An operator's mistake (``--poll 0``, ``--concurrency 0``, ``--redis notaurl``,
``--ws 127.0.0.1:99999``, ``--ws-token ""``, a Source directory that does not
exist) is refused while the arguments are parsed, before anything is opened,
bound or retried: argparse prints the usage line and one
``error: argument --x: <why>`` line and exits 2 (which the systemd units in
``deploy/`` do not restart).  Values from a ``--config`` file or an
``RSNOTIFY_*`` variable go through the very same functions
(:mod:`rsnotify.config`), so they are refused with the same words.

Every option of a kind uses the function of that kind, so an interval or a
port is checked the same way everywhere; a rule lives here once.  Each
function takes the text as typed and returns the value (or the text
unchanged, for addresses and URLs the services parse themselves).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import urlsplit

__all__ = [
    "REDIS_SCHEMES",
    "http_url",
    "listen_address",
    "log_level",
    "mqtt_url",
    "non_empty",
    "nonneg_int",
    "nonneg_number",
    "port",
    "positive_int",
    "positive_number",
    "redis_url",
    "source_location",
]

REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "redis+cluster")
HTTP_SCHEMES = ("http", "https")


F = TypeVar("F", bound=Callable[[str], object])
N = TypeVar("N", int, float)


def _refuse(message: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(message)


def _expects(what: str) -> Callable[[F], F]:
    """Name the kind of value for :meth:`rsnotify.config.Option.expected` ("a number")."""

    def mark(function: F) -> F:
        # A function attribute config.Option reads; functions have no declared attributes.
        function.expected = what  # type: ignore[attr-defined]
        return function

    return mark


# --- numbers ---------------------------------------------------------------------------


def _integer(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise _refuse(f"not an integer: {text!r}") from None


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _refuse(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise _refuse(f"must be a finite number, got {text.strip()}")
    return value


def _at_least(
    name: str, parse: Callable[[str], N], low: N, *, strict: bool, rule: str, doc: str
) -> Callable[[str], N]:
    """A ``type``: ``parse``, then refuse values below ``low`` (or equal to it: ``strict``)."""

    def check(text: str) -> N:
        value = parse(text)
        if value < low or (strict and value == low):
            raise _refuse(f"must be {rule}, got {text.strip()}")
        return value

    check.__name__ = check.__qualname__ = name
    check.__doc__ = doc
    return _expects("an integer" if parse is _integer else "a number")(check)


nonneg_int = _at_least(
    "nonneg_int", _integer, 0, strict=False, rule=">= 0", doc="A count that may be zero."
)
positive_int = _at_least(
    "positive_int", _integer, 1, strict=False, rule=">= 1", doc="A count of at least one."
)
# Zero is refused rather than read as "as fast as possible": --poll 0 made
# 5,673 requests to the Source in 6 s.
positive_number = _at_least(
    "positive_number",
    _number,
    0.0,
    strict=True,
    rule="a number > 0",
    doc="An interval or a timeout in seconds: finite and > 0.",
)
nonneg_number = _at_least(
    "nonneg_number",
    _number,
    0.0,
    strict=False,
    rule="a number >= 0",
    doc='A finite number >= 0 (a rate where 0 means "none").',
)


@_expects("an integer")
def port(text: str) -> int:
    """A TCP port, 0..65535 (0: the system picks a free one)."""
    value = _integer(text)
    if not 0 <= value <= 65535:
        raise _refuse(f"a port is 0..65535, got {value}")
    return value


# --- text ------------------------------------------------------------------------------


@_expects("a string")
def non_empty(text: str) -> str:
    """A token, secret or name: an empty one would mean "no check at all"."""
    if not text.strip():
        raise _refuse("must not be empty")
    return text


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


@_expects("a string")
def log_level(text: str) -> str:
    """``--log-level``: one of :data:`LOG_LEVELS` (any case)."""
    if text.strip().lower() not in LOG_LEVELS:
        raise _refuse(f"{text!r} is not a log level ({', '.join(LOG_LEVELS)})")
    return text.strip().lower()


@_expects("a string")
def listen_address(text: str) -> str:
    """``HOST:PORT`` to listen on (``[::1]:8080`` for IPv6; an empty HOST is 127.0.0.1)."""
    host, sep, number = text.strip().rpartition(":")
    if not sep:
        raise _refuse(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:8765)")
    if host.startswith("[") != host.endswith("]") or (":" in host and not host.startswith("[")):
        raise _refuse(f"{text!r}: write an IPv6 address in brackets, e.g. [::1]:8765")
    try:
        port(number)
    except argparse.ArgumentTypeError as exc:
        raise _refuse(f"{text!r}: {exc}") from None
    return text.strip()


def _url(text: str, schemes: tuple[str, ...], what: str, *, host: bool) -> str:
    try:
        parts = urlsplit(text.strip())
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError as exc:
        raise _refuse(f"{text!r} is not {what}: {exc}") from None
    if parts.scheme.lower() not in schemes:
        listed = ", ".join(f"{s}://" for s in schemes)
        raise _refuse(f"{text!r} is not {what} (the scheme must be {listed})")
    if host and not parts.hostname:
        raise _refuse(f"{text!r} is not {what}: it names no host")
    return text.strip()


@_expects("a string")
def redis_url(text: str) -> str:
    """``redis://[user:pass@]host:port/db``, ``rediss://...``, ``unix:///path`` or Sentinel.

    ``redis+sentinel://host:port[,host:port...]/service[/db]`` and
    ``redis+cluster://host:port[,host:port...][/0]``: see :mod:`rsnotify.redisurl`.
    """
    if text.strip().lower().startswith("redis+sentinel://"):
        from .redisurl import parse_sentinel  # redis-py only when a Sentinel URL is given

        try:
            parse_sentinel(text)
        except ValueError as exc:
            raise _refuse(f"{text!r} is not a Redis Sentinel URL: {exc}") from None
        return text.strip()
    if text.strip().lower().startswith("redis+cluster://"):
        from .redisurl import parse_cluster  # redis-py only when a Cluster URL is given

        try:
            parse_cluster(text)
        except ValueError as exc:
            raise _refuse(f"{text!r} is not a Redis Cluster URL: {exc}") from None
        return text.strip()
    return _url(text, REDIS_SCHEMES, "a Redis URL", host=False)


@_expects("a string")
def http_url(text: str) -> str:
    """An absolute ``http(s)://host/...`` URL."""
    return _url(text, HTTP_SCHEMES, "an absolute http(s) URL", host=True)


@_expects("a string")
def mqtt_url(text: str) -> str:
    """``mqtt://[user:pass@]host[:port]`` or ``mqtts://...`` (rules: :mod:`.transport.mqtturl`)."""
    from .transport.mqtturl import InvalidBrokerURL, parse_broker_url

    try:
        parse_broker_url(text)
    except InvalidBrokerURL as exc:
        raise _refuse(str(exc)) from None
    return text.strip()


@_expects("a string")
def source_location(text: str) -> str:
    """The publisher's SOURCE: an http(s) URL, or a directory holding the Source's documents."""
    if "://" in text:
        return http_url(text)
    if not os.path.isdir(text):
        reason = "not a directory" if os.path.exists(text) else "no such directory"
        raise _refuse(
            f"{text!r}: {reason} (SOURCE is an http(s) URL or a local directory "
            "holding the Source's documents)"
        )
    return text
