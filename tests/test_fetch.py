"""rsnotify.fetch against real aiohttp servers on loopback ports, plus Link header parsing."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from rsnotify.errors import DocumentTooLarge, FetchError
from rsnotify.fetch import (
    Fetcher,
    OriginNotAllowed,
    ResponseTooLarge,
    check_origin,
    has_rel,
    origin_of,
    parse_link_header,
)
from rsnotify.metrics import serving
from tests.devstack import async_wait_for, free_port

DATA = bytes(range(256)) * 40  # 10,240 bytes
ETAG = '"v1"'
OLD_ETAG = '"v0"'  # a strong tag held from an earlier read: ranges are asked only with one
LAST_MODIFIED = "Wed, 21 Oct 2015 07:28:00 GMT"


class Source:
    """A small HTTP server with the behaviours the fetcher must cope with."""

    def __init__(self) -> None:
        self.requests: list[web.Request] = []
        self.release = asyncio.Event()  # set at teardown to free stalled handlers
        self.endless_sent = 0
        self.endless_disconnected = asyncio.Event()
        self.app = web.Application()
        self.app.middlewares.append(self._log)
        add = self.app.router.add_get
        add("/doc", self.doc)
        add("/links", self.links)
        add("/range", self.range)
        add("/range-ignored", self.range_ignored)
        add("/range-wrong", self.range_wrong)
        add("/endless", self.endless)
        add("/declared-huge", self.declared_huge)
        add("/stall", self.stall)
        add("/stall-body", self.stall_body)
        add("/gzip", self.gzipped)
        add("/r/{n}", self.redirect_chain)
        add("/loop", self.loop)
        add("/to/{target:.*}", self.redirect_to)
        add("/missing", self.missing)

    @web.middleware
    async def _log(self, request: web.Request, handler):
        self.requests.append(request)
        return await handler(request)

    async def doc(self, request: web.Request) -> web.Response:
        if request.headers.get("If-None-Match") == ETAG:
            return web.Response(status=304, headers={"ETag": ETAG})
        if request.headers.get("If-Modified-Since") == LAST_MODIFIED:
            return web.Response(status=304)
        return web.Response(
            body=DATA,
            content_type="application/xml",
            headers={"ETag": ETAG, "Last-Modified": LAST_MODIFIED},
        )

    async def links(self, request: web.Request) -> web.Response:
        response = web.Response(text="x")
        response.headers.add("Link", '<cap.xml>; rel="resourcesync", </a,b>; rel="up index"')
        response.headers.add("Link", "<http://other.example/x>; rel=describedby")
        response.headers.add("X-Twice", "a")
        response.headers.add("X-Twice", "b")
        return response

    def _range_start(self, request: web.Request) -> int:
        value = request.headers["Range"]
        assert value.startswith("bytes=") and value.endswith("-")
        return int(value[len("bytes=") : -1])

    async def range(self, request: web.Request) -> web.Response:
        start = self._range_start(request)
        headers = {"Content-Range": f"bytes {start}-{len(DATA) - 1}/{len(DATA)}"}
        return web.Response(status=206, body=DATA[start:], headers=headers)

    async def range_ignored(self, request: web.Request) -> web.Response:
        return web.Response(body=DATA)

    async def range_wrong(self, request: web.Request) -> web.Response:
        headers = {"Content-Range": f"bytes 0-{len(DATA) - 1}/{len(DATA)}"}
        return web.Response(status=206, body=DATA, headers=headers)

    async def endless(self, request: web.Request) -> web.StreamResponse:
        """Streams without Content-Length until the client goes away (or 1 GiB)."""
        response = web.StreamResponse()
        await response.prepare(request)
        chunk = b"x" * 65536
        try:
            while self.endless_sent < (1 << 30):
                await response.write(chunk)
                self.endless_sent += len(chunk)
        except (ConnectionError, RuntimeError):
            pass
        finally:
            self.endless_disconnected.set()
        return response

    async def declared_huge(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = 10**9
        await response.prepare(request)
        await response.write(b"x" * 100)
        await self.release.wait()
        return response

    async def stall(self, request: web.Request) -> web.Response:
        await self.release.wait()
        return web.Response(text="late")

    async def stall_body(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = 200
        await response.prepare(request)
        await response.write(b"x" * 100)
        await self.release.wait()
        return response

    async def gzipped(self, request: web.Request) -> web.Response:
        return web.Response(body=gzip.compress(DATA), headers={"Content-Encoding": "gzip"})

    async def redirect_chain(self, request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        if n == 0:
            raise web.HTTPFound("/doc")  # absolute path
        raise web.HTTPMovedPermanently(str(n - 1))  # relative reference

    async def loop(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/loop")

    async def redirect_to(self, request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(request.match_info["target"])

    async def missing(self, request: web.Request) -> web.Response:
        raise web.HTTPNotFound()


@pytest.fixture
async def source() -> AsyncIterator[tuple[Source, str]]:
    src = Source()
    async with serving(src.app) as base:
        try:
            yield src, base
        finally:
            src.release.set()


@pytest.fixture
async def fetcher() -> AsyncIterator[Fetcher]:
    async with Fetcher() as f:
        yield f


# --- plain GET, headers, Link -----------------------------------------------------


async def test_get_returns_body_headers_and_validators(source, fetcher):
    _, base = source
    result = await fetcher.get(f"{base}/doc")
    assert result.status == 200
    assert result.body == DATA
    assert result.url == result.final_url == f"{base}/doc"
    assert result.etag == ETAG
    assert result.last_modified == LAST_MODIFIED
    assert result.headers["content-type"].startswith("application/xml")
    assert result.content_type == "application/xml"
    assert not result.not_modified and not result.partial


async def test_repeated_headers_are_kept_and_links_resolved(source, fetcher):
    _, base = source
    result = await fetcher.get(f"{base}/links")
    assert result.headers["x-twice"] == "a, b"
    assert all(name == name.lower() for name in result.headers)
    assert [target for target, _ in result.links] == [
        f"{base}/cap.xml",
        f"{base}/a,b",
        "http://other.example/x",
    ]
    assert result.links_with_rel("resourcesync") == [f"{base}/cap.xml"]
    assert result.links_with_rel("index") == [f"{base}/a,b"]
    assert result.links_with_rel("DescribedBy") == ["http://other.example/x"]


# --- conditional GET and ranges ---------------------------------------------------


async def test_etag_gives_304(source, fetcher):
    src, base = source
    first = await fetcher.get(f"{base}/doc")
    again = await fetcher.get(f"{base}/doc", etag=first.etag)
    assert src.requests[-1].headers["If-None-Match"] == ETAG
    assert again.status == 304
    assert again.not_modified
    assert again.body == b""
    assert again.etag == ETAG


async def test_last_modified_gives_304_and_echoes_validator(source, fetcher):
    src, base = source
    again = await fetcher.get(f"{base}/doc", last_modified=LAST_MODIFIED)
    assert src.requests[-1].headers["If-Modified-Since"] == LAST_MODIFIED
    assert again.not_modified
    # The 304 carried no Last-Modified: the one we sent is still current.
    assert again.last_modified == LAST_MODIFIED


async def test_range_gives_206_with_start(source, fetcher):
    src, base = source
    result = await fetcher.get(f"{base}/range", range_start=1000, etag=OLD_ETAG)
    assert src.requests[-1].headers["Range"] == "bytes=1000-"
    assert src.requests[-1].headers["Accept-Encoding"] == "identity"
    assert result.status == 206
    assert result.partial
    assert result.range_start == 1000
    assert result.body == DATA[1000:]


@pytest.mark.parametrize("held", [None, 'W/"v0"'])
async def test_range_is_asked_only_with_a_strong_etag(source, fetcher, held):
    """RFC 9110 sections 8.8.1 and 13.1.5: no range of a weakly (or un-) tagged representation."""
    src, base = source
    result = await fetcher.get(f"{base}/range-ignored", range_start=1000, etag=held)
    assert "Range" not in src.requests[-1].headers
    assert "If-Range" not in src.requests[-1].headers
    assert result.body == DATA and not result.partial


async def test_range_ignored_by_server_is_a_full_response(source, fetcher):
    _, base = source
    result = await fetcher.get(f"{base}/range-ignored", range_start=1000, etag=OLD_ETAG)
    assert result.status == 200
    assert not result.partial
    assert result.range_start is None
    assert result.body == DATA


async def test_206_starting_elsewhere_is_refused(source, fetcher):
    _, base = source
    with pytest.raises(FetchError, match="asked for 1000") as caught:
        await fetcher.get(f"{base}/range-wrong", range_start=1000, etag=OLD_ETAG)
    assert caught.value.status == 206


async def test_gzip_body_is_decoded(source, fetcher):
    _, base = source
    result = await fetcher.get(f"{base}/gzip")
    assert result.body == DATA


# --- limits -----------------------------------------------------------------------


async def test_streamed_body_over_limit_is_refused_without_reading_the_rest(source, fetcher):
    src, base = source
    with pytest.raises(ResponseTooLarge) as caught:
        await fetcher.get(f"{base}/endless", max_bytes=200_000)
    error = caught.value
    assert isinstance(error, FetchError) and isinstance(error, DocumentTooLarge)
    assert error.url == f"{base}/endless"
    assert error.limit == 200_000
    assert "200000" in str(error)
    # The client hung up: the server's endless writer fails long before 1 GiB.
    await async_wait_for(src.endless_disconnected.is_set, message="server never saw the hang-up")
    assert src.endless_sent < (1 << 30)


async def test_declared_length_over_limit_is_refused_before_the_body(source, fetcher):
    _, base = source
    # The server never finishes this body; only refusing on the header can return.
    with pytest.raises(ResponseTooLarge, match="Content-Length 1000000000") as caught:
        await fetcher.get(f"{base}/declared-huge", max_bytes=1000, timeout=10)
    assert caught.value.declared == 10**9


async def test_stream_yields_chunks_and_enforces_the_limit(source):
    _, base = source
    async with Fetcher(chunk_size=1024) as fetcher:
        async with fetcher.stream(f"{base}/doc") as stream:
            assert stream.result.status == 200
            assert stream.result.etag == ETAG
            chunks = [chunk async for chunk in stream]
        assert b"".join(chunks) == DATA
        assert len(chunks) > 1
        assert stream.received == len(DATA)

        with pytest.raises(ResponseTooLarge):
            async with fetcher.stream(f"{base}/endless", max_bytes=100_000) as stream:
                async for _ in stream:
                    pass


async def test_stream_of_304_has_no_chunks(source, fetcher):
    _, base = source
    async with fetcher.stream(f"{base}/doc", etag=ETAG) as stream:
        assert stream.result.not_modified
        assert [chunk async for chunk in stream] == []


# --- failures -------------------------------------------------------------------


async def test_unreachable_server_raises_fetch_error(fetcher):
    url = f"http://127.0.0.1:{free_port()}/x"
    with pytest.raises(FetchError, match="unreachable server") as caught:
        await fetcher.get(url, timeout=5)
    assert caught.value.url == url
    assert caught.value.status is None
    assert url in str(caught.value)


async def test_timeout_waiting_for_headers(source, fetcher):
    _, base = source
    with pytest.raises(FetchError, match="timed out") as caught:
        await fetcher.get(f"{base}/stall", timeout=0.2)
    assert f"{base}/stall" in str(caught.value)


async def test_timeout_waiting_for_body(source, fetcher):
    _, base = source
    with pytest.raises(FetchError, match="timed out"):
        await fetcher.get(f"{base}/stall-body", timeout=0.2)


async def test_stream_timeout_waiting_for_body(source, fetcher):
    _, base = source
    with pytest.raises(FetchError, match="timed out"):
        async with fetcher.stream(f"{base}/stall-body", timeout=0.2) as stream:
            async for _ in stream:
                pass


async def test_http_error_status(source, fetcher):
    _, base = source
    with pytest.raises(FetchError, match="HTTP 404") as caught:
        await fetcher.get(f"{base}/missing")
    assert caught.value.status == 404


async def test_unsupported_scheme_and_bad_url(fetcher):
    with pytest.raises(FetchError, match="unsupported URL scheme"):
        await fetcher.get("ftp://127.0.0.1/x")
    with pytest.raises(FetchError, match="invalid URL"):
        await fetcher.get("http://[::1/x")
    with pytest.raises(FetchError, match="not an absolute URL"):
        await fetcher.get("/relative")


# --- redirects and origins -------------------------------------------------------


async def test_redirects_are_followed(source, fetcher):
    src, base = source
    result = await fetcher.get(f"{base}/r/3")
    assert result.body == DATA
    assert result.url == f"{base}/r/3"
    assert result.final_url == f"{base}/doc"
    assert [r.path for r in src.requests] == ["/r/3", "/r/2", "/r/1", "/r/0", "/doc"]


async def test_redirect_loop_is_refused(source, fetcher):
    _, base = source
    with pytest.raises(FetchError, match="too many redirects"):
        await fetcher.get(f"{base}/loop")


async def test_allowed_origins(source):
    _, base = source
    other = Source()
    async with serving(other.app) as other_base, Fetcher(allowed_origins=[base + "/"]) as fetcher:
        assert (await fetcher.get(f"{base}/doc")).body == DATA

        with pytest.raises(OriginNotAllowed, match="is not allowed") as caught:
            await fetcher.get(f"{other_base}/doc")
        assert caught.value.origin == other_base
        assert isinstance(caught.value, FetchError)

        # A redirect out of the allowed set is refused before it is followed.
        with pytest.raises(OriginNotAllowed):
            await fetcher.get(f"{base}/to/{other_base}/doc")
        assert other.requests == []

        # Per-call override.
        result = await fetcher.get(f"{other_base}/doc", allowed_origins=[other_base])
        assert result.body == DATA
        assert len(other.requests) == 1


def test_origin_normalisation():
    assert origin_of("http://Example.COM/a?b") == "http://example.com:80"
    assert origin_of("https://example.com:443/") == "https://example.com:443"
    assert origin_of("http://bücher.example/") == "http://xn--bcher-kva.example:80"
    assert origin_of("http://[::1]:8080/x") == "http://[::1]:8080"
    check_origin("http://example.com:80/x", ["http://EXAMPLE.com"])
    check_origin("http://xn--bcher-kva.example/", ["http://bücher.example"])
    check_origin("http://anything/", None)
    with pytest.raises(OriginNotAllowed):
        check_origin("https://example.com/x", ["http://example.com"])
    with pytest.raises(OriginNotAllowed):
        check_origin("http://example.com:8080/x", ["http://example.com"])
    with pytest.raises(OriginNotAllowed):
        check_origin("http://example.com.evil.test/", ["http://example.com"])
    with pytest.raises(OriginNotAllowed):
        check_origin("http://example.com/", [])
    with pytest.raises(FetchError, match="not an absolute URL"):
        origin_of("/relative/path")


async def test_closed_fetcher_refuses_requests():
    fetcher = Fetcher()
    await fetcher.close()
    with pytest.raises(RuntimeError):
        await fetcher.get("http://127.0.0.1:1/")


# --- Link header parsing (pure) ----------------------------------------------------


def test_link_header_several_links_and_quoted_params():
    value = (
        '<http://ex.com/cap.xml>; rel="resourcesync"; title="a, b; c", '
        "<http://ex.com/b>;rel=up, <http://ex.com/c>; rel=\"up  Index\"; type='x'"
    )
    links = parse_link_header(value)
    assert links == [
        ("http://ex.com/cap.xml", {"rel": "resourcesync", "title": "a, b; c"}),
        ("http://ex.com/b", {"rel": "up"}),
        ("http://ex.com/c", {"rel": "up index", "type": "'x'"}),
    ]
    assert has_rel(links[2][1], "index")
    assert has_rel(links[2][1], "UP")
    assert not has_rel(links[0][1], "up")


def test_link_header_commas_inside_targets_and_escapes():
    links = parse_link_header(r'</a,b;c>; rel="x"; title="say \"hi\", ok", </d>; rel=y')
    assert links == [("/a,b;c", {"rel": "x", "title": 'say "hi", ok'}), ("/d", {"rel": "y"})]


def test_link_header_first_parameter_wins_and_names_fold_case():
    assert parse_link_header('<a>; REL="one"; rel="two"; Anchor="#x"') == [
        ("a", {"rel": "one", "anchor": "#x"})
    ]


def test_link_header_extended_and_valueless_params():
    links = parse_link_header("<a>; rel=x; title*=UTF-8'de'n%C3%A4chstes; crossorigin")
    assert links == [("a", {"rel": "x", "title*": "nächstes", "crossorigin": ""})]


@pytest.mark.parametrize(
    "value, expected",
    [
        ("", []),
        ("   ,  , ", []),
        ("garbage, <b>; rel=up", [("b", {"rel": "up"})]),
        ('"quoted, garbage", <b>; rel=up', [("b", {"rel": "up"})]),
        ("<a>; rel=x junk, <b>; rel=y", [("a", {"rel": "x"}), ("b", {"rel": "y"})]),
        ("<unterminated; rel=x", []),
        ('<a>; title="unterminated', [("a", {"title": "unterminated"})]),
        ("<a>; =x; rel=y", [("a", {"rel": "y"})]),
    ],
)
def test_link_header_malformed_input_is_skipped_not_raised(value, expected):
    assert parse_link_header(value) == expected


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:44803/c1/resources/r1.txt",
        "HTTP://Example.COM:80/a?b#c",
        "https://a.b:443",
        "http://a:b:c/",
        "http://[::1]:8080/x",
        "http://user@h/x",
        "http://h?x",
        "http://h#f",
        "ftp://h/x",
        "http:///x",
        "http://bücher.example/",
        "http://h:99999/",
        "http://h:0080/x",
        "http://h:80\\@evil/x",
    ],
)
def test_origin_of_by_its_authority_prefix_is_the_origin_of_the_whole_url(url: str) -> None:
    """The memo per plain ``scheme://authority`` answers (or refuses) as parsing it whole."""
    from rsnotify.fetch import _origin_of

    def answer(fn: Any) -> Any:
        try:
            return fn(url)
        except FetchError as exc:
            return ("refused", str(exc))

    assert answer(origin_of) == answer(_origin_of)
