"""Validators, credentials, proxy, pace and the fetch limits of issue 22 item 6.

Pure rules are tested as functions; the rest against real aiohttp servers on
loopback ports that log every request they receive (time, path, headers), so
"the token never went there" and "the wait was honoured" are read from what
the servers saw.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import time
import zlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from rsnotify import httppolicy
from rsnotify.changes import access
from rsnotify.changes.access import HttpAccess
from rsnotify.changes.incremental import EntryCounter
from rsnotify.errors import TooManyEntries
from rsnotify.fetch import DeadlineExceeded, Fetcher, UnwantedEncoding
from rsnotify.httppolicy import HttpPolicy, OriginGate, parse_header, parse_retry_after
from rsnotify.metrics import serving
from rsnotify.validators import is_strong_etag, strong_last_modified

TOKEN = "Bearer s3cret-token"


def _http_date(when: datetime) -> str:
    return format_datetime(when, usegmt=True)


NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


# --- pure rules ------------------------------------------------------------------


def test_last_modified_is_strong_only_a_second_before_date():
    """RFC 9110 section 8.8.2.2."""
    lm = _http_date(NOW)
    assert strong_last_modified(lm, _http_date(NOW + timedelta(seconds=1))) == lm
    assert strong_last_modified(lm, _http_date(NOW + timedelta(days=3))) == lm
    assert strong_last_modified(lm, _http_date(NOW)) is None  # same second: weak
    assert strong_last_modified(lm, None) is None  # no Date to compare with: weak
    assert strong_last_modified(lm, "garbage") is None
    assert strong_last_modified("garbage", _http_date(NOW)) is None
    assert strong_last_modified(None, _http_date(NOW)) is None


def test_entity_tag_strength():
    assert is_strong_etag('"abc"')
    assert is_strong_etag('"6b07d9ab-3"')  # nginx
    assert not is_strong_etag('W/"abc"')  # Apache within a second, gzip filters
    assert not is_strong_etag(None)
    assert not is_strong_etag("")
    assert not is_strong_etag("abc")  # not a quoted entity tag at all


def test_retry_after_both_forms():
    """RFC 9110 section 10.2.3: delay-seconds or an HTTP-date."""
    assert parse_retry_after("5") == 5.0
    assert parse_retry_after(" 0 ") == 0.0
    now = NOW.timestamp()
    assert parse_retry_after(_http_date(NOW + timedelta(seconds=30)), now=now) == 30.0
    assert parse_retry_after(_http_date(NOW - timedelta(seconds=30)), now=now) == 0.0
    assert parse_retry_after("-3") is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_header_option_parsing():
    assert parse_header("Authorization: Bearer x:y") == ("Authorization", "Bearer x:y")
    for bad in ("no colon", ": value", "Bad Name: x", "X-A: a\r\nX-B: b"):
        with pytest.raises(ValueError):
            parse_header(bad)


def test_user_agent_carries_a_contact():
    assert httppolicy.user_agent().startswith("rsnotify/")
    assert httppolicy.user_agent("ops@example.org").endswith("(+mailto:ops@example.org)")
    assert httppolicy.user_agent("https://example.org/bot").endswith("(+https://example.org/bot)")


_ENTRY = b"<url><loc>http://x/r</loc></url>"


@given(
    n=st.integers(min_value=0, max_value=40),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=12),
    index=st.booleans(),
)
def test_entry_counter_counts_each_entry_once_however_the_bytes_are_cut(n, cuts, index):
    entry = b"<sitemap ><loc>http://x/l</loc></sitemap>" if index else _ENTRY
    root = b"sitemapindex" if index else b"urlset"
    document = b"<?xml version='1.0'?><" + root + b">" + entry * n + b"</" + root + b">"
    counter = EntryCounter()
    last = 0
    for cut in sorted(c % (len(document) + 1) for c in cuts):
        counter.feed(document[last:cut])
        last = cut
    assert counter.feed(document[last:]) == n


def test_credentials_go_only_to_the_credential_origins(tmp_path):
    netrc = tmp_path / "netrc"
    netrc.write_text(
        "machine 127.0.0.1 login alice password wonderland\ndefault login eve password x\n"
    )
    policy = HttpPolicy(headers=(("X-Key", "k"),), netrc_file=str(netrc))
    scoped = policy.with_credential_origins(["http://127.0.0.1:8000/cap.xml"])
    sent = scoped.credentials("http://127.0.0.1:8000", "http://127.0.0.1:8000/r/a.txt")
    assert sent["X-Key"] == "k"
    assert sent["Authorization"] == "Basic YWxpY2U6d29uZGVybGFuZA=="  # alice:wonderland
    assert (
        scoped.credentials("http://127.0.0.1:8001", "http://127.0.0.1:8001/r/a.txt") == {}
    )  # other port
    assert (
        scoped.credentials("https://127.0.0.1:8000", "https://127.0.0.1:8000/r/a.txt") == {}
    )  # other scheme
    assert (
        policy.credentials("http://127.0.0.1:8000", "http://127.0.0.1:8000/r/a.txt") == {}
    )  # not scoped yet


def test_proxy_from_the_standard_variables(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://user:pw@proxy.test:3128")
    monkeypatch.setenv("NO_PROXY", "skip.test")
    httppolicy._env_proxies.cache_clear()
    try:
        assert httppolicy.proxy_for("http://source.test/x") == (
            "http://proxy.test:3128",
            ("user", "pw"),
        )
        assert httppolicy.proxy_for("http://skip.test/x") == (None, None)
        assert httppolicy.proxy_for("http://source.test/x", from_env=False) == (None, None)
    finally:
        httppolicy._env_proxies.cache_clear()


async def test_gate_holds_requests_during_a_pause_and_paces_the_rate():
    loop = asyncio.get_running_loop()
    gate = OriginGate(rate=20.0)  # one start per 50 ms
    starts = []
    for _ in range(4):
        await gate.acquire()
        starts.append(loop.time())
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(gap >= 0.049 for gap in gaps), gaps
    gate.pause(0.3)
    paused_at = loop.time()
    waiters = [asyncio.create_task(gate.acquire()) for _ in range(3)]
    await asyncio.gather(*waiters)
    assert loop.time() - paused_at >= 0.3


# --- real servers ------------------------------------------------------------------


class Recorder:
    """An aiohttp app that logs (monotonic time, path, headers) of every request."""

    def __init__(self) -> None:
        self.log: list[tuple[float, str, dict[str, str]]] = []
        self.routes: dict[str, Any] = {}  # path -> handler, added while serving
        self.app = web.Application()
        self.app.router.add_get("/{tail:.*}", self._dispatch)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        self.log.append((time.monotonic(), request.path_qs, dict(request.headers)))
        handler = self.routes.get(request.path)
        if handler is None:
            raise web.HTTPNotFound()
        return await handler(request)

    def headers_of(self, path: str) -> list[dict[str, str]]:
        return [headers for _, p, headers in self.log if p == path]


@pytest.fixture
async def servers() -> AsyncIterator[tuple[Recorder, str, Recorder, str]]:
    source, other = Recorder(), Recorder()
    async with serving(source.app) as source_url, serving(other.app) as other_url:
        yield source, source_url, other, other_url


async def test_headers_stay_on_the_source_origin_across_redirects(servers):
    source, source_url, other, other_url = servers

    async def doc(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def away(request: web.Request) -> web.Response:
        raise web.HTTPFound(f"{other_url}/doc")

    async def home(request: web.Request) -> web.Response:
        raise web.HTTPFound("/doc")

    source.routes["/doc"] = doc
    source.routes["/away"] = away
    source.routes["/home"] = home
    other.routes["/doc"] = doc
    policy = HttpPolicy(headers=(("Authorization", TOKEN),), contact="ops@example.org")
    async with Fetcher(policy=policy.with_credential_origins([source_url])) as fetcher:
        await fetcher.get(f"{source_url}/home")
        await fetcher.get(f"{source_url}/away")
        await fetcher.get(f"{other_url}/doc")
    assert [h.get("Authorization") for h in source.headers_of("/home")] == [TOKEN]
    assert [h.get("Authorization") for h in source.headers_of("/doc")] == [TOKEN]
    assert [h.get("Authorization") for h in source.headers_of("/away")] == [TOKEN]
    assert len(other.log) == 2
    assert all("Authorization" not in headers for _, _, headers in other.log)
    assert all("(+mailto:ops@example.org)" in h["User-Agent"] for _, _, h in source.log)


async def test_requests_go_through_the_proxy_of_the_environment(servers, monkeypatch):
    proxy, proxy_url, _, _ = servers

    async def forward(request: web.Request) -> web.Response:
        return web.Response(text=f"proxied {request.url}")

    proxy.routes["/doc"] = forward
    for name in ("NO_PROXY", "no_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy_url)
    httppolicy._env_proxies.cache_clear()
    try:
        async with Fetcher() as fetcher:
            result = await fetcher.get("http://source.invalid/doc")
    finally:
        httppolicy._env_proxies.cache_clear()
    assert result.body == b"proxied http://source.invalid/doc"  # absolute-form, via the proxy
    assert proxy.log[-1][2]["Host"] == "source.invalid"


async def test_retry_after_is_waited_out_per_origin(servers):
    source, source_url, _, _ = servers
    answered: list[float] = []

    async def busy(request: web.Request) -> web.Response:
        if len(answered) < 2:
            answered.append(time.monotonic())
            return web.Response(status=429, headers={"Retry-After": "1"})
        return web.Response(text="done")

    source.routes["/busy"] = busy
    async with Fetcher() as fetcher:
        result = await fetcher.get(f"{source_url}/busy", timeout=5)
    assert result.body == b"done"
    times = [t for t, path, _ in source.log if path == "/busy"]
    assert len(times) == 3
    for busy_at, next_at in itertools.pairwise(times):
        assert next_at - busy_at >= 1.0  # server clock: request after request


async def test_retry_after_longer_than_allowed_fails_and_keeps_the_origin_paused(servers):
    source, source_url, _, _ = servers

    async def busy(request: web.Request) -> web.Response:
        return web.Response(status=503, headers={"Retry-After": "1"})

    async def fine(request: web.Request) -> web.Response:
        return web.Response(text="fine")

    source.routes["/busy"] = busy
    source.routes["/fine"] = fine
    async with Fetcher(policy=HttpPolicy(max_retry_after=0)) as fetcher:
        with pytest.raises(Exception, match="Retry-After 1") as caught:
            await fetcher.get(f"{source_url}/busy")
        assert caught.value.status == 503
        await fetcher.get(f"{source_url}/fine")
    times = {path: t for t, path, _ in source.log}
    assert times["/fine"] - times["/busy"] >= 1.0


# --- issue 22 item 6: one test per finding ---------------------------------------


async def test_a_trickling_body_is_cut_at_the_fetch_deadline(servers):
    """Finding: a 1 byte / 5 s body held a slot for 40 s and was applied."""
    source, source_url, _, _ = servers
    gone = asyncio.Event()

    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = 100
        await response.prepare(request)
        try:
            for _ in range(100):  # 100 bytes at 5 bytes/s: 20 s, each wait well under timeout
                await response.write(b"x")
                await asyncio.sleep(0.2)
        except (ConnectionError, RuntimeError):
            pass
        finally:
            gone.set()
        return response

    source.routes["/trickle"] = trickle
    started = time.monotonic()
    async with Fetcher(policy=HttpPolicy(deadline=1.0)) as fetcher:
        with pytest.raises(DeadlineExceeded, match="deadline of 1s"):
            async with fetcher.stream(f"{source_url}/trickle", timeout=5) as stream:
                async for _ in stream:
                    pass
    elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 3.0
    await asyncio.wait_for(gone.wait(), 5)  # the connection was dropped, not left reading


async def test_a_compression_bomb_is_never_decoded(servers):
    """Finding: ~2 MB of gzip expanded to 821 MB of temp file before the 1 GiB refusal.

    A fetch allowed past the 50 MB document limit asks for ``identity``: an
    honest server sends the plain bytes, a hostile one that compresses anyway
    is refused on its headers, before one byte is decoded.
    """
    source, source_url, _, _ = servers
    plain = b"the real resource\n"
    bomb = gzip.compress(b"\0" * (100 << 20), compresslevel=9)  # 100 MB in ~100 kB

    async def honest(request: web.Request) -> web.Response:
        if request.headers.get("Accept-Encoding") == "identity":
            return web.Response(body=plain)
        return web.Response(body=bomb, headers={"Content-Encoding": "gzip"})

    async def hostile(request: web.Request) -> web.Response:
        return web.Response(body=bomb, headers={"Content-Encoding": "gzip"})

    source.routes["/honest"] = honest
    source.routes["/hostile"] = hostile
    decoded = 0
    async with Fetcher() as fetcher:
        result = await fetcher.get(f"{source_url}/honest", max_bytes=1 << 30)
        assert result.body == plain
        with pytest.raises(UnwantedEncoding, match="gzip although Accept-Encoding: identity"):
            async with fetcher.stream(f"{source_url}/hostile", max_bytes=1 << 30) as stream:
                async for chunk in stream:
                    decoded += len(chunk)
    assert decoded == 0
    assert [h["Accept-Encoding"] for h in source.headers_of("/hostile")] == ["identity"]


async def test_an_honest_compressed_document_is_decoded(servers):
    source, source_url, _, _ = servers
    xml = "".join(  # 100,000 entries, 8 MB; a real list compresses ~10-20:1
        f"<url><loc>http://example.org/r{i * 7919 % 100_003}</loc>"
        f"<lastmod>2024-01-{1 + i % 28:02}T{i % 24:02}:{i % 60:02}:{i * 13 % 60:02}Z</lastmod>"
        f'<rs:md change="updated" length="{i * 31 % 9973}"/></url>\n'
        for i in range(100_000)
    ).encode()

    async def document(request: web.Request) -> web.Response:
        return web.Response(body=zlib.compress(xml), headers={"Content-Encoding": "deflate"})

    source.routes["/xml"] = document
    async with Fetcher() as fetcher:
        assert (await fetcher.get(f"{source_url}/xml")).body == xml
    assert "deflate" in source.headers_of("/xml")[-1]["Accept-Encoding"]


@pytest.mark.parametrize("size", [10, 30_000], ids=["small", "spooled-to-disk"])
async def test_a_streamed_read_hands_back_the_body_as_a_file(servers, size: int) -> None:
    """``read(stream=True)`` over HTTP: the body spooled as it arrives (to a temporary file
    past SPOOL_IN_MEMORY), handed back as a file at its start, never as bytes."""
    source, source_url, _, _ = servers
    entries = b"".join(b"<url><loc>http://example.org/r/%d</loc></url>" % n for n in range(size))
    xml = (
        b'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
        b'xmlns:rs="http://www.openarchives.org/rs/terms/"><rs:md capability="resourcelist" '
        b'at="2024-01-01T00:00:00Z"/>' + entries + b"</urlset>"
    )

    async def document(request: web.Request) -> web.Response:
        if request.headers.get("If-None-Match") == '"v1"':
            return web.Response(status=304, headers={"ETag": '"v1"'})
        return web.Response(body=xml, headers={"ETag": '"v1"'})

    source.routes["/resourcelist.xml"] = document
    async with Fetcher() as fetcher:
        fetched = await HttpAccess(fetcher).read(f"{source_url}/resourcelist.xml", stream=True)
        assert fetched.body == b"" and fetched.file is not None and fetched.etag == '"v1"'
        try:
            on_disk = fetched.file._rolled  # type: ignore[attr-defined]
            assert on_disk == (len(xml) > access.SPOOL_IN_MEMORY)
            assert fetched.file.read() == xml
        finally:
            fetched.close()
        assert fetched.file.closed
        again = await HttpAccess(fetcher).read(
            f"{source_url}/resourcelist.xml", etag='"v1"', stream=True
        )
        assert again.not_modified and again.file is None


@pytest.mark.parametrize("stream", [False, True], ids=["body", "spooled"])
async def test_a_huge_change_list_is_refused_while_streaming(servers, stream: bool):
    """Finding: a 10-million-entry Change List is buffered to its 50 MB limit before refusal."""
    source, source_url, _, _ = servers
    sent = 0
    gone = asyncio.Event()

    async def changelist(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        response = web.StreamResponse(headers={"Content-Type": "application/xml"})
        await response.prepare(request)
        head = (
            b'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
            b'xmlns:rs="http://www.openarchives.org/rs/terms/"><rs:md capability="changelist"/>'
        )
        entry = (
            b"<url><loc>http://example.org/r</loc><lastmod>2024-01-01T00:00:00Z</lastmod>"
            b'<rs:md change="updated"/></url>'
        )
        try:
            await response.write(head)
            sent += len(head)
            block = entry * 1000
            for _ in range(10_000):  # ten million entries, ~1.1 GB, if nobody hangs up
                await response.write(block)
                sent += len(block)
        except (ConnectionError, RuntimeError):
            pass
        finally:
            gone.set()
        return response

    source.routes["/changelist.xml"] = changelist
    async with Fetcher() as fetcher:
        reader = HttpAccess(fetcher)
        with pytest.raises(TooManyEntries, match=r"more than 50000 entries.*section 7"):
            await reader.read(f"{source_url}/changelist.xml", stream=stream)
    await asyncio.wait_for(gone.wait(), 10)
    assert sent < 20_000_000  # 50,000 entries are ~5.5 MB; the 50 MB limit is never reached
