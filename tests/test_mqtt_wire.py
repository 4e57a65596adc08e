"""The pure parts of rsnotify's MQTT wire (issue 18): topic names, the 3.1.1 signature, errors.

* Topic names: every level any broker we know accepts (no ``.``, space,
  ``+``, ``#``, leading ``$``; at most 64 characters), stable, and distinct
  for distinct collections; a bad ``--topic-prefix`` is one clear line.
* The MQTT 3.1.1 signature trailer: attaching and detaching give back the
  signed bytes exactly, for JSON and XML, and plain readers still parse the
  payload.
* One line per broker problem, naming what to change.

The brokers themselves are in ``test_transport_mqtt.py`` and ``test_mqtt_brokers.py``.
"""

from __future__ import annotations

import json
import re
import socket
import ssl
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree

from rsnotify import envelope
from rsnotify.collection import collection_id, is_valid_collection_id
from rsnotify.transport import mqttproblems, mqttsig
from rsnotify.transport.mqtturl import parse_broker_url
from rsnotify.transport.topics import (
    MAX_LEVEL,
    InvalidTopic,
    Topics,
    check_prefix,
    prefix_of,
    topic_level,
)
from tests.devstack import rsnotify_command

BROKER_SAFE = re.compile(r"[A-Za-z0-9_-]{1,64}")

uris = st.builds(
    lambda host, port, path: f"https://{host}{port}/{path}",
    st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}\.){1,4}[a-z]{2,6}", fullmatch=True),
    st.sampled_from(["", ":8080", ":443"]),
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="#?"),
        max_size=300,
    ),
)
collection_ids = st.one_of(
    st.builds(collection_id, uris),
    st.from_regex(r"[a-z0-9][a-z0-9._-]{0,199}", fullmatch=True),
)


# --- topic names -------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(collection_ids)
def test_every_topic_level_is_broker_safe_bounded_and_stable(cid: str) -> None:
    assert is_valid_collection_id(cid)
    level = topic_level(cid)
    assert BROKER_SAFE.fullmatch(level), level
    assert len(level) <= MAX_LEVEL
    assert topic_level(cid) == level  # a pure function of the id
    topics = Topics("resourcesync")
    for topic in (topics.changes(cid), topics.head(cid)):
        assert all(BROKER_SAFE.fullmatch(part) for part in topic.split("/")), topic
        assert len(topic.encode()) <= 256  # AWS IoT's limit, the tightest we know


@settings(max_examples=40, deadline=None)
@given(st.sets(collection_ids, min_size=2, max_size=40))
def test_distinct_collections_get_distinct_topic_levels(cids: set[str]) -> None:
    assert len({topic_level(c) for c in cids}) == len(cids)


def test_collections_that_fold_to_the_same_text_keep_distinct_levels() -> None:
    # Dots and dashes fold alike, and so do long ids past the readable part:
    # the digest of the whole id keeps them apart.
    pairs = [
        ("example.org-c1-deadbeef", "example-org-c1-deadbeef"),
        ("a" * 120 + ".x", "a" * 120 + ".y"),
        ("h.example-c-00000000", "h-example.c-00000000"),
    ]
    for one, other in pairs:
        assert topic_level(one) != topic_level(other), (one, other)
    # An id that is already safe is its own level: readable, and unchanged for
    # deployments whose ids had no dots.
    assert topic_level("localhost-c1-1234abcd") == "localhost-c1-1234abcd"
    level = topic_level(collection_id("https://source.example.org/rs/capabilitylist.xml"))
    assert level.startswith("source-example-org-rs-capabilitylist-")


def test_subscribers_read_the_legacy_names_beside_the_safe_ones() -> None:
    cid = "source.example.org-c1-0a1b2c3d"
    read = Topics("rs").read(cid)
    assert [(t, k, legacy) for t, k, legacy in read] == [
        (f"rs/{topic_level(cid)}/changes", "changes", False),
        (f"rs/{topic_level(cid)}/head", "head", False),
        (f"rs/{cid}/changes", "changes", True),
        (f"rs/{cid}/head", "head", True),
    ]
    assert Topics("rs", legacy=True).changes(cid) == f"rs/{cid}/changes"
    assert len(Topics("rs").read("plain-id")) == 2  # nothing legacy to add


@pytest.mark.parametrize(
    ("prefix", "why"),
    [
        ("example.org", "not 1-64 of letters"),
        ("my prefix", "not 1-64 of letters"),
        ("a/+/b", "not 1-64 of letters"),
        ("a/#", "not 1-64 of letters"),
        ("$SYS", "not 1-64 of letters"),
        ("a//b", "not 1-64 of letters"),
        ("", "it is empty"),
        ("/", "it is empty"),
        ("x" * 65, "not 1-64 of letters"),
        ("a/b/c/d/e", "more than 4 levels"),
        ("é", "not 1-64 of letters"),
    ],
)
def test_a_bad_topic_prefix_is_one_line_that_says_what_to_use(prefix: str, why: str) -> None:
    with pytest.raises(InvalidTopic) as caught:
        check_prefix(prefix)
    message = str(caught.value)
    assert why in message and "\n" not in message
    assert "letters, digits, '-' and '_'" in message and "MQTT 3.1.1 section 4.7" in message


def test_good_prefixes_and_advertised_topics() -> None:
    assert check_prefix("/resourcesync/") == "resourcesync"
    assert check_prefix("Org_A/rs-2/x/y") == "Org_A/rs-2/x/y"
    assert prefix_of("/rs/a/b/level/changes") == "rs/a/b"
    assert prefix_of("rs/level/changes") == "rs"
    assert prefix_of("rs/changes") is None and prefix_of("rs/x/head") is None


def test_the_cli_refuses_a_bad_prefix_before_starting() -> None:
    for command in (["publish", "http://127.0.0.1:9/"], ["subscribe", "http://h/", "--into", "d"]):
        done = subprocess.run(
            rsnotify_command(*command, "--topic-prefix", "example.org"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done
        assert "Traceback" not in done.stderr
        lines = [line for line in done.stderr.splitlines() if "topic prefix" in line]
        assert len(lines) == 1 and "letters, digits, '-' and '_'" in lines[0], done.stderr


# --- the MQTT 3.1.1 signature -------------------------------------------------------------

SIGNATURE = "k1:sha256=" + "ab" * 32


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.text(max_size=20), st.text(max_size=40), min_size=1, max_size=8),
    st.from_regex(r"[A-Za-z0-9._~-]{1,20}", fullmatch=True),
)
def test_a_json_trailer_detaches_to_the_exact_signed_bytes(
    body: dict[str, str], key_id: str
) -> None:
    payload = envelope.dumps(body)
    signature = envelope.sign(payload, b"secret", key_id)
    carried = mqttsig.attach(payload, signature)
    assert mqttsig.detach(carried) == (payload, signature)
    envelope.verify(mqttsig.detach(carried)[0], signature, {key_id: b"secret"})
    # A reader that knows nothing of it sees one more member, last.
    assert json.loads(carried) == {**body, envelope.SIGNATURE_PROPERTY: signature}
    assert mqttsig.detach(payload) == (payload, None)  # nothing to detach: unchanged


def test_an_xml_trailer_is_a_processing_instruction_plain_parsers_skip() -> None:
    payload = b'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="x"><url/></urlset>'
    carried = mqttsig.attach(payload, SIGNATURE)
    assert carried.endswith(b"<?rsnotify-signature " + SIGNATURE.encode() + b"?>")
    assert mqttsig.detach(carried) == (payload, SIGNATURE)
    root = etree.fromstring(carried, etree.XMLParser(resolve_entities=False, no_network=True))
    assert root.tag == "{x}urlset"


def test_only_an_exact_trailer_is_detached() -> None:
    payload = b'{"a":1}'
    carried = mqttsig.attach(payload, SIGNATURE)
    for altered in (
        carried + b"x",  # something after the trailer
        carried.replace(b'"rsnotify-signature"', b'"rsnotify-signature2"'),
        carried[:-1],
    ):
        assert mqttsig.detach(altered)[1] is None
    assert mqttsig.detach(carried + b"\n") == (payload, SIGNATURE)
    with pytest.raises(mqttsig.TrailerUnsupported):
        mqttsig.attach(b"{}", SIGNATURE)
    with pytest.raises(mqttsig.TrailerUnsupported):
        mqttsig.attach(b"plain text", SIGNATURE)
    with pytest.raises(mqttsig.TrailerUnsupported):
        mqttsig.check_key_id("odd?>id")


# --- one line per problem --------------------------------------------------------------

CTX = mqttproblems.Context(parse_broker_url("mqtt://alice:pw@broker.test:1883"), "--via", "cid1")
ANON = mqttproblems.Context(parse_broker_url("mqtt://broker.test:1883"), "--mqtt", "cid1")


@pytest.mark.parametrize(
    ("ctx", "code", "kind", "says"),
    [
        (CTX, 0x84, "protocol", "--mqtt-protocol"),
        (CTX, 0x85, "refused", "client id 'cid1'"),
        (CTX, 0x86, "refused", "fix USER:PASSWORD in --via"),
        (ANON, 0x86, "refused", "put them in --mqtt"),
        (CTX, 0x87, "refused", "check USER:PASSWORD in --via"),
        (ANON, 0x87, "refused", "put a user name and password in --mqtt"),
        (CTX, 0x88, "refused", "starting or overloaded"),
        (CTX, 0x8A, "refused", "banned"),
    ],
)
def test_a_refused_connection_says_what_to_change(
    ctx: mqttproblems.Context, code: int, kind: str, says: str
) -> None:
    problem = mqttproblems.refused(code, "Name", ctx, "5")
    assert problem.kind == kind and says in problem.line and "\n" not in problem.line
    assert "pw" not in problem.line.replace("password", "")  # never the password
    assert problem.lasting == (code in mqttproblems.LASTING)


@pytest.mark.parametrize(
    ("exc", "says"),
    [
        (ConnectionRefusedError(111, "Connection refused"), "start the broker, or fix the host"),
        (socket.gaierror(-2, "Name or service not known"), "fix the host name in --via"),
        (TimeoutError("timed out"), "any firewall"),
        (ssl.SSLError(1, "[SSL] wrong version number"), "mqtts:// needs the broker's TLS"),
        (OSError(113, "No route to host"), "No route to host"),
    ],
)
def test_an_unreachable_broker_says_what_to_change(exc: OSError, says: str) -> None:
    problem = mqttproblems.unreachable(exc, CTX, 10.0)
    assert problem.kind == "unreachable" and says in problem.line
    assert "\n" not in problem.line and "broker.test:1883" in problem.line


def test_refused_topics_say_which_acl_entry_is_missing() -> None:
    line = mqttproblems.publish_refused("rs/c/changes", 0x87, "Not authorized", CTX)
    assert "allow user 'alice' to write rs/# in the broker's ACL" in line
    line = mqttproblems.subscribe_refused("a/b/c/changes", "Unspecified error", CTX)
    assert "read a/b/+/changes and a/b/+/head" in line
    line = mqttproblems.publish_refused("rs/c/changes", 0x90, "Topic Name invalid", CTX)
    assert "--topic-prefix of letters" in line
