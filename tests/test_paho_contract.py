"""The private parts of paho-mqtt that rsnotify relies on are still there.

rsnotify uses paho's public API except in two places:
:func:`rsnotify.transport.pahoprivate.cap_inflight` writes
``Client._max_inflight_messages`` at CONNACK to honour the broker's MQTT 5
Receive Maximum, because paho's public setter refuses any change once
connected; :func:`rsnotify.transport.pahoprivate.lighten` swaps
``Client._on_message_filtered`` (paho's table of per-filter callbacks) for a
subclass whose lookup of an empty table makes no garbage cycle.  The test
suite also samples ``Client._out_messages`` (paho's queue of unacknowledged
QoS 1 messages) to check the pusher never queues in memory.  pyproject.toml
pins ``paho-mqtt<3`` for this; if a paho release renames any of these
attributes, these tests fail before anything else does.
"""

from __future__ import annotations

import inspect

import paho.mqtt.client as mqtt
from paho.mqtt.matcher import MQTTMatcher
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from rsnotify.transport.pahoprivate import _TopicFilters
from rsnotify.transport.pahoprivate import cap_inflight as _cap_inflight
from rsnotify.transport.pahoprivate import lighten as _lighten


def new_client() -> mqtt.Client:
    return mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)


def connack(receive_maximum: int | None) -> Properties:
    props = Properties(PacketTypes.CONNACK)
    if receive_maximum is not None:
        props.ReceiveMaximum = receive_maximum
    return props


def test_the_in_flight_limit_paho_honours_is_the_attribute_rsnotify_writes() -> None:
    client = new_client()
    assert isinstance(client._max_inflight_messages, int)
    client.max_inflight_messages_set(50)
    assert client._max_inflight_messages == 50  # the public setter stores it there
    # paho's publish and ack paths read the attribute itself, not the property.
    for method in (mqtt.Client.publish, mqtt.Client._update_inflight):
        assert "self._max_inflight_messages" in inspect.getsource(method), method


def test_receive_maximum_lowers_the_limit_and_nothing_else_touches_it() -> None:
    client = new_client()
    client.max_inflight_messages_set(50)
    assert _cap_inflight(client, 50, connack(4)) == 4
    assert client.max_inflight_messages == 4
    for props in (connack(None), connack(500), None):  # none, or above the window: no change
        client = new_client()
        client.max_inflight_messages_set(50)
        assert _cap_inflight(client, 50, props) == 50
        assert client.max_inflight_messages == 50


def test_pahos_queue_of_unacknowledged_messages_is_still_where_the_tests_look() -> None:
    client = new_client()
    assert len(client._out_messages) == 0
    client.max_queued_messages_set(10)
    client.publish("t", b"x", qos=1)  # queued while not connected
    assert len(client._out_messages) == 1


def test_paho_looks_every_message_up_in_the_table_rsnotify_swaps() -> None:
    client = new_client()
    assert type(client._on_message_filtered) is MQTTMatcher
    source = inspect.getsource(mqtt.Client._handle_on_message)
    assert "self._on_message_filtered.iter_match" in source
    _lighten(client)
    assert type(client._on_message_filtered) is _TopicFilters


def test_the_swapped_table_matches_as_pahos_own_does() -> None:
    topics = ["rs/a/changes", "rs/a/head", "rs/b/changes", "$SYS/x", "rs", "rs/a/changes/x"]
    filters = ["rs/+/changes", "rs/#", "$SYS/#", "+/a/#", "rs/a/head"]
    ours, pahos = _TopicFilters(), MQTTMatcher()
    assert [list(ours.iter_match(t)) for t in topics] == [[] for _ in topics]
    for f in filters:
        ours[f] = pahos[f] = f
        assert [sorted(ours.iter_match(t)) for t in topics] == [
            sorted(pahos.iter_match(t)) for t in topics
        ]
    for f in filters:
        del ours[f]
        del pahos[f]
        assert [sorted(ours.iter_match(t)) for t in topics] == [
            sorted(pahos.iter_match(t)) for t in topics
        ]
    assert not ours._root._children  # emptied: back to the short way
