"""rsnotify: push notifications for ResourceSync (ANSI/NISO Z39.99).

The package is split into a pure core (document model, streaming parser and
serializer, change tracking, gap logic) and thin adapters for HTTP, MQTT,
WebSocket, Redis and the filesystem.
"""

__version__ = "0.1.0"
