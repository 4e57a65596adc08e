"""Regression tests: one per input the fuzzers found, fixed in the code named.

Each input once escaped as an undocumented exception (or broke a round
trip); now it is answered with a documented error.
"""

from __future__ import annotations

import json

import pytest

from rsnotify import envelope, sitemap, w3cdt
from rsnotify.envelope import InvalidNotification, SignatureError
from rsnotify.errors import InvalidDatetime, InvalidDocument, InvalidValue
from rsnotify.transport import wsproto
from rsnotify.transport.wsproto import InvalidSubscription

from .targets import envelope_payload

GOOD = {
    "v": 1,
    "collection": "c1",
    "seq": 7,
    "capabilitylist": "http://example.com/capabilitylist.xml",
    "changelist": "http://example.com/changelist.xml",
    "loc": "http://example.com/res1",
    "change": "updated",
    "datetime": "2013-01-03T09:00:00Z",
}


def payload(**fields: object) -> bytes:
    return json.dumps({**GOOD, **fields}).encode()


# Finding 1 (hypothesis, envelope-json): a valid W3C datetime whose UTC instant is
# outside datetime's range escaped as OverflowError from w3cdt.parse -- through
# envelope.decode (a subscriber's message handler) and sitemap.parse alike.
@pytest.mark.parametrize(
    "value", ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59", "0001-01-01T00:00+01:00"]
)
def test_a_datetime_beyond_the_representable_range_is_an_invalid_datetime(value: str) -> None:
    with pytest.raises(InvalidDatetime):
        w3cdt.parse(value)
    with pytest.raises(InvalidNotification):
        envelope.decode(payload(datetime=value))
    document = (
        '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
        'xmlns:rs="http://www.openarchives.org/rs/terms/"><rs:md capability="changelist"/>'
        f'<url><loc>http://e/x</loc><rs:md change="created" datetime="{value}"/></url></urlset>'
    )
    with pytest.raises(InvalidValue):
        sitemap.parse(document.encode())


# Finding 2 (hypothesis, envelope-json): JSON took " " and " http://x" as URIs; the
# XML form strips them, so the same notification named another resource (or none).
@pytest.mark.parametrize("key", ["loc", "capabilitylist", "changelist"])
@pytest.mark.parametrize("value", [" ", " http://example.com/x", "http://example.com/x\n"])
def test_uris_with_surrounding_white_space_are_refused(key: str, value: str) -> None:
    with pytest.raises(InvalidNotification, match="white space"):
        envelope.decode(payload(**{key: value}))


# Finding 3 (hypothesis, envelope-json): JSON carried control characters and lone
# surrogates that no Change List can hold; re-encoding as XML raised ValueError and a
# lone surrogate cannot be written as UTF-8 (paths, the apply log).
# (Since the decoder is orjson, an escaped lone surrogate is refused as JSON already:
# no valid JSON text holds one.)
@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"type": "\x1f"}, r"XML 1\.0"),
        ({"loc": "http://example.com/\x00"}, r"XML 1\.0"),
        ({"hash": "md5:\ud800"}, r"not JSON.*surrogate"),
        (
            {"links": [{"rel": "duplicate", "href": "http://example.com/\udfff"}]},
            r"not JSON.*surrogate",
        ),
    ],
)
def test_text_xml_cannot_carry_is_refused(fields: dict[str, object], why: str) -> None:
    with pytest.raises(InvalidNotification, match=why):
        envelope.decode(payload(**fields))
    envelope_payload(payload())  # and a clean one still round-trips


# Finding 4 (atheris, envelope): a signature "k1:sha256=<non-ASCII>" made
# hmac.compare_digest raise TypeError inside the subscriber's message handler.
@pytest.mark.parametrize("digest", ["\x97c", "é" * 64, "\udcff"])
def test_a_non_ascii_digest_is_a_signature_error(digest: str) -> None:
    data = payload()
    with pytest.raises(SignatureError, match="does not match"):
        envelope.verify(data, f"k1:sha256={digest}", {"k1": b"secret"})


# Finding 5 (atheris, sitemap): a <url> nested inside <loc> was read differently
# depending on where the chunk boundaries fell (the text after the nested entry was
# glued to <loc> only when it arrived after the entry had been removed).
def test_an_entry_nested_inside_another_element_is_refused() -> None:
    document = (
        b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
        b'xmlns:rs="http://www.openarchives.org/rs/terms/"><rs:md capability="resourcelist"/>'
        b"<url><loc>http://e/0</loc></url><url><loc>http://e/a<url><loc>http://e/b</loc></url>tail</loc></url></urlset>"
    )
    for chunk_size in (7, 1 << 16):
        limits = sitemap.Limits(chunk_size=chunk_size)
        with pytest.raises(InvalidDocument, match="nested inside <loc>"):
            sitemap.parse(document, limits=limits)


# Finding 6 (atheris, envelope): JSON links kept unknown keys and unchecked values
# ("pri": "x", "modified": 5) that the XML form drops or refuses; re-encoding such a
# notification as XML failed or changed it.
@pytest.mark.parametrize(
    "link",
    [
        {"rel": "duplicate", "href": "http://e/x", "pri": 0},
        {"rel": "duplicate", "href": "http://e/x", "pri": "1"},
        {"rel": "duplicate", "href": "http://e/x", "modified": 5},
        {"rel": "duplicate", "href": "http://e/x", "modified": "yesterday"},
        {"rel": "duplicate", "href": "http://e/x", "length": -1},
        {"rel": "", "href": "http://e/x"},
    ],
)
def test_links_are_held_to_the_document_parsers_rules(link: dict[str, object]) -> None:
    with pytest.raises(InvalidNotification, match="link"):
        envelope.decode(payload(links=[link]))


def test_unknown_link_keys_are_dropped_so_both_forms_agree() -> None:
    link = {"rel": "duplicate", "href": "http://e/x", "pvi": 1, "pri": 2}
    decoded = envelope.decode(payload(links=[link]))
    assert decoded.links == [{"rel": "duplicate", "href": "http://e/x", "pri": 2}]
    envelope_payload(payload(links=[link]))  # JSON and XML round trips agree


# Finding 7 (atheris, ws-client): a handshake request target like "//[x" made
# urlsplit raise ValueError ("Invalid IPv6 URL") out of wsproto.parse_target, so the
# gateway's handler died with an undocumented exception instead of a 1008 refusal.
@pytest.mark.parametrize("target", ["//[x", "//[::1/c1", "//x]/c1?since=1"])
def test_a_malformed_request_target_is_a_bad_request(target: str) -> None:
    with pytest.raises(InvalidSubscription) as refused:
        wsproto.parse_target(target)
    assert refused.value.code == "bad_request"
    assert wsproto.query_token(target) is None


HEAD = (
    '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
    'xmlns:rs="http://www.openarchives.org/rs/terms/" {decls}>'
    '<rs:md capability="resourcelist" {md}/>'
    '<url><loc>http://e/a</loc><rs:ln rel="duplicate" href="http://m/a" {ln}/></url></urlset>'
)


def document(decls: str = "", md: str = "", ln: str = "") -> bytes:
    return HEAD.format(decls=decls, md=md, ln=ln).encode()


# Finding 8 (hypothesis, envelope-xml): a document-level rs:md with a datetime
# attribute (an entry attribute) escaped as TypeError from Document(datetime=...).
def test_a_document_level_datetime_is_kept_as_an_extra_attribute() -> None:
    parsed = sitemap.parse(document(md='datetime="2013-01-03T09:00:00Z"'))
    assert parsed.md_extra == {"datetime": "2013-01-03T09:00:00Z"}
    assert sitemap.parse(sitemap.serialize(parsed)) == parsed


# Finding 9 (atheris, sitemap): an xml:* attribute (xml:lang on an rs:ln) was written
# back with an xmlns:ns0 declaration for the XML namespace, which XML forbids: the
# serialized document could not be read again.
def test_xml_namespace_attributes_are_written_with_the_xml_prefix() -> None:
    parsed = sitemap.parse(document(ln='xml:lang="en"'))
    written = sitemap.serialize(parsed)
    assert b' xml:lang="en"' in written and b"XML/1998" not in written
    assert sitemap.parse(written) == parsed


# Finding 10 (atheris, envelope): a namespace URI holding braces made lxml's attrib
# raise KeyError (its "{ns}local" names become ambiguous); such names are refused.
@pytest.mark.parametrize("where", ["md", "ln"])
def test_attributes_in_a_namespace_with_braces_are_refused(where: str) -> None:
    attribute = {where: 'x:a="1"'}
    with pytest.raises(InvalidValue, match="braces"):
        sitemap.parse(document(decls='xmlns:x="urn:a:{http://b/}c"', **attribute))
    with pytest.raises(InvalidNotification):
        envelope.decode(document(decls='xmlns:x="urn:a:{http://b/}c"', **attribute))
