"""Push transports: each one tails the notification log with a cursor of its own.

A transport never invents or reorders sequence numbers: it reads what the
publisher logged, renders it with :func:`rsnotify.outbound.render` and sends
it, advancing its named log cursor only once the far side has acknowledged.
A broker outage therefore only delays pushes; after a crash or a reconnect
the transport resends from its cursor, so Destinations may see a sequence
number twice (they deduplicate) but never miss one.

* :mod:`.mqtt` -- MQTT 5 (3.1.1 fallback) through paho-mqtt, QoS 1, in order:
  the pusher, driving :mod:`.mqttwindow` (its pure delivery window) and
  :mod:`.mqttmessage` (what each PUBLISH carries).
* :mod:`.mqttlink` -- the paho bridge every MQTT client shares (connection
  loop, fallback, backoff, state, subscribe and publish, the thread hop of
  :mod:`.handoff`); :mod:`.mqttproblems` -- its one-line errors.
* :mod:`.mqttsig` -- the signature trailer of MQTT 3.1.1 payloads.
* :mod:`.topics` -- broker-safe topic names.
* :mod:`.mqtturl` -- parsing ``mqtt://`` / ``mqtts://`` broker URLs.
"""

from __future__ import annotations

from ..errors import InvalidBrokerURL, TransportError

__all__ = ["InvalidBrokerURL", "TransportError"]
