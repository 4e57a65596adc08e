"""The envelope codec: canonical JSON bytes, and the ``published`` stamp transports add."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree

from rsnotify import envelope, outbound, w3cdt
from rsnotify.envelope import InvalidNotification

_STDLIB = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)

# What an envelope can hold: JSON scalars (64-bit ints), strings of any code
# point but lone surrogates (which no UTF-8 payload can carry), lists, objects.
_text = st.text(st.characters(blacklist_categories=("Cs",)))
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_text, _json, max_size=6))
def test_dumps_is_byte_identical_to_the_stdlib_canonical_form(value: dict) -> None:
    # Signatures cover exact bytes and _stamp splices into them: the encoder
    # must not change a byte from the canonical form the log has always held.
    assert envelope.dumps(value) == _STDLIB.encode(value).encode()


def _sample() -> envelope.Notification:
    raw = envelope.dumps(
        {
            "v": 1,
            "type": "notification",
            "collection": "example.org-c1-capabilitylist-00000000",
            "seq": 7,
            "capabilitylist": "http://example.org/capabilitylist.xml",
            "changelist": "http://example.org/changelist.xml",
            "loc": "http://example.org/r/%C3%A9.txt",
            "change": "updated",
            "datetime": "2026-11-22T06:00:00.5Z",
            "length": 12,
        }
    )
    return envelope.from_json(raw)


def test_a_decoded_envelope_encodes_back_to_the_same_bytes() -> None:
    n = _sample()
    assert envelope.from_json(envelope.to_json(n)) == n
    assert envelope.to_json(envelope.from_json(envelope.to_json(n))) == envelope.to_json(n)


@pytest.mark.parametrize(
    "payload",
    [b"", b"{", b"\xff\xfe", b'{"a": NaN}', b"[" * 5000 + b"]" * 5000, b'"\\ud800"', b"[]"],
)
def test_garbage_is_an_invalid_notification(payload: bytes) -> None:
    with pytest.raises(InvalidNotification):
        envelope.from_json(payload)


def test_a_link_with_a_blank_href_is_an_invalid_notification() -> None:
    """Found by the envelope fuzzer: " " decoded, was stripped to "", and "" did not decode."""
    raw = json.loads(envelope.to_json(_sample()))
    raw["links"] = [{"rel": "duplicate", "href": " "}]
    with pytest.raises(InvalidNotification, match="rel and href"):
        envelope.from_json(json.dumps(raw).encode())


def test_published_now_is_the_current_time_with_six_fraction_digits() -> None:
    before = datetime.now(UTC)
    stamp = outbound.published_now()
    after = datetime.now(UTC)
    assert stamp.endswith("Z") and len(stamp) == len("2026-11-22T06:00:00.000000Z")
    assert before <= w3cdt.parse(stamp) <= after


def test_render_stamps_published_and_keeps_the_canonical_form() -> None:
    from rsnotify.log import LogRecord

    data = envelope.to_json(_sample())
    rendered = outbound.render(LogRecord(seq=7, data=data, logged_ms=0))
    obj = json.loads(rendered.payload)
    assert w3cdt.parse(obj["published"]) is not None
    assert rendered.payload == _STDLIB.encode(obj).encode()


def test_a_shared_renderer_renders_each_record_once_and_forgets_the_oldest() -> None:
    from rsnotify.log import LogRecord

    signer = outbound.Signer("k1", b"secret")
    renderer = outbound.Renderer("json", signer, size=2)
    data = envelope.to_json(_sample())
    first = renderer.render("c", LogRecord(seq=7, data=data, logged_ms=0))
    # Another transport asking for the same record gets the same bytes, stamp and signature.
    assert renderer.render("c", LogRecord(seq=7, data=data, logged_ms=0)) is first
    assert first.signature == signer.sign(first.payload)
    assert renderer.render("d", LogRecord(seq=7, data=data, logged_ms=0)) is not first
    renderer.render("c", LogRecord(seq=8, data=data, logged_ms=0))
    # Bounded: the oldest was forgotten, so it is rendered afresh (a new object).
    assert renderer.render("c", LogRecord(seq=7, data=data, logged_ms=0)) is not first
    with pytest.raises(ValueError):
        outbound.Renderer("yaml")


# -- derived changes (issue 23): found between two Resource List snapshots ---------------


def _derived(
    since: datetime | None = datetime(2026, 11, 22, 5, tzinfo=UTC),
) -> envelope.Notification:
    from dataclasses import replace

    from rsnotify.tracker import Snapshots

    until = datetime(2026, 11, 22, 6, tzinfo=UTC)
    return replace(
        _sample(),
        changelist="http://example.org/resourcelist.xml",
        derived=Snapshots("http://example.org/resourcelist.xml", since, until),
    )


RS = "http://www.openarchives.org/rs/terms/"


def _change_md(xml: bytes) -> list[etree._Element]:
    """The ``rs:md`` of each change (the root's is the first)."""
    return list(etree.fromstring(xml).iter(f"{{{RS}}}md"))[1:]


@pytest.mark.parametrize("since", [datetime(2026, 11, 22, 5, tzinfo=UTC), None])
def test_a_derived_change_round_trips_in_json_and_xml(since: datetime | None) -> None:
    n = _derived(since)
    obj = json.loads(envelope.to_json(n))
    expected = {
        "resourcelist": "http://example.org/resourcelist.xml",
        "until": "2026-11-22T06:00:00Z",
    }
    if since is not None:
        expected["from"] = "2026-11-22T05:00:00Z"  # omitted, not null, when unknown
    assert obj["derived"] == expected
    assert envelope.from_json(envelope.to_json(n)) == n
    xml = envelope.to_xml(n)
    (md,) = _change_md(xml)
    assert md.get(f"{{{envelope.RSNOTIFY_NS}}}derived-until") == "2026-11-22T06:00:00Z"
    assert (md.get(f"{{{envelope.RSNOTIFY_NS}}}derived-from") is not None) == (since is not None)
    assert envelope.from_xml(xml, max_bytes=len(xml)).derived == n.derived
    # A Change List entry says nothing of snapshots, in either form.
    plain = _sample()
    assert "derived" not in json.loads(envelope.to_json(plain))
    assert b"derived" not in envelope.to_xml(plain)
    assert envelope.from_xml(envelope.to_xml(plain)).derived is None


@pytest.mark.parametrize(
    "derived",
    [
        "http://example.org/resourcelist.xml",  # not an object
        [],
        {"until": "2026-11-22T06:00:00Z"},  # no resourcelist
        {"resourcelist": 3, "until": "2026-11-22T06:00:00Z"},
        {"resourcelist": "http://example.org/rl.xml"},  # no until
        {"resourcelist": "http://example.org/rl.xml", "until": "yesterday"},
        {"resourcelist": "http://example.org/rl.xml", "until": "2026-11-22T06:00:00Z", "from": 5},
        {  # from after until
            "resourcelist": "http://example.org/rl.xml",
            "from": "2026-11-22T07:00:00Z",
            "until": "2026-11-22T06:00:00Z",
        },
        {"resourcelist": " http://example.org/rl.xml", "until": "2026-11-22T06:00:00Z"},
        {"resourcelist": "http://example.org/\x00", "until": "2026-11-22T06:00:00Z"},
    ],
)
def test_a_derived_field_of_the_wrong_shape_is_refused(derived: object) -> None:
    obj = json.loads(envelope.to_json(_sample()))
    obj["derived"] = derived
    with pytest.raises(InvalidNotification, match="derived"):
        envelope.from_json(envelope.dumps(obj))


def test_unknown_keys_inside_derived_are_ignored_and_null_is_absent() -> None:
    obj = json.loads(envelope.to_json(_derived()))
    obj["derived"]["parts"] = ["later versions may say more"]
    assert envelope.from_json(envelope.dumps(obj)) == _derived()
    obj["derived"] = None
    assert envelope.from_json(envelope.dumps(obj)).derived is None


def test_a_derived_mark_half_carried_in_xml_is_refused() -> None:
    xml = envelope.to_xml(_derived())
    no_until = re.sub(rb' \w+:derived-until="[^"]*"', b"", xml)
    assert no_until != xml
    with pytest.raises(InvalidNotification, match="derived"):
        envelope.from_xml(no_until)
