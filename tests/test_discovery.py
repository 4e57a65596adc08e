"""Discovery (Z39.99 section 6.3): pure link extraction, the state machine, real HTTP Sources."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from rsnotify.discovery import (
    DiscoveryMachine,
    Role,
    Via,
    classify,
    discover,
    links_from_headers,
    links_from_html,
    read_document,
    robots_url,
    sitemaps_from_robots,
    well_known_url,
)
from rsnotify.errors import DiscoveryError, DocumentError
from rsnotify.fetch import Fetcher
from rsnotify.metrics import serving
from tests.devstack import free_port

NS = (
    'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
    'xmlns:rs="http://www.openarchives.org/rs/terms/"'
)


def source_description(*capability_lists: str) -> bytes:
    urls = "".join(
        f'<url><loc>{loc}</loc><rs:md capability="capabilitylist"/></url>'
        for loc in capability_lists
    )
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {NS}>'
        f'<rs:md capability="description"/>{urls}</urlset>'
    ).encode()


def source_description_index(*descriptions: str) -> bytes:
    entries = "".join(f"<sitemap><loc>{loc}</loc></sitemap>" for loc in descriptions)
    return (
        f'<sitemapindex {NS}><rs:md capability="description"/>{entries}</sitemapindex>'
    ).encode()


def capability_list(up: str | None, capabilities: dict[str, str], hubs: tuple[str, ...] = ()):
    links = f'<rs:ln rel="up" href="{up}"/>' if up else ""
    links += "".join(f'<rs:ln rel="hub" href="{href}"/>' for href in hubs)
    urls = "".join(
        f'<url><loc>{loc}</loc><rs:md capability="{capability}"/></url>'
        for capability, loc in capabilities.items()
    )
    return (f'<urlset {NS}>{links}<rs:md capability="capabilitylist"/>{urls}</urlset>').encode()


def resource_list(up: str | None, *, index: str | None = None) -> bytes:
    links = f'<rs:ln rel="up" href="{up}"/>' if up else ""
    links += f'<rs:ln rel="index" href="{index}"/>' if index else ""
    return (
        f'<urlset {NS}>{links}<rs:md capability="resourcelist" at="2013-01-03T09:00:00Z"/>'
        "<url><loc>http://example.com/res1</loc></url></urlset>"
    ).encode()


def change_list(up: str | None, *, index: str | None = None) -> bytes:
    links = f'<rs:ln rel="up" href="{up}"/>' if up else ""
    links += f'<rs:ln rel="index" href="{index}"/>' if index else ""
    return (
        f'<urlset {NS}>{links}<rs:md capability="changelist" from="2013-01-02T00:00:00Z"/>'
        "<url><loc>http://example.com/res1</loc><lastmod>2013-01-02T13:00:00Z</lastmod>"
        '<rs:md change="updated"/></url></urlset>'
    ).encode()


def change_list_index(up: str) -> bytes:
    return (
        f'<sitemapindex {NS}><rs:ln rel="up" href="{up}"/>'
        '<rs:md capability="changelist" from="2013-01-01T00:00:00Z"/>'
        "<sitemap><loc>http://example.com/cl1.xml</loc></sitemap></sitemapindex>"
    ).encode()


PLAIN_SITEMAP = (
    b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
    b"<url><loc>http://example.com/</loc></url></urlset>"
)

HUBS = ("mqtt://127.0.0.1:1883/rs/example/changes", "ws://127.0.0.1:8765/example")


# --- pure helpers ---------------------------------------------------------------


def test_well_known_and_robots_urls():
    assert (
        well_known_url("http://ex.com:8080/a/b?c#d")
        == "http://ex.com:8080/.well-known/resourcesync"
    )
    assert robots_url("https://ex.com/a/b") == "https://ex.com/robots.txt"


def test_links_from_headers():
    headers = {
        "Content-Type": "text/plain",
        "Link": '<../cap.xml>; rel="resourcesync", <http://ex.com/o>; rel="up resourcesync", '
        '<http://ex.com/n>; rel=describedby, <http://ex.com/x>; rel=resourcesync; anchor="/other"'
        ', <http://ex.com/self>; rel=resourcesync; anchor="#frag"',
    }
    assert links_from_headers(headers, "http://ex.com/a/page") == [
        "http://ex.com/cap.xml",
        "http://ex.com/o",
        "http://ex.com/self",
    ]
    assert links_from_headers({"content-type": "x"}, "http://ex.com/") == []


def test_links_from_html_resolves_and_stops_at_body():
    page = b"""<!DOCTYPE html><html><head><title>t</title>
      <LINK REL="stylesheet" href="s.css">
      <link rel="alternate ResourceSync" href="../data/cap.xml?a=1&amp;b=2">
      <link rel=resourcesync href=/abs/cap.xml />
      <link rel="resourcesync">
    </head><body><link rel="resourcesync" href="/in-body.xml"></body></html>"""
    assert links_from_html(page, "http://ex.com/docs/page.html") == [
        "http://ex.com/data/cap.xml?a=1&b=2",
        "http://ex.com/abs/cap.xml",
    ]


def test_links_from_html_uses_base_href_and_charset():
    page = '<html><head><base href="http://cdn.ex.com/d/"><link rel="resourcesync" href="cäp.xml">'
    assert links_from_html(page.encode("latin-1"), "http://ex.com/", encoding="latin-1") == [
        "http://cdn.ex.com/d/cäp.xml"
    ]
    assert links_from_html(b"\xff\xfe garbage <<<", "http://ex.com/") == []


def test_sitemaps_from_robots():
    robots = b"""User-agent: *
Disallow: /cgi-bin/
# Sitemap: http://ex.com/commented.xml
SITEMAP:http://ex.com/dataset1/resourcelist.xml  # trailing comment
Sitemap: /relative.xml
sitemap: http://ex.com/dataset1/resourcelist.xml
Sitemapx: http://ex.com/not.xml
Sitemap:
"""
    assert sitemaps_from_robots(robots, "http://ex.com/robots.txt") == [
        "http://ex.com/dataset1/resourcelist.xml",
        "http://ex.com/relative.xml",
    ]


def test_classify_and_read_document():
    cases = [
        (source_description("http://ex.com/cap.xml"), Role.SOURCE_DESCRIPTION),
        (source_description_index("http://ex.com/sd.xml"), Role.SOURCE_DESCRIPTION_INDEX),
        (capability_list(None, {"resourcelist": "http://ex.com/rl"}), Role.CAPABILITY_LIST),
        (resource_list("http://ex.com/cap.xml"), Role.BELOW_CAPABILITY_LIST),
        (change_list_index("http://ex.com/cap.xml"), Role.BELOW_CAPABILITY_LIST),
    ]
    for body, role in cases:
        assert classify(read_document(body)) is role
    assert read_document(source_description("http://ex.com/c")).capability_lists == [
        "http://ex.com/c"
    ]
    with pytest.raises(DocumentError):
        read_document(PLAIN_SITEMAP)
    with pytest.raises(DocumentError):
        read_document(b"<html><head></head></html>")


# --- the state machine without a network ---------------------------------------------


def run_machine(machine: DiscoveryMachine, responses: dict[str, tuple[dict, bytes]]) -> list[str]:
    """Drive ``machine`` from a dict of URL -> (headers, body); other URLs 404."""
    fetched = []
    while (request := machine.next_request()) is not None:
        fetched.append(request.url)
        if request.url in responses:
            headers, body = responses[request.url]
            machine.receive(request, final_url=request.url, headers=headers, body=body)
        else:
            machine.fail(request, "HTTP 404 Not Found")
    return fetched


def test_machine_source_description_index_to_capability_list():
    responses = {
        "http://ex.com/.well-known/resourcesync": ({}, source_description_index("/sd1.xml")),
        "http://ex.com/sd1.xml": ({}, source_description("http://ex.com/cap.xml")),
        "http://ex.com/cap.xml": ({}, capability_list("/sd1.xml", {"changelist": "/cl.xml"})),
    }
    machine = DiscoveryMachine("http://ex.com/.well-known/resourcesync")
    fetched = run_machine(machine, responses)
    assert fetched == list(responses)
    info = machine.result()
    assert info.source_description_url == "http://ex.com/sd1.xml"
    assert info.capability_lists[0].capabilities == {"changelist": "/cl.xml"}


def test_machine_change_list_without_up_follows_index():
    responses = {
        "http://ex.com/cl.xml": ({}, change_list(None, index="http://ex.com/cli.xml")),
        "http://ex.com/cli.xml": ({}, change_list_index("http://ex.com/cap.xml")),
        "http://ex.com/cap.xml": ({}, capability_list(None, {"changelist": "/cli.xml"})),
    }
    machine = DiscoveryMachine("http://ex.com/cl.xml")
    assert run_machine(machine, responses) == list(responses)
    info = machine.result()
    assert [c.url for c in info.capability_lists] == ["http://ex.com/cap.xml"]
    assert info.source_description_url is None
    assert [a.via for a in info.attempts] == [Via.GIVEN, Via.UP, Via.UP]


def test_machine_fetch_budget():
    sd = source_description(*(f"http://ex.com/cap{i}.xml" for i in range(10)))
    machine = DiscoveryMachine("http://ex.com/sd.xml", max_fetches=3)
    fetched = run_machine(machine, {"http://ex.com/sd.xml": ({}, sd)})
    assert len(fetched) == 3
    with pytest.raises(DiscoveryError, match="limit of 3 fetches"):
        machine.result()


def test_machine_refuses_non_http_start():
    for url in ("ftp://ex.com/x", "/relative", "ex.com"):
        with pytest.raises(DiscoveryError, match="not an absolute http"):
            DiscoveryMachine(url)


# --- against a real HTTP Source ------------------------------------------------------


class Site:
    """An HTTP server answering from a path -> (status, headers, body) table, logging paths."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, dict[str, str], bytes]] = {}
        self.paths: list[str] = []
        self.app = web.Application()
        self.app.router.add_route("GET", "/{tail:.*}", self.handle)

    def add(self, path: str, body: bytes, *, status: int = 200, **headers: str) -> None:
        named = {name.replace("_", "-"): value for name, value in headers.items()}
        named.setdefault("Content-Type", "application/xml")
        self.routes[path] = (status, named, body)

    async def handle(self, request: web.Request) -> web.Response:
        self.paths.append(request.path_qs)
        if request.path_qs not in self.routes:
            raise web.HTTPNotFound()
        status, headers, body = self.routes[request.path_qs]
        return web.Response(status=status, headers=headers, body=body)


@pytest.fixture
async def site() -> AsyncIterator[tuple[Site, str, Fetcher]]:
    s = Site()
    async with serving(s.app) as base, Fetcher() as fetcher:
        yield s, base, fetcher


def publish_source(site: Site, base: str, *, well_known: bool = True) -> str:
    """A Source with one Capability List (Resource List + Change List); returns its URL."""
    cap = f"{base}/dataset1/capabilitylist.xml"
    sd = f"{base}/.well-known/resourcesync"
    if well_known:
        site.add("/.well-known/resourcesync", source_description(cap))
    site.add(
        "/dataset1/capabilitylist.xml",
        capability_list(
            sd,
            {
                "resourcelist": f"{base}/dataset1/resourcelist.xml",
                "changelist": f"{base}/dataset1/changelist.xml",
            },
            HUBS,
        ),
    )
    site.add("/dataset1/resourcelist.xml", resource_list(cap))
    return cap


def assert_found_dataset1(info, base: str) -> None:
    assert [c.url for c in info.capability_lists] == [f"{base}/dataset1/capabilitylist.xml"]
    cap = info.capability_lists[0]
    assert cap.capabilities == {
        "resourcelist": f"{base}/dataset1/resourcelist.xml",
        "changelist": f"{base}/dataset1/changelist.xml",
    }
    assert [hub.href for hub in cap.hubs] == list(HUBS)
    assert all(hub.rel == "hub" for hub in cap.hubs)
    assert cap.document.capability == "capabilitylist"
    assert info.source_description_url == f"{base}/.well-known/resourcesync"


async def test_discover_from_base_url_via_well_known(site):
    s, base, fetcher = site
    publish_source(s, base)
    s.add(
        "/",
        b"<html><head><title>home</title></head><body>hi</body></html>",
        Content_Type="text/html",
    )
    info = await discover(f"{base}/", fetcher)
    assert_found_dataset1(info, base)
    assert s.paths == ["/", "/.well-known/resourcesync", "/dataset1/capabilitylist.xml"]
    assert [a.via for a in info.attempts] == [Via.GIVEN, Via.WELL_KNOWN, Via.CAPABILITY_LIST]


async def test_discover_from_base_url_that_is_404(site):
    s, base, fetcher = site
    publish_source(s, base)
    info = await discover(base, fetcher)
    assert_found_dataset1(info, base)
    assert "HTTP 404" in info.attempts[0].outcome


async def test_discover_from_source_description_url(site):
    s, base, fetcher = site
    publish_source(s, base)
    info = await discover(f"{base}/.well-known/resourcesync", fetcher)
    assert_found_dataset1(info, base)
    assert s.paths == ["/.well-known/resourcesync", "/dataset1/capabilitylist.xml"]


async def test_discover_from_capability_list_url(site):
    s, base, fetcher = site
    publish_source(s, base)
    info = await discover(f"{base}/dataset1/capabilitylist.xml", fetcher)
    assert_found_dataset1(info, base)  # the Source Description from the up link
    assert s.paths == ["/dataset1/capabilitylist.xml"]


async def test_discover_via_link_header(site):
    s, base, fetcher = site
    publish_source(s, base, well_known=False)
    s.add(
        "/res1",
        b"resource bytes",
        Content_Type="text/plain",
        Link='<dataset1/capabilitylist.xml>; rel="resourcesync"',
    )
    info = await discover(f"{base}/res1", fetcher)
    assert [c.url for c in info.capability_lists] == [f"{base}/dataset1/capabilitylist.xml"]
    assert [hub.href for hub in info.capability_lists[0].hubs] == list(HUBS)
    assert s.paths == ["/res1", "/dataset1/capabilitylist.xml"]  # no well-known needed
    assert info.attempts[1].via is Via.LINK_HEADER


async def test_discover_via_html_link(site):
    s, base, fetcher = site
    publish_source(s, base, well_known=False)
    s.add(
        "/docs/page.html",
        b'<html><head><link rel="resourcesync" href="../dataset1/capabilitylist.xml"></head>'
        b"<body>page</body></html>",
        Content_Type="text/html; charset=utf-8",
    )
    info = await discover(f"{base}/docs/page.html", fetcher)
    assert [c.url for c in info.capability_lists] == [f"{base}/dataset1/capabilitylist.xml"]
    assert info.attempts[1].via is Via.HTML_LINK
    assert s.paths == ["/docs/page.html", "/dataset1/capabilitylist.xml"]


async def test_discover_via_robots_and_up_chain(site):
    s, base, fetcher = site
    publish_source(s, base, well_known=False)
    s.add("/sitemap.xml", PLAIN_SITEMAP)  # an ordinary Sitemap: skipped
    s.add(
        "/robots.txt",
        f"User-agent: *\nDisallow: /tmp/\nSitemap: {base}/sitemap.xml\n"
        f"Sitemap: {base}/dataset1/resourcelist.xml\n".encode(),
        Content_Type="text/plain",
    )
    info = await discover(f"{base}/", fetcher)
    assert_found_dataset1(info, base)  # SD URL advertised by the Capability List's up link
    assert s.paths == [
        "/",
        "/.well-known/resourcesync",
        "/robots.txt",
        "/sitemap.xml",
        "/dataset1/resourcelist.xml",
        "/dataset1/capabilitylist.xml",
    ]
    outcomes = {a.url: a.outcome for a in info.attempts}
    assert "not a ResourceSync document" in outcomes[f"{base}/sitemap.xml"]
    assert "following its up link" in outcomes[f"{base}/dataset1/resourcelist.xml"]


async def test_discover_from_resource_list_url_goes_up(site):
    s, base, fetcher = site
    publish_source(s, base)
    info = await discover(f"{base}/dataset1/resourcelist.xml", fetcher)
    assert_found_dataset1(info, base)
    assert s.paths == ["/dataset1/resourcelist.xml", "/dataset1/capabilitylist.xml"]


async def test_source_description_with_several_lists_and_one_missing(site):
    s, base, fetcher = site
    publish_source(s, base, well_known=False)
    s.add("/d2/cap.xml", capability_list(None, {"changelist": f"{base}/d2/cl.xml"}, HUBS[:1]))
    s.add(
        "/.well-known/resourcesync",
        source_description(
            f"{base}/dataset1/capabilitylist.xml", f"{base}/gone/cap.xml", "/d2/cap.xml"
        ),
    )
    info = await discover(f"{base}/.well-known/resourcesync", fetcher)
    assert [c.url for c in info.capability_lists] == [
        f"{base}/dataset1/capabilitylist.xml",
        f"{base}/d2/cap.xml",
    ]
    assert info.capability_list(f"{base}/d2/cap.xml").capabilities == {
        "changelist": f"{base}/d2/cl.xml"
    }
    assert [h.href for h in info.capability_list(f"{base}/d2/cap.xml").hubs] == [HUBS[0]]
    assert any("HTTP 404" in a.outcome for a in info.attempts if a.url.endswith("/gone/cap.xml"))


async def test_up_link_loop_is_detected(site):
    s, base, fetcher = site
    s.add("/a.xml", resource_list(f"{base}/b.xml"))
    s.add("/b.xml", resource_list(f"{base}/a.xml"))
    with pytest.raises(DiscoveryError, match="up-link loop") as caught:
        await discover(f"{base}/a.xml", fetcher)
    assert s.paths == ["/a.xml", "/b.xml", "/.well-known/resourcesync", "/robots.txt"]
    assert f"{base}/a.xml" in str(caught.value)


async def test_up_chain_is_capped(site):
    s, base, fetcher = site
    for i in range(10):
        s.add(f"/rl{i}.xml", resource_list(f"{base}/rl{i + 1}.xml"))
    with pytest.raises(DiscoveryError, match="more than 3 hops"):
        await discover(f"{base}/rl0.xml", fetcher, max_hops=3)
    assert [p for p in s.paths if p.startswith("/rl")] == [f"/rl{i}.xml" for i in range(4)]


async def test_nothing_found_lists_every_attempt(site):
    s, base, fetcher = site
    s.add("/page", b"<html><head></head><body></body></html>", Content_Type="text/html")
    s.add("/robots.txt", b"User-agent: *\nDisallow:\n", Content_Type="text/plain")
    with pytest.raises(DiscoveryError) as caught:
        await discover(f"{base}/page", fetcher)
    message = str(caught.value)
    assert message.startswith(f"no ResourceSync Capability List found from {base}/page; tried:")
    assert (
        f'given URL {base}/page: not a ResourceSync document and no rel="resourcesync"' in message
    )
    assert f"well-known URI {base}/.well-known/resourcesync: HTTP 404" in message
    assert f"robots.txt {base}/robots.txt: 0 Sitemap directive(s)" in message


async def test_unreachable_source_is_a_discovery_error():
    port = free_port()  # nothing listens there
    async with Fetcher() as fetcher:
        with pytest.raises(DiscoveryError, match="unreachable server") as caught:
            await discover(f"http://127.0.0.1:{port}/", fetcher, timeout=5)
    assert str(caught.value).count("unreachable server") == 3


async def test_well_known_that_is_not_a_source_description(site):
    s, base, fetcher = site
    s.add("/.well-known/resourcesync", b"<html>not here</html>", Content_Type="text/html")
    with pytest.raises(DiscoveryError, match=r"well-known URI .* not a ResourceSync document"):
        await discover(base, fetcher)
