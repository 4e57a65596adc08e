"""Every exception rsnotify raises on bad input.

Callers that read untrusted documents catch :class:`RsNotifyError` (or one of
its families) and nothing else: any other exception escaping the parser is a
bug.  Each class names one problem, so tests and operators can tell a hostile
document from a merely sloppy one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class RsNotifyError(Exception):
    """Base of every documented rsnotify error."""


class DocumentError(RsNotifyError):
    """A ResourceSync document was refused.

    ``line`` and ``element`` locate the problem when it is known, so the
    message can point an operator at the offending place in a 50 MB file.
    ``rule`` names what the refusal enforces (``"Z39.99 section 12.1"``, ``"XML
    1.0"``, an rsnotify safety limit), so an operator can tell a Source that
    breaks the specification from one rsnotify reads too strictly.
    """

    def __init__(
        self,
        message: str,
        *,
        line: int | None = None,
        element: str | None = None,
        rule: str | None = None,
    ):
        self.reason = message
        self.line = line
        self.element = element
        self.rule = rule
        where = []
        if line is not None:
            where.append(f"line {line}")
        if element:
            where.append(f"<{element}>")
        text = f"{message} ({', '.join(where)})" if where else message
        super().__init__(f"{text} [{rule}]" if rule else text)


# --- hostile or oversized input: refused before it can cost anything --------


class UnsafeDocument(DocumentError):
    """The document tried something a ResourceSync document never needs."""


class ForbiddenDTD(UnsafeDocument):
    """A DOCTYPE (and so possibly entities: XXE, billion laughs) was present."""


class DocumentTooLarge(UnsafeDocument):
    """The document exceeded the configured byte limit (50 MB by default)."""


class DocumentTooDeep(UnsafeDocument):
    """Element nesting exceeded the parser's depth bound."""


class TooManyEntries(UnsafeDocument):
    """More entries than the configured limit (50,000 by default, the Sitemap limit)."""


# --- malformed XML and documents that break the specification ---------------


class MalformedXML(DocumentError):
    """Not well-formed XML: truncated, binary garbage, undefined entities."""


class InvalidDocument(DocumentError):
    """Well-formed XML that is not a valid ResourceSync document."""


class WrongNamespace(InvalidDocument):
    """Sitemap or ResourceSync elements in the wrong namespace."""


class MissingElement(InvalidDocument):
    """A mandatory element or attribute is absent (``<loc>``, ``rs:md``, ``change``...)."""


class InvalidValue(InvalidDocument):
    """An element or attribute has a value the specification does not allow."""


class InvalidDatetime(InvalidValue):
    """A value is not a W3C Datetime."""


class OutOfOrder(InvalidDocument):
    """Entries are not in forward chronological order."""


# --- fetching ----------------------------------------------------------------


class FetchError(RsNotifyError):
    """A document could not be fetched (unreachable server, HTTP error)."""

    def __init__(self, url: str, message: str, *, status: int | None = None):
        self.url = url
        self.status = status
        super().__init__(f"{url}: {message}")


class DiscoveryError(RsNotifyError):
    """No ResourceSync entry point could be found from the given location."""


# --- the process's own set-up ------------------------------------------------


class CannotListen(RsNotifyError):
    """A server socket could not be bound (port in use, address not on this host...)."""


@contextlib.contextmanager
def listening(what: str, host: str, port: int) -> Iterator[None]:
    """Turn a bind failure of ``what`` into a one-line :class:`CannotListen`.

    A busy port is an operator's mistake, not a bug: it must read as
    "cannot listen on 127.0.0.1:8765 for WebSocket clients: Address already in
    use", not as a traceback.
    """
    try:
        yield
    except OverflowError as exc:  # asyncio's message for a port > 65535
        raise CannotListen(f"cannot listen on {host}:{port} for {what}: {exc}") from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise CannotListen(f"cannot listen on {host}:{port} for {what}: {reason}") from None
