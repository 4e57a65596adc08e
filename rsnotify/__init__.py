"""rsnotify: push notifications for ResourceSync (ANSI/NISO Z39.99).

The package is split into a pure core (document model, streaming parser and
serializer, change tracking, gap logic) and thin adapters for HTTP, MQTT,
WebSocket, Redis and the filesystem; ``docs/architecture.md`` maps them.

The names below are what a program embedding rsnotify uses; everything else is
reached through its module and may change between versions:

* a Destination: :class:`Subscriber` with its :class:`SubscriberConfig`, and
  :class:`Hooks` run per created, updated, deleted or failed change
  (:class:`Outcome` says what became of it);
* a Source: :class:`Publisher` with its :class:`PublisherConfig`;
* ResourceSync documents: :mod:`sitemap` (``parse``, ``iter_entries``,
  ``serialize``, :class:`DocumentReader`) and the model's :class:`Document`,
  :class:`Entry`, :class:`Link`, :class:`Capability`, :class:`ChangeType`;
* notifications: :mod:`envelope` (``decode``, ``verify``, ``encode``,
  ``sign``), :class:`Notification`, :class:`ChangeNotification`;
* errors: the roots of :mod:`rsnotify.errors`' tree.

Importing ``rsnotify`` imports none of them (PEP 562): the publisher and the
subscriber pull in aiohttp, paho-mqtt, redis and websockets, which a program
that only reads documents should not pay for.  No import changes global state
(signal handlers, ``atexit``, logging, threads).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> the module that defines it (a module name maps to itself).
_EXPORTS = {
    "Subscriber": "rsnotify.subscriber.service",
    "SubscriberConfig": "rsnotify.subscriber.service",
    "Hooks": "rsnotify.subscriber.hooks",
    "Outcome": "rsnotify.subscriber.rules",
    "Publisher": "rsnotify.publisher.service",
    "PublisherConfig": "rsnotify.publisher.service",
    "sitemap": "rsnotify.sitemap",
    "DocumentReader": "rsnotify.sitemap",
    "Lenient": "rsnotify.sitemap",
    "Limits": "rsnotify.sitemap",
    "Capability": "rsnotify.model",
    "ChangeType": "rsnotify.model",
    "Document": "rsnotify.model",
    "Entry": "rsnotify.model",
    "Link": "rsnotify.model",
    "envelope": "rsnotify.envelope",
    "ChangeNotification": "rsnotify.envelope",
    "Notification": "rsnotify.envelope",
    "RsNotifyError": "rsnotify.errors",
    "RemoteInputError": "rsnotify.errors",
    "LocalError": "rsnotify.errors",
    "Unavailable": "rsnotify.errors",
    "DocumentError": "rsnotify.errors",
    "InvalidNotification": "rsnotify.errors",
    "SignatureError": "rsnotify.errors",
}

__all__ = [  # the keys of _EXPORTS, spelled out for type checkers and linters
    "Capability",
    "ChangeNotification",
    "ChangeType",
    "Document",
    "DocumentError",
    "DocumentReader",
    "Entry",
    "Hooks",
    "InvalidNotification",
    "Lenient",
    "Limits",
    "Link",
    "LocalError",
    "Notification",
    "Outcome",
    "Publisher",
    "PublisherConfig",
    "RemoteInputError",
    "RsNotifyError",
    "SignatureError",
    "Subscriber",
    "SubscriberConfig",
    "Unavailable",
    "__version__",
    "envelope",
    "sitemap",
]

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ imports
    from . import envelope, sitemap
    from .envelope import ChangeNotification, Notification
    from .errors import (
        DocumentError,
        InvalidNotification,
        LocalError,
        RemoteInputError,
        RsNotifyError,
        SignatureError,
        Unavailable,
    )
    from .model import Capability, ChangeType, Document, Entry, Link
    from .publisher.service import Publisher, PublisherConfig
    from .sitemap import DocumentReader, Lenient, Limits
    from .subscriber.hooks import Hooks
    from .subscriber.rules import Outcome
    from .subscriber.service import Subscriber, SubscriberConfig


def __getattr__(name: str) -> Any:  # Any: each name has its own type (see TYPE_CHECKING)
    """Import an exported name's module on first use (PEP 562)."""
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'rsnotify' has no attribute {name!r}")
    module = importlib.import_module(module_name)
    value = module if module_name == f"rsnotify.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
