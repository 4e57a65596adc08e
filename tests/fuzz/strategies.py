"""Grammar-aware hypothesis strategies: inputs that get past the first check.

Random bytes die in the XML or JSON tokenizer; the code worth fuzzing is what
runs after it.  These strategies build documents, envelopes and frames out
of the right names with hostile values (boundary integers, odd datetimes,
entities, CDATA, unknown namespaces, wrong JSON types), so most examples
reach the validation and round-trip code.  ``tests/test_sitemap_properties.py``
covers random bytes and mutations of well-formed documents; this is the
hand-written markup rsnotify itself would never produce.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

SM = "http://www.sitemaps.org/schemas/sitemap/0.9"
RS = "http://www.openarchives.org/rs/terms/"
RSN = "urn:x-rsnotify:notification:1"

# --- value pools -----------------------------------------------------------------------

DATETIMES = [
    "2013-01-03T09:00:00Z",
    "2013-01-03T09:00:00.123456Z",
    "2013-01-03T09:00:00+05:30",
    "2013-01-03T09:00:00-00:00",
    "2013-01-03",
    "2013-01",
    "2013",
    "2013-01-03T09:00Z",
    "2013-01-03T24:00:00Z",
    "2013-02-29T00:00:00Z",
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999Z",
    "9999-12-31T23:59:59-23:59",
    "0001-01-01T00:00:00+23:59",
    "20130103T090000Z",
    "2013-01-03T09:00:00,5Z",
    "2013-01-03T09:00:00.Z",
    "2013-01-03T09:00:00.1234567890123Z",
    "2013-01-03 09:00:00Z",
    "+2013-01-03T09:00:00Z",
    "\uff12\uff10\uff11\uff13-01-03T09:00:00Z"  # full-width digits,
    "yesterday",
    "",
]
INTEGERS = ["0", "1", "-1", "007", "1e3", "0x10", " 5 ", "٣", "9" * 30, "18446744073709551616"]
URIS = [
    "http://example.com/res1",
    "http://example.com/dir/../../etc/passwd",
    "file:///etc/passwd",
    "http://127.0.0.1:1/",
    "http://[::1]/x",
    "http://example.com/%2e%2e/%00",
    "//example.com/x",
    "/relative",
    "javascript:alert(1)",
    "http://exa mple.com/\u202e",
    "http://example.com/" + "a" * 300,
    "",
    " ",
]
CHANGES = ["created", "updated", "deleted", "moved", "CREATED", ""]
CAPABILITIES = [
    "changelist",
    "resourcelist",
    "capabilitylist",
    "description",
    "changedump",
    "changedump-manifest",
    "resourcedump",
    "changelist-notification",
    "bogus",
    "",
]
HASHES = ["md5:1e0d5cb8ef6ba40c99b14c0237be735e", "sha-256:", "md5", ":", "x:y z:w", ""]
ODD_TEXT = ["&amp;", "&lt;", "&#x41;", "&#0;", "&#xD800;", "&undefined;", "<![CDATA[x]]>", "\u2028",
            "http://e/a<url><loc>http://e/b</loc></url>tail"]  # fmt: skip

values = st.one_of(
    st.sampled_from(DATETIMES),
    st.sampled_from(INTEGERS),
    st.sampled_from(URIS),
    st.sampled_from(CHANGES),
    st.sampled_from(CAPABILITIES),
    st.sampled_from(HASHES),
    st.text(max_size=12),
)


def _attr(value: str) -> str:
    """Quote an attribute value: usually escaped, sometimes raw (entities, stray markup)."""
    return value.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")


# --- ResourceSync XML ------------------------------------------------------------------

MD_ATTRS = ["capability", "change", "datetime", "hash", "length", "type", "path", "encoding",
            "at", "completed", "from", "until", "rsn:seq", "rsn:collection", "rsn:changelist",
            "rsn:version", "rsn:detected", "rsn:published", "x:other", "xml:lang"]  # fmt: skip
LN_ATTRS = ["rel", "href", "hash", "length", "modified", "path", "type", "pri", "encoding",
            "x:other", "xml:lang"]  # fmt: skip


@st.composite
def md_element(draw: st.DrawFn, prefix: str = "rs") -> str:
    names = draw(st.lists(st.sampled_from(MD_ATTRS), max_size=6, unique=True))
    if draw(st.booleans()):
        names = ["capability", *[n for n in names if n != "capability"]]
    attrs = "".join(f' {n}="{_attr(draw(values))}"' for n in names)
    return f"<{prefix}:md{attrs}/>"


@st.composite
def ln_element(draw: st.DrawFn) -> str:
    names = draw(st.lists(st.sampled_from(LN_ATTRS), max_size=6, unique=True))
    attrs = "".join(f' {n}="{_attr(draw(values))}"' for n in names)
    return f"<rs:ln{attrs}/>"


@st.composite
def text_element(draw: st.DrawFn, name: str) -> str:
    raw = draw(st.one_of(values.map(_attr), st.sampled_from(ODD_TEXT)))
    return f"<{name}>{raw}</{name}>"


@st.composite
def entry_element(draw: st.DrawFn, tag: str) -> str:
    parts = draw(
        st.lists(
            st.one_of(
                text_element("loc"),
                text_element("lastmod"),
                text_element("changefreq"),
                md_element(),
                ln_element(),
                st.just("<x:unknown>1</x:unknown>"),
                st.just("<url><loc>http://example.com/nested</loc></url>"),
                st.just("<!-- comment -->"),
            ),
            max_size=6,
        )
    )
    return f"<{tag}>{''.join(parts)}</{tag}>"


@st.composite
def resourcesync_xml(draw: st.DrawFn) -> bytes:
    """A hand-written list or index: right names, hostile values, odd shapes."""
    root = draw(st.sampled_from(["urlset", "sitemapindex", "rs:urlset", "feed"]))
    entry_tag = draw(st.sampled_from(["url", "sitemap"]))
    sm_ns = draw(st.sampled_from([SM, SM, SM, "http://www.sitemaps.org/schemas/sitemap/0.8", ""]))
    rs_ns = draw(st.sampled_from([RS, RS, RS, "urn:other"]))
    x_ns = draw(st.sampled_from(["urn:x", "urn:x", "urn:{x}y"]))
    decls = f'xmlns="{sm_ns}" xmlns:rs="{rs_ns}" xmlns:rsn="{RSN}" xmlns:x="{x_ns}"'
    header = draw(st.lists(st.one_of(md_element(), ln_element()), max_size=3))
    if draw(st.booleans()):
        header.insert(0, draw(md_element()))
    body = draw(st.lists(entry_element(entry_tag), max_size=4))
    prolog = draw(
        st.sampled_from(
            ["", '<?xml version="1.0" encoding="UTF-8"?>\n', "\ufeff", '<?xml version="1.1"?>']
        )
    )
    text = f"{prolog}<{root} {decls}>{''.join(header)}{''.join(body)}</{root}>"
    encoding = draw(st.sampled_from(["utf-8", "utf-8", "utf-16", "latin-1"]))
    return text.encode(encoding, "replace")


# --- JSON --------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    values,
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _mutated(base: dict[str, Any], fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy:
    """``base`` with some keys dropped and some replaced by hostile values."""

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        obj = dict(base)
        for key in draw(st.lists(st.sampled_from(sorted(base)), max_size=3, unique=True)):
            del obj[key]
        for key in draw(st.lists(st.sampled_from(sorted(fields)), max_size=4, unique=True)):
            obj[key] = draw(st.one_of(fields[key], json_values))
        return obj

    return build()


VALID_ENVELOPE = {
    "v": 1,
    "collection": "c1",
    "seq": 7,
    "capabilitylist": "http://example.com/capabilitylist.xml",
    "changelist": "http://example.com/changelist.xml",
    "loc": "http://example.com/res1",
    "change": "updated",
    "datetime": "2013-01-03T09:00:00Z",
}
ENVELOPE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "v": st.integers(-2, 3),
    "collection": st.sampled_from(["c1", "C1", "-x", "a" * 201, "", "..", "a/b"]),
    "seq": st.integers(min_value=-1, max_value=2**64),
    "capabilitylist": st.sampled_from(URIS),
    "changelist": st.sampled_from(URIS),
    "loc": st.sampled_from(URIS) | st.text(max_size=20),
    "change": st.sampled_from(CHANGES),
    "datetime": st.sampled_from(DATETIMES),
    "lastmod": st.sampled_from(DATETIMES),
    "detected": st.sampled_from(DATETIMES),
    "published": st.sampled_from(DATETIMES),
    "hash": st.sampled_from(HASHES),
    "length": st.integers(min_value=-1, max_value=2**64),
    "type": st.text(max_size=10),
    "links": st.lists(
        st.fixed_dictionaries(
            {"rel": st.sampled_from(["duplicate", ""]), "href": st.sampled_from(URIS)},
            optional={
                "modified": st.sampled_from(DATETIMES) | json_values,
                "length": st.integers(-1, 2**64) | json_values,
                "pri": st.integers(-1, 10**6) | json_values,
                "hash": st.sampled_from(HASHES) | json_values,
                "path": st.text(max_size=5) | json_values,
                "x-unknown": json_values,
            },
        ),
        max_size=2,
    ),
}


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")


envelope_json = _mutated(VALID_ENVELOPE, ENVELOPE_FIELDS).map(_dump)


@st.composite
def envelope_xml(draw: st.DrawFn) -> bytes:
    """The Change Notification form, hand-written: a urlset with md/ln and entries."""
    header = [
        draw(
            st.sampled_from(
                [
                    '<rs:md capability="changelist-notification" rsn:collection="c1" '
                    'rsn:changelist="http://example.com/cl.xml" rsn:version="1"/>',
                    '<rs:md capability="changelist-notification"/>',
                ]
            )
            | md_element()
        ),
        draw(st.just('<rs:ln rel="up" href="http://example.com/cap.xml"/>') | ln_element()),
    ]
    entries = draw(st.lists(entry_element("url"), min_size=0, max_size=2))
    decls = f'xmlns="{SM}" xmlns:rs="{RS}" xmlns:rsn="{RSN}" xmlns:x="urn:x"'
    return f"<urlset {decls}>{''.join(header)}{''.join(entries)}</urlset>".encode()


signatures = st.one_of(
    st.none(),
    st.sampled_from(["", "k1", "k1:", "k1:sha256=", "k1:sha1=00", ":sha256=00", "k3:sha256=ab"]),
    st.text(max_size=80),
    st.text("0123456789abcdef", min_size=64, max_size=64).map(lambda h: f"k1:sha256={h}"),
    st.text(max_size=70).map(lambda digest: f"k1:sha256={digest}"),
)

# --- WebSocket frames ----------------------------------------------------------------------

FRAME_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "type": st.sampled_from(
        ["hello", "notification", "skipped", "gap_too_old", "heartbeat", "error", "x", ""]
    ),
    "collection": ENVELOPE_FIELDS["collection"],
    "head": st.integers(-1, 2**64),
    "earliest": st.integers(-1, 2**64),
    "heartbeat": st.sampled_from(DATETIMES),
    "server": st.text(max_size=10),
    "seq": st.integers(-1, 2**64),
    "prev": st.integers(-1, 2**64),
    "format": st.sampled_from(["json", "xml", "yaml"]),
    "payload": st.one_of(
        envelope_json.map(lambda b: b.decode("utf-8", "surrogatepass")),
        st.text(max_size=20),
        st.just("\ud800"),
    ),
    "signature": signatures,
    "from": st.integers(-1, 2**64),
    "resume": st.integers(-1, 2**64),
    "since": st.integers(-1, 2**64),
    "capabilitylist": st.sampled_from(URIS),
    "code": st.text(max_size=10),
    "message": st.text(max_size=10),
}


@st.composite
def server_frames(draw: st.DrawFn) -> str:
    kind = draw(FRAME_FIELDS["type"])
    base = {"type": kind, "collection": "c1"}
    for key in draw(st.lists(st.sampled_from(sorted(FRAME_FIELDS)), max_size=8, unique=True)):
        base[key] = draw(FRAME_FIELDS[key] | json_values)
    return json.dumps(base, ensure_ascii=draw(st.booleans()))


SUBSCRIBE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "type": st.sampled_from(["subscribe", "Subscribe", ""]),
    "collections": st.dictionaries(
        st.sampled_from(["c1", "c2", "", "A", "a" * 201, "a/b"]) | st.text(max_size=6),
        st.none() | st.integers(-1, 2**64) | json_values,
        max_size=4,
    ),
    "prefix": st.none() | st.sampled_from(URIS) | st.text(max_size=10),
    "change": st.none() | st.lists(st.sampled_from(CHANGES) | json_values, max_size=4),
}


@st.composite
def client_frames(draw: st.DrawFn) -> str:
    obj: dict[str, Any] = {"type": "subscribe", "collections": {"c1": None}}
    for key in draw(st.lists(st.sampled_from(sorted(SUBSCRIBE_FIELDS)), max_size=4, unique=True)):
        obj[key] = draw(SUBSCRIBE_FIELDS[key] | json_values)
    return json.dumps(obj, ensure_ascii=draw(st.booleans()))


QUERY_KEYS = ["since", "prefix", "change", "access_token", "x"]
QUERY_VALUES = ["0", "-1", "5", "9" * 25, "", "http://example.com/", "created,deleted", "moved",
                "%00", "%ZZ", "%C3%28", "a&b", "٣"]  # fmt: skip


@st.composite
def request_targets(draw: st.DrawFn) -> str:
    paths = ["/", "/c1", "/c1/", "//c1", "//[c1", "/%2e%2e", "c1", "/a" * 150, ""]
    path = draw(st.sampled_from(paths))
    pairs = draw(
        st.lists(
            st.tuples(
                st.sampled_from(QUERY_KEYS) | st.text(max_size=4),
                st.sampled_from(QUERY_VALUES) | st.text(max_size=6),
            ),
            max_size=20,
        )
    )
    query = "&".join(f"{k}={v}" for k, v in pairs)
    separator = draw(st.sampled_from(["?", "?", "#", ";"]))
    return path + (separator + query if pairs else "")
