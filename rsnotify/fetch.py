"""The one HTTP client every rsnotify component shares.

Publisher polling, subscriber fetching and discovery all need the same few
things from HTTP: conditional GET (ETag / If-Modified-Since) so polling an
unchanged Change List costs a 304, ranges for the tail of a growing list, a
hard byte limit enforced *while* reading (a hostile Source must not be able to
make us buffer a gigabyte), timeouts and an overall deadline, and an origin
allow-list so a forged notification cannot make a subscriber fetch from
anywhere (SSRF).  This module is that thin adapter over :mod:`aiohttp`; it
knows nothing about ResourceSync.  What it may send and how politely
(credentials, CA, proxy, pace, ``Retry-After``) is the process's
:class:`~rsnotify.httppolicy.HttpPolicy`; which validators it hands back for
the next conditional request follows :mod:`rsnotify.validators`.

Errors, all documented and all under :class:`rsnotify.errors.RsNotifyError`:

* :class:`rsnotify.errors.FetchError` -- unreachable server, timeout, HTTP
  status other than 2xx/304 (``.status`` set), too many redirects, a 206 whose
  ``Content-Range`` does not start where we asked, an unsupported scheme.
* :class:`ResponseTooLarge` -- the body would exceed ``max_bytes``.  It is both
  a ``FetchError`` and a :class:`rsnotify.errors.DocumentTooLarge`, so callers
  that handle "could not fetch" and callers that handle "document refused for
  size" both catch it without knowing about this module.
* :class:`DeadlineExceeded` -- the exchange (headers and body) outlasted the
  overall deadline, however steadily the server trickled bytes.
* :class:`UnwantedEncoding` -- a ``Content-Encoding`` on a response to a
  request that asked for ``identity``.  Compressed bodies are accepted only
  where what they may expand to is already bounded by the 50 MB document
  limit (``max_bytes``); a fetch allowed more (a resource of unknown length,
  up to 1 GiB) asks for ``identity``, so a small gzip response can never
  become a gigabyte on disk.
* :class:`OriginNotAllowed` -- a ``FetchError`` raised *before any connection*
  when the URL (or any redirect hop) is outside ``allowed_origins``.

Redirects are followed here, not by aiohttp, precisely so every hop is checked
against the allow-list, and so credentials are attached per hop, only to the
Source's own origin.  The check compares scheme, IDNA host and port; it does
not stop a permitted host name from resolving to a private address.

Why one module of ~720 lines: most of it is one class, :class:`Fetcher`,
and every request goes through its one path (``get`` is ``stream`` read
whole; every redirect hop goes round it again) with the same checks in the
same order -- origin allow-list, per-host slot, credentials for the Source's
origin only, deadline, byte limit, encoding -- so a check added once covers
every caller.  Policy is elsewhere and pure: :mod:`rsnotify.httppolicy` (what
may be sent, pace, ``Retry-After``), :mod:`rsnotify.validators`
(conditional-request validators), :mod:`rsnotify.links` (``Link`` headers).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
from collections.abc import AsyncIterator, Collection, Mapping
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import urljoin

import aiohttp
import yarl

from .errors import (
    DeadlineExceeded,
    FetchError,
    OriginNotAllowed,
    ResponseTooLarge,
    UnwantedEncoding,
)
from .httppolicy import HttpPolicy, OriginGate, parse_retry_after, proxy_for, user_agent
from .links import has_rel, parse_link_header
from .validators import is_strong_etag, strong_last_modified

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DeadlineExceeded",
    "FetchResult",
    "FetchStream",
    "Fetcher",
    "OriginNotAllowed",
    "ResponseTooLarge",
    "UnwantedEncoding",
    "check_origin",
    "has_rel",
    "origin_of",
    "parse_link_header",
]

log = logging.getLogger("rsnotify.fetch")

DEFAULT_MAX_BYTES = 50_000_000  # the Sitemap protocol's 50 MB document limit
USER_AGENT = user_agent()
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_SCHEMES = frozenset({"http", "https"})
# A body keeps earning time at this rate: a large resource or dump package
# arriving at 100 kB/s or better is never cut by the deadline; a trickle is.
DEADLINE_CREDIT_RATE = 100_000  # bytes per second
_BUSY = frozenset({429, 503})  # statuses whose Retry-After is honoured (RFC 9110 10.2.3)


# --- pure helpers -------------------------------------------------------------


# "scheme://authority" followed by the end, "/", "?" or "#", with an authority of
# letters, digits and ".:_-" only (no user info, brackets, escapes or spaces): a
# URL whose origin is that prefix's, however its path goes on.
_PLAIN_AUTHORITY = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[A-Za-z0-9.:_-]+)(?:[/?#]|$)")


def origin_of(url: str) -> str:
    """``scheme://host:port`` with the IDNA host and the default port made explicit.

    Explicit ports make ``http://a`` and ``http://a:80`` the same origin, and
    IDNA makes ``bücher.example`` and ``xn--bcher-kva.example`` the same, so the
    allow-list cannot be bypassed by spelling a host differently.  Memoized
    per plain ``scheme://authority`` prefix (a catch-up checks thousands of
    URLs on one origin, each parsed whole before), else per URL.
    """
    plain = _PLAIN_AUTHORITY.match(url) if isinstance(url, str) else None
    if plain is not None:
        with contextlib.suppress(FetchError):  # then the whole URL says why, by its name
            return _origin_of(plain[1])
    return _origin_of(url)


@functools.lru_cache(maxsize=16_384)
def _origin_of(url: str) -> str:
    """:func:`origin_of` by parsing ``url`` (pure: memoized; invalid URLs raise, not kept)."""
    try:
        parsed = yarl.URL(url)
        scheme = parsed.scheme.lower()
        host = (parsed.raw_host or "").lower()
        port = parsed.port
    except (ValueError, TypeError, UnicodeError) as exc:
        raise FetchError(str(url), f"invalid URL ({exc})") from None
    if not scheme or not host:
        raise FetchError(url, "not an absolute URL (scheme and host are required)")
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}" if port is not None else f"{scheme}://{host}"


def _normalise_origins(allowed: Collection[str]) -> frozenset[str]:
    # Entries may be origins or any URL on the origin (e.g. a Source's base URL).
    if isinstance(allowed, frozenset) and all(item in _ORIGINS for item in allowed):
        return allowed  # already normalised (the applier keeps its set this way)
    normalised = frozenset(origin_of(item) for item in allowed)
    _ORIGINS.update(normalised)
    return normalised


_ORIGINS: set[str] = set()  # strings known to be normalised origins


def check_origin(url: str, allowed: Collection[str] | None) -> None:
    """Raise :class:`OriginNotAllowed` unless ``url``'s origin is in ``allowed``.

    ``None`` means no restriction.  An empty collection allows nothing.
    """
    if allowed is None:
        return
    origin = origin_of(url)
    permitted = _normalise_origins(allowed)
    if origin not in permitted:
        raise OriginNotAllowed(url, origin, permitted)


def _content_range_start(value: str | None) -> int | None:
    """First byte position of ``Content-Range: bytes START-END/TOTAL``, else None."""
    if not value:
        return None
    unit, _, spec = value.strip().partition(" ")
    if unit.lower() != "bytes":
        return None
    first, dash, _ = spec.partition("-")
    if not dash or not first.strip().isdigit():
        return None
    return int(first)


# --- results ------------------------------------------------------------------


@dataclass(slots=True)
class FetchResult:
    """One HTTP response, fully read (``get``) or described before streaming.

    ``headers`` has lower-cased names; repeated headers are joined with ", " as
    HTTP allows, and ``links`` gives every ``Link`` header parsed, with targets
    resolved against ``final_url``.  ``etag``/``last_modified`` are the values
    to send next time: ``last_modified`` is None when the response's date
    makes it weak (:func:`rsnotify.validators.strong_last_modified`; the raw
    value stays in ``headers``), and on a 304 without them the validators that
    were sent are echoed back, since they are still current.  ``partial`` is True for a 206,
    and ``range_start`` is then the first byte of ``body`` within the resource.
    """

    url: str
    final_url: str
    status: int
    headers: dict[str, str]
    link_values: tuple[str, ...] = ()  # each Link header as received
    body: bytes = b""
    etag: str | None = None
    sent_last_modified: str | None = None  # the If-Modified-Since sent, echoed on a 304
    not_modified: bool = False
    partial: bool = False
    range_start: int | None = None

    @property
    def last_modified(self) -> str | None:
        """The ``Last-Modified`` to send next time (class docstring).

        Worked out when read, not per response (two HTTP dates parsed, 9 us):
        a Destination's resource fetches never read it.
        """
        # A Last-Modified within a second of the response's Date may hide a
        # second change in the same second: it is not handed back for reuse.
        headers = self.headers
        modified = strong_last_modified(headers.get("last-modified"), headers.get("date"))
        return modified or (self.sent_last_modified if self.not_modified else None)

    @property
    def content_type(self) -> str:
        """The media type without parameters, lower-cased ("" when absent)."""
        return self.headers.get("content-type", "").split(";", 1)[0].strip().lower()

    @property
    def links(self) -> list[tuple[str, dict[str, str]]]:
        """Every ``Link`` header parsed, targets resolved against ``final_url``.

        Parsed when asked, not per response: a Destination fetches thousands
        of resources a second, each often with a ``Link`` to its Capability
        List (Z39.99 section 12), and nobody reads those (9 us a response).
        """
        return [
            (urljoin(self.final_url, target), params)
            for value in self.link_values
            for target, params in parse_link_header(value)
        ]

    def links_with_rel(self, rel: str) -> list[str]:
        """Targets of the ``Link`` headers whose ``rel`` includes ``rel``."""
        return [target for target, params in self.links if has_rel(params, rel)]


class FetchStream:
    """An open response whose body is read chunk by chunk.

    ``result`` describes the response (its ``body`` stays empty); iterate the
    stream for the body.  The byte limit and the fetch deadline (``expires``,
    a loop time) are enforced as chunks arrive.
    """

    def __init__(
        self,
        result: FetchResult,
        response: aiohttp.ClientResponse | None,
        *,
        max_bytes: int,
        chunk_size: int,
        expires: float | None = None,
        deadline: float = 0.0,
    ):
        self.result = result
        self.received = 0
        self._response = response
        self._max_bytes = max_bytes
        self._chunk_size = chunk_size
        self._expires = expires
        self._deadline = deadline

    def _fail(self, exc: FetchError) -> FetchError:
        assert self._response is not None
        # Closing (not releasing) drops the connection, so the rest of the body
        # is never read from the socket.
        self._response.close()
        return exc

    async def __aiter__(self) -> AsyncIterator[bytes]:
        response = self._response
        if response is None:
            return
        url = self.result.url
        content = response.content
        while True:
            try:
                async with asyncio.timeout_at(self._expiry()):
                    chunk = await content.read(self._chunk_size)
            except TimeoutError:
                if self._expires is not None and self._past_deadline():
                    raise self._fail(DeadlineExceeded(url, self._deadline, self.received)) from None
                raise self._fail(_translate(url, TimeoutError())) from None
            except aiohttp.ClientError as exc:
                raise self._fail(_translate(url, exc)) from exc
            if not chunk:
                return
            self.received += len(chunk)
            if self.received > self._max_bytes:
                raise self._fail(ResponseTooLarge(url, self._max_bytes))
            yield chunk

    def _expiry(self) -> float | None:
        """When the exchange must end: the deadline, extended by what the body earned."""
        if self._expires is None:
            return None
        return self._expires + self.received / DEADLINE_CREDIT_RATE

    def _past_deadline(self) -> bool:
        expiry = self._expiry()
        return expiry is not None and asyncio.get_running_loop().time() >= expiry

    @property
    def length(self) -> int | None:
        """The body's length in bytes when the response declares it exactly, else None.

        Declared means a ``Content-Length`` on an identity-encoded body: with a
        ``Content-Encoding`` aiohttp decodes, and the header counts the
        encoded bytes, not what :meth:`read` returns.
        """
        response = self._response
        if response is None:
            return 0
        if "content-encoding" in self.result.headers:
            return None
        return response.content_length

    async def read(self) -> bytes:
        """The whole (limited) body.

        A body of declared :attr:`length` within the limit is read with one
        call (what a small resource costs is then mostly this call, not a
        chunk loop); anything else is read chunk by chunk, the limits enforced
        as chunks arrive.
        """
        response = self._response
        declared = self.length
        if response is None or declared is None or declared > self._max_bytes:
            return b"".join([chunk async for chunk in self])
        try:
            if response.content.is_eof():
                # All of it arrived with the headers (a small resource nearly
                # always): nothing to wait for, so no timer to arm and cancel.
                body = await response.read()
            else:
                async with asyncio.timeout_at(self._expires):  # declared small: no credit
                    body = await response.read()
        except TimeoutError:
            if self._past_deadline():
                raise self._fail(
                    DeadlineExceeded(self.result.url, self._deadline, self.received)
                ) from None
            raise self._fail(_translate(self.result.url, TimeoutError())) from None
        except aiohttp.ClientError as exc:
            raise self._fail(_translate(self.result.url, exc)) from exc
        self.received = len(body)
        if self.received > self._max_bytes:  # aiohttp stops at Content-Length; belt and braces
            raise self._fail(ResponseTooLarge(self.result.url, self._max_bytes))
        return body


def _translate(url: str, exc: BaseException, timeout: float | None = None) -> FetchError:
    """A clear, URL-naming FetchError for a transport-level failure."""
    if isinstance(exc, TimeoutError):
        after = f" after {timeout:g}s" if timeout is not None else ""
        return FetchError(url, f"timed out{after} (server too slow or unresponsive)")
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return FetchError(
            url, f"TLS certificate not trusted ({exc.certificate_error}; a private CA: --ca FILE)"
        )
    if isinstance(exc, aiohttp.ClientConnectorError):
        return FetchError(url, f"unreachable server ({exc.os_error or exc})")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return FetchError(url, f"truncated or corrupt response body ({exc})")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return FetchError(url, "server closed the connection before responding")
    if isinstance(exc, aiohttp.InvalidURL):
        return FetchError(url, f"invalid URL ({exc})")
    return FetchError(url, f"request failed ({type(exc).__name__}: {exc})")


# --- the client -----------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _client_timeout(timeout: float) -> aiohttp.ClientTimeout:
    """Per-hop timeouts of :meth:`Fetcher.stream`, made once per value (they are immutable)."""
    return aiohttp.ClientTimeout(
        total=None, connect=timeout, sock_connect=timeout, sock_read=timeout
    )


class Fetcher:
    """One keep-alive HTTP client (one :class:`aiohttp.ClientSession`) per component.

    Use as ``async with Fetcher() as fetcher:`` or call :meth:`close`
    explicitly.  The session is created on first use, inside the running loop.
    Cookies are never stored: every request is independent of the last.
    ``allowed_origins`` (origins or URLs on them) restricts every request and
    every redirect hop unless a call passes its own set.  ``policy`` says
    which credentials go to which origin, the TLS trust, the proxy, the pace
    per origin and the deadline.
    """

    def __init__(
        self,
        *,
        limit: int = 100,
        limit_per_host: int = 8,
        allowed_origins: Collection[str] | None = None,
        max_redirects: int = 10,
        chunk_size: int = 65536,
        user_agent: str | None = None,
        policy: HttpPolicy | None = None,
    ):
        self.policy = policy if policy is not None else HttpPolicy()
        self.limit = limit
        self.limit_per_host = self.policy.max_connections or limit_per_host
        self.allowed_origins = (
            None if allowed_origins is None else _normalise_origins(allowed_origins)
        )
        self.max_redirects = max_redirects
        self.chunk_size = chunk_size
        self.user_agent = user_agent or self.policy.user_agent
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._gates: dict[str, OriginGate] = {}
        self._slots: dict[str, asyncio.Semaphore] = {}

    async def __aenter__(self) -> Fetcher:
        self._ensure_session()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the session and its pooled connections; idempotent."""
        self._closed = True
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("Fetcher is closed")
        if self._session is None:
            ssl_context = self.policy.ssl_context()
            connector = aiohttp.TCPConnector(
                limit=self.limit,
                limit_per_host=self.limit_per_host,
                ssl=ssl_context if ssl_context is not None else True,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                headers={"User-Agent": self.user_agent},
                raise_for_status=False,
                # Proxies come from the policy (the same variables); trust_env
                # would also send ~/.netrc credentials to every host.
                trust_env=False,
            )
        return self._session

    def check_origin(self, url: str, allowed: Collection[str] | None = None) -> None:
        """Raise :class:`OriginNotAllowed` if ``url`` is outside ``allowed`` (or the default)."""
        check_origin(url, self.allowed_origins if allowed is None else allowed)

    def gate(self, origin: str) -> OriginGate:
        """The pace keeper of one origin (created on first use)."""
        gate = self._gates.get(origin)
        if gate is None:
            gate = self._gates[origin] = OriginGate(self.policy.max_rate)
        return gate

    async def get(
        self,
        url: str,
        *,
        etag: str | None = None,
        last_modified: str | None = None,
        range_start: int | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        timeout: float = 30.0,
        allowed_origins: Collection[str] | None = None,
    ) -> FetchResult:
        """GET ``url`` and read the whole body; ``timeout`` bounds the entire exchange.

        Sends ``If-None-Match``/``If-Modified-Since``/``Range: bytes=N-`` when
        asked (a Range only with a strong ``etag``: :mod:`rsnotify.validators`).
        A 304 returns ``not_modified=True`` with an empty body; a 206 returns
        ``partial=True``.  A server that ignores ``Range`` answers 200 with the
        full body: check ``partial`` before appending.  Time spent waiting for
        the origin's turn (its rate, a ``Retry-After``) is not part of
        ``timeout``.
        """
        async with self.stream(
            url,
            etag=etag,
            last_modified=last_modified,
            range_start=range_start,
            max_bytes=max_bytes,
            timeout=timeout,
            allowed_origins=allowed_origins,
            deadline=min(timeout, self.policy.deadline),
        ) as response:
            body = await response.read()
        response.result.body = body
        return response.result

    @contextlib.asynccontextmanager
    async def stream(
        self,
        url: str,
        *,
        etag: str | None = None,
        last_modified: str | None = None,
        range_start: int | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        timeout: float = 30.0,
        allowed_origins: Collection[str] | None = None,
        deadline: float | None = None,
    ) -> AsyncIterator[FetchStream]:
        """Open ``url`` for reading in chunks: ``async with f.stream(u) as s: async for c in s``.

        Same requests, statuses and errors as :meth:`get`.  ``timeout`` bounds
        each connect and each wait for data; ``deadline`` (default: the
        policy's, ``--fetch-deadline``) bounds the whole exchange, body
        included, so a server trickling a byte now and then cannot hold a
        transfer slot for ever.
        """
        allowed = self.allowed_origins if allowed_origins is None else allowed_origins
        deadline = self.policy.deadline if deadline is None else deadline
        headers: dict[str, str] = {}
        if etag:
            headers["If-None-Match"] = etag
        if last_modified:
            headers["If-Modified-Since"] = last_modified
        if range_start is not None and is_strong_etag(etag):
            if range_start < 0:
                raise FetchError(url, f"invalid range start {range_start}")
            headers["Range"] = f"bytes={range_start}-"
        else:
            range_start = None  # RFC 9110 8.8.3: ranges only of a strongly tagged representation
        if range_start is not None or max_bytes > DEFAULT_MAX_BYTES:
            # Byte offsets are only meaningful on the unencoded representation,
            # and a body allowed past the document limit must not be a small
            # compressed one expanding to it (issue 22: 2 MB of gzip, 821 MB).
            headers["Accept-Encoding"] = "identity"
        async with self._slot(url):
            response, current, expires = await self._open(url, headers, allowed, timeout, deadline)
            try:
                yield self._reading(
                    url,
                    current,
                    response,
                    expires,
                    deadline,
                    etag=etag,
                    last_modified=last_modified,
                    range_start=range_start,
                    max_bytes=max_bytes,
                    identity="Accept-Encoding" in headers,
                )
            except BaseException:
                # Closing (not releasing) drops the connection: the rest of a
                # body nobody read must not be read from the socket.
                response.close()
                raise
            else:
                response.release()

    def _slot(self, url: str) -> asyncio.Semaphore:
        """The origin's concurrency cap, held from before its turn until the body is read.

        Taken before :class:`OriginGate` is asked, so a request queued behind
        one that is answered 429 waits out that ``Retry-After`` too, instead
        of going out on the connection the busy answer just freed.
        """
        origin = origin_of(url)
        slot = self._slots.get(origin)
        if slot is None:
            slot = self._slots[origin] = asyncio.Semaphore(self.limit_per_host)
        return slot

    def _reading(
        self,
        url: str,
        current: str,
        response: aiohttp.ClientResponse,
        expires: float,
        deadline: float,
        *,
        etag: str | None = None,
        last_modified: str | None = None,
        range_start: int | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        identity: bool = False,
    ) -> FetchStream:
        """The open response as a :class:`FetchStream`, or why it is refused.

        A plain call, not a context of its own: :meth:`stream` closes the
        response if this raises and releases it after (a second
        generator-based context per request was a tenth of this client's
        own cost per small fetch).
        """
        result = self._describe(url, current, response, etag, last_modified, range_start)
        if result.not_modified:
            return FetchStream(result, None, max_bytes=max_bytes, chunk_size=self.chunk_size)
        declared = response.content_length
        if (
            declared is not None
            and declared > max_bytes
            and "content-encoding" not in result.headers
        ):
            raise ResponseTooLarge(url, max_bytes, declared=declared)
        encoding = result.headers.get("content-encoding", "identity").strip().lower()
        if identity and encoding != "identity":
            raise UnwantedEncoding(url, encoding)
        return FetchStream(
            result,
            response,
            max_bytes=max_bytes,
            chunk_size=self.chunk_size,
            expires=expires,
            deadline=deadline,
        )

    async def _open(
        self,
        url: str,
        headers: Mapping[str, str],
        allowed: Collection[str] | None,
        timeout: float,
        deadline: float,
    ) -> tuple[aiohttp.ClientResponse, str, float]:
        """Send the request, following redirects and waiting out ``Retry-After``.

        Returns the final response (not a redirect, not a busy answer we
        could wait out), its URL and the loop time at which the exchange's
        deadline expires.  Each hop waits for its origin's turn first, then
        gets its own headers: the credentials only on a credential origin.
        """
        session = self._ensure_session()
        client_timeout = _client_timeout(timeout)
        loop = asyncio.get_running_loop()
        policy = self.policy
        current = url
        hops = 0
        waited = 0.0
        expires: float | None = None
        response: aiohttp.ClientResponse | None = None
        try:
            while True:
                origin = origin_of(current)
                if origin.split(":", 1)[0] not in _SCHEMES:
                    raise FetchError(current, "unsupported URL scheme (only http and https)")
                check_origin(current, allowed)
                gate = self.gate(origin)
                if await gate.acquire() > 0 or expires is None:
                    expires = loop.time() + deadline  # the exchange starts now
                hop_headers = dict(headers)
                hop_headers.update(policy.credentials(origin, current))
                proxy, proxy_auth = proxy_for(current, from_env=policy.proxy_from_env)
                async with asyncio.timeout_at(expires):
                    response = await session.get(
                        current,
                        headers=hop_headers,
                        allow_redirects=False,
                        timeout=client_timeout,
                        proxy=proxy,
                        proxy_auth=aiohttp.BasicAuth(*proxy_auth) if proxy_auth else None,
                    )
                status = response.status
                if status in _REDIRECTS:
                    location = response.headers.get("Location")
                    response.release()
                    response = None
                    if not location:
                        raise FetchError(url, f"redirect from {current} without a Location header")
                    hops += 1
                    if hops > self.max_redirects:
                        raise FetchError(
                            url, f"too many redirects (more than {self.max_redirects})"
                        )
                    current = urljoin(current, location)
                    continue
                if status in _BUSY:
                    delay = parse_retry_after(response.headers.get("Retry-After"))
                    if delay is not None:
                        gate.pause(delay)
                        if waited + delay <= policy.max_retry_after:
                            waited += delay
                            log.info(
                                "%s answered %d with Retry-After %gs: waiting before the "
                                "next request to %s",
                                current,
                                status,
                                delay,
                                origin,
                            )
                            response.release()
                            response = None
                            continue
                return response, current, expires
        except TimeoutError as exc:
            if response is not None:
                response.close()
            where = url if current == url else f"{url} (redirected to {current})"
            if expires is not None and loop.time() >= expires and deadline < timeout:
                raise DeadlineExceeded(where, deadline, 0) from None
            raise _translate(where, exc, min(timeout, deadline)) from None
        except aiohttp.ClientError as exc:
            if response is not None:
                response.close()
            where = url if current == url else f"{url} (redirected to {current})"
            raise _translate(where, exc, timeout) from exc
        except ValueError as exc:  # yarl on a malformed URL
            raise FetchError(current, f"invalid URL ({exc})") from None

    def _describe(
        self,
        url: str,
        final_url: str,
        response: aiohttp.ClientResponse,
        etag: str | None,
        last_modified: str | None,
        range_start: int | None,
    ) -> FetchResult:
        """Turn status and headers into a FetchResult, or raise for a refused status."""
        status = response.status
        where = url if final_url == url else f"{url} (redirected to {final_url})"
        if status != 304 and not 200 <= status < 300:
            reason = response.reason or ""
            message = f"HTTP {status} {reason}".rstrip()
            retry_after = response.headers.get("Retry-After")
            if status in _BUSY and retry_after:
                message += f" (Retry-After {retry_after}: longer than --max-retry-after)"
            raise FetchError(where, message, status=status)
        headers: dict[str, str] = {}
        for name, value in response.headers.items():  # one pass; repeats joined as RFC 9110 5.3
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        partial = status == 206
        start: int | None = None
        if partial:
            start = _content_range_start(headers.get("content-range"))
            if range_start is None or start != range_start:
                raise FetchError(
                    where,
                    f"206 Partial Content starting at {start} but asked for {range_start} "
                    f"(Content-Range: {headers.get('content-range')!r})",
                    status=status,
                )
        not_modified = status == 304
        return FetchResult(
            url=url,
            final_url=final_url,
            status=status,
            headers=headers,
            link_values=tuple(response.headers.getall("Link", ())),
            etag=headers.get("etag") or (etag if not_modified else None),
            sent_last_modified=last_modified,
            not_modified=not_modified,
            partial=partial,
            range_start=start,
        )
