"""What rsnotify may send to a Source, and how politely: credentials, trust, proxy, pace.

A real Source may sit behind authentication, a private CA or a corporate
proxy, and it may ask clients to slow down.  :class:`HttpPolicy` says, once
per process, what the shared :class:`rsnotify.fetch.Fetcher` does about each:

* **Credentials** (``--header 'Name: value'``, ``--netrc``) go to the
  Source's own origin(s) and nowhere else: not to mirrors named by
  ``rs:ln rel="duplicate"``, not to the other end of a redirect to another
  origin.  The check is made per request hop, on the normalised origin
  (scheme, IDNA host, port), so ``http://a`` and ``https://a`` differ.
  aiohttp's own ``trust_env`` is deliberately *not* used for this reason: it
  reads ``~/.netrc`` for every host a request reaches, and a netrc ``default``
  entry would then be sent to any mirror or redirect target.
* **Trust**: ``--ca FILE`` adds a private CA to the system's store (mirrors on
  public CAs keep working).
* **Proxy**: ``HTTP_PROXY``/``HTTPS_PROXY``/``NO_PROXY`` (and their lower-case
  forms) as the standard library reads them, credentials in the proxy URL
  honoured.
* **Pace** (:class:`OriginGate`): per origin, at most ``max_rate`` request
  starts per second and ``max_connections`` connections, and no request
  before a ``Retry-After`` (RFC 9110 section 10.2.3) given with a 429 or 503
  has passed.
* **Identity**: a ``User-Agent`` naming rsnotify and, with ``--contact``, an
  address the Source's operator can write to.

Everything here is plain data and small pure functions, plus the gate, whose
only I/O is ``asyncio.sleep``.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import netrc
import os
import ssl
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime

import yarl

from . import __version__

__all__ = [
    "DEFAULT_DEADLINE",
    "DEFAULT_MAX_RETRY_AFTER",
    "HttpPolicy",
    "OriginGate",
    "parse_header",
    "parse_retry_after",
    "user_agent",
]

DEFAULT_DEADLINE = 300.0  # seconds for one whole exchange, body included
DEFAULT_MAX_RETRY_AFTER = 120.0  # longest Retry-After waited out inside one fetch
RETRY_AFTER_CAP = 3600.0  # a longer Retry-After still pauses the origin, for an hour

_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def user_agent(contact: str | None = None) -> str:
    """``rsnotify/<version>``, with ``(+<contact>)`` so a Source's operator can reach us."""
    base = f"rsnotify/{__version__}"
    if not contact:
        return base
    contact = contact.strip()
    if "@" in contact and ":" not in contact:
        contact = f"mailto:{contact}"
    return f"{base} (+{contact})"


def parse_header(text: str) -> tuple[str, str]:
    """``'Name: value'`` -> ``(name, value)``; ValueError with the reason otherwise.

    The name must be an RFC 9110 token (section 5.1) and the value must not
    hold a line break (which would smuggle a second header).
    """
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not name:
        raise ValueError(f"expected 'Name: value', got {text!r}")
    if not set(name) <= _TOKEN:
        raise ValueError(f"{name!r} is not a valid header name (RFC 9110 section 5.1)")
    if "\r" in value or "\n" in value or "\0" in value:
        raise ValueError(f"the value of {name} holds a line break or NUL")
    return name, value


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (RFC 9110 section 10.2.3), else None.

    Both forms: ``delay-seconds`` and an ``HTTP-date`` (compared with ``now``,
    a Unix time).  Negative or past values mean "now" (0); unparsable ones
    None, and the response is then treated like one without the header.
    """
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(int(text))
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # HTTP-dates are GMT (RFC 9110 section 5.6.7)
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


@functools.lru_cache(maxsize=8)
def _ssl_context(ca_file: str) -> ssl.SSLContext:
    context = ssl.create_default_context()  # the system store...
    context.load_verify_locations(cafile=ca_file)  # ...plus the private CA
    return context


@dataclass(frozen=True, slots=True)
class HttpPolicy:
    """How one process talks HTTP to Sources and mirrors (see the module docstring).

    ``credential_origins`` are origins (or URLs on them) that receive
    ``headers`` and the netrc entry; everything else receives neither.
    ``max_connections`` None leaves the component's own pool size.
    """

    headers: tuple[tuple[str, str], ...] = ()
    credential_origins: frozenset[str] = frozenset()
    netrc_file: str | None = None  # "" = $NETRC or ~/.netrc
    ca_file: str | None = None
    proxy_from_env: bool = True
    contact: str | None = None
    max_rate: float = 0.0  # request starts per second per origin; 0: no cap
    max_connections: int | None = None  # per origin
    deadline: float = DEFAULT_DEADLINE
    max_retry_after: float = DEFAULT_MAX_RETRY_AFTER
    _netrc_cache: dict[str, tuple[str, str] | None] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def with_credential_origins(self, urls: Iterable[str]) -> HttpPolicy:
        """The same policy, credentials scoped to the origins of ``urls``."""
        from .fetch import origin_of  # fetch imports this module

        origins = frozenset(origin_of(u) for u in urls if "://" in u)
        return dataclasses.replace(self, credential_origins=origins)

    @property
    def user_agent(self) -> str:
        return user_agent(self.contact)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS trust to use (None: aiohttp's default, the system store)."""
        return _ssl_context(self.ca_file) if self.ca_file else None

    def credentials(self, origin: str, url: str) -> dict[str, str]:
        """Headers to add to a request for ``url`` on ``origin`` (already normalised).

        Empty, without parsing ``url``, for an origin that gets no
        credentials: nearly every request of a Destination (its resource
        fetches), where the parse was a tenth of the client's own cost.
        """
        if origin not in self.credential_origins:
            return {}
        headers = dict(self.headers)
        if self.netrc_file is not None and not any(
            name.lower() == "authorization" for name in headers
        ):
            login = self._netrc_login(yarl.URL(url).host or "")
            if login is not None:
                token = base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode("ascii")
                headers["Authorization"] = f"Basic {token}"
        return headers

    def _netrc_login(self, host: str) -> tuple[str, str] | None:
        if host in self._netrc_cache:
            return self._netrc_cache[host]
        path = self.netrc_file or os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
        found: tuple[str, str] | None = None
        try:
            entry = netrc.netrc(path).authenticators(host)
        except FileNotFoundError:
            entry = None
        if entry is not None:
            login, _account, password = entry
            found = (login or "", password or "")
        self._netrc_cache[host] = found
        return found

    def check(self) -> None:
        """Raise ValueError naming the first unusable setting (at start-up, not mid-run)."""
        if self.ca_file is not None:
            try:
                _ssl_context(self.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"--ca {self.ca_file}: cannot load ({exc})") from None
        if self.netrc_file:
            try:
                netrc.netrc(self.netrc_file)
            except (OSError, netrc.NetrcParseError) as exc:
                raise ValueError(f"--netrc {self.netrc_file}: cannot read ({exc})") from None
        if self.max_rate < 0 or self.deadline <= 0 or self.max_retry_after < 0:
            raise ValueError("--max-rate must be >= 0 and --fetch-deadline > 0")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError("--max-connections must be >= 1")


@functools.lru_cache(maxsize=1)
def _env_proxies() -> dict[str, str]:
    return urllib.request.getproxies_environment()


def proxy_for(url: str, *, from_env: bool = True) -> tuple[str | None, tuple[str, str] | None]:
    """``(proxy URL without credentials, (user, password) or None)`` for ``url``.

    Reads the standard variables the way :mod:`urllib.request` does,
    ``NO_PROXY`` included; the environment is read once per process.
    """
    if not from_env:
        return None, None
    proxies = _env_proxies()
    if not proxies:  # the common case: nothing to parse the URL for
        return None, None
    parsed = yarl.URL(url)
    proxy = proxies.get(parsed.scheme)
    # proxy_bypass_environment: in urllib.request, undocumented; typeshed omits it.
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
    if not proxy or bypass(parsed.raw_host or "", proxies):
        return None, None
    target = yarl.URL(proxy if "://" in proxy else f"http://{proxy}")
    auth = (target.user or "", target.password or "") if target.user else None
    return str(target.with_user(None)), auth


class OriginGate:
    """Paces the requests to one origin: a request rate, and ``Retry-After`` pauses.

    :meth:`acquire` returns when this origin may receive the next request:
    not before a pause asked by the server has passed, and at least
    ``1 / rate`` seconds after the previous start.  Waiters re-check after
    every sleep, so a pause set while they sleep still holds them.
    """

    def __init__(self, rate: float = 0.0) -> None:
        self._interval = 1.0 / rate if rate > 0 else 0.0
        self._next = 0.0
        self._not_before = 0.0

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    @property
    def paused_for(self) -> float:
        """Seconds left of the current server-asked pause (0 when none)."""
        return max(0.0, self._not_before - self._now())

    async def acquire(self) -> float:
        """Wait for this origin's next slot; returns the seconds waited."""
        waited = 0.0
        while True:
            now = self._now()
            ready = max(self._not_before, self._next)
            if ready <= now:
                self._next = now + self._interval
                return waited
            await asyncio.sleep(ready - now)
            waited += ready - now

    def pause(self, seconds: float) -> None:
        """The server asked for ``seconds`` of quiet (capped at :data:`RETRY_AFTER_CAP`)."""
        until = self._now() + min(max(0.0, seconds), RETRY_AFTER_CAP)
        self._not_before = max(self._not_before, until)
