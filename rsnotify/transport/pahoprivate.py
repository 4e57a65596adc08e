"""The two places rsnotify writes paho-mqtt's private attributes, and why.

Everything else goes through paho's public API (:mod:`.mqttlink`).  Both are
held by ``tests/test_paho_contract.py``, which fails if paho renames what they
write, and pyproject.toml pins paho-mqtt below 3.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import paho.mqtt.client as mqtt
from paho.mqtt.matcher import MQTTMatcher
from paho.mqtt.properties import Properties

__all__ = ["cap_inflight", "lighten"]


def cap_inflight(client: mqtt.Client, window: int, props: Properties | None) -> int:
    """Lower paho's in-flight limit to the broker's Receive Maximum; the limit in force.

    MQTT 5 section 3.2.2.3.3: never more unacknowledged QoS 1 PUBLISHes than
    the broker's Receive Maximum (Mosquitto says 20; brokers that enforce it
    disconnect a client that sends more).  paho ignores it, and its public
    setter (``max_inflight_messages_set``, the ``max_inflight_messages``
    property) refuses any change once connected, for fear of a switch to or
    from 0 ("unlimited"), which this never is.  So the attribute behind that
    property is written directly, here in paho's thread at CONNACK, before
    the owner can publish anything on this connection.  This and
    :func:`lighten` are rsnotify's only writes to private paho attributes:
    ``tests/test_paho_contract.py`` fails if paho renames them, and
    pyproject.toml pins paho-mqtt below 3.
    MQTT 3.1.1 has no Receive Maximum: the window alone applies.
    """
    limit = getattr(props, "ReceiveMaximum", None) if props is not None else None
    if isinstance(limit, int) and 0 < limit < window:
        client._max_inflight_messages = limit
        return limit
    return window


class _TopicFilters(MQTTMatcher):
    """paho's table of per-topic-filter callbacks, minus a garbage cycle per message.

    paho looks every received message up in this table
    (``Client._handle_on_message``), and :meth:`MQTTMatcher.iter_match`
    builds a recursive closure each time, a reference cycle of ~8 objects
    that only the cyclic collector frees: at 200 notifications/s the
    subscriber's collector ran every ~5 s, for up to 37 ms of its loop
    (``gc.callbacks`` during ``bench.e2e``).  rsnotify adds no per-filter
    callback (``message_callback_add``), so the table is empty and the
    answer is known without the walk; a table with filters is walked as
    paho walks it.
    """

    def iter_match(self, topic: str) -> Iterator[Any]:
        root = self._root
        if not root._children and root._content is None:
            return iter(())
        # paho's matcher module carries no annotations.
        return cast(Iterator[Any], super().iter_match(topic))  # type: ignore[no-untyped-call]


def lighten(client: mqtt.Client) -> None:
    """Give ``client`` a :class:`_TopicFilters` for paho's own (empty) table.

    ``Client._on_message_filtered`` is private: ``tests/test_paho_contract.py``
    fails if paho renames it or stops asking it for every message; if it is
    gone, nothing is replaced and paho's own table works as before.
    """
    if type(getattr(client, "_on_message_filtered", None)) is MQTTMatcher:
        client._on_message_filtered = _TopicFilters()  # type: ignore[no-untyped-call]
