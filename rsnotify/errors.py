"""Every exception rsnotify raises, in one documented tree.

Callers catch :class:`RsNotifyError` (or one of its branches) and nothing
else: any other exception escaping rsnotify is a bug.  Each class names one
problem, so tests and operators can tell a hostile document from a merely
sloppy one.  Under the root, three branches say *whose* problem it is and so
what a caller does about it::

    RsNotifyError
    ├── RemoteInputError     bad input from a remote: a Source, a publisher, a
    │   │                    hub or a client sent something refused.  Retrying
    │   │                    the same input cannot help; report it to its owner.
    │   ├── DocumentError    (UnsafeDocument, MalformedXML, InvalidDocument, ...)
    │   ├── InvalidNotification, SignatureError
    │   ├── InvalidChange, CoverageHole, UnusableDump, DiscoveryError
    │   └── InvalidSubscription, RequestError
    ├── LocalError           a fault on this side: configuration or usage
    │   │                    (options, URLs, ports, a second process on the
    │   │                    same state) or the local filesystem.  An operator
    │   │                    fixes it; retrying unchanged cannot help.
    │   ├── ConfigError, ValueRefused, CannotListen, ReportError, SimulatorError
    │   ├── TransportError   (InvalidBrokerURL, InvalidTopic), TrailerUnsupported
    │   ├── AlreadyRunning, LogConflict, Fenced
    │   └── ResourceStoreError, SpareUnusable, MirrorError (rsnotify.subscriber.mirror)
    └── Unavailable          transient: a server, broker, Redis or local store
        │                    cannot be reached or used right now.  Retry with
        │                    backoff (rsnotify.backoff).
        ├── FetchError       (DeadlineExceeded; a 4xx ``.status`` is the Source's answer)
        └── LogUnavailable, StoreUnavailable, CursorStoreUnavailable

A few classes sit in two branches because a component family raises them for
a remote's fault: ``FixityMismatch`` and ``UnsafePath`` are mirror errors
(local family) caused by what a Source served; ``ResponseTooLarge``,
``OriginNotAllowed`` and ``UnwantedEncoding`` are fetch errors (unavailable)
caused by what a server answered; ``InvalidSubscription`` and ``RequestError``
are transport errors refusing a client's request.  A
handler that sorts by branch therefore tests :class:`RemoteInputError` first.
Two classes sit under the root alone: ``LogError``, a family whose members
each name their branch (``LogUnavailable``, ``LogConflict``, ``Fenced``), and
``AlreadyHeld``, a signal inside the subscriber that is no error at all.

Every class is defined here, except the mirror's family
(:class:`rsnotify.subscriber.mirror.MirrorError` and its subclasses,
:mod:`rsnotify.subscriber.ownership`), which subclasses the branches in
place.  The modules that raise a class also re-export it under its old name
(``rsnotify.fetch.ResponseTooLarge`` is ``rsnotify.errors.ResponseTooLarge``).
``tests/test_errors_tree.py`` checks that every exception class defined in
rsnotify is in this tree.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the type only: config imports this module
    from .configfile import Problem


class RsNotifyError(Exception):
    """Base of every documented rsnotify error."""


# --- the three branches --------------------------------------------------------


class RemoteInputError(RsNotifyError):
    """Something a remote sent was refused: a document, a notification, bytes, a request."""


class LocalError(RsNotifyError):
    """A fault on this side: configuration, usage, or the local filesystem."""


class Unavailable(RsNotifyError):
    """A remote or local service cannot be reached or used right now; retry with backoff."""


# --- documents -------------------------------------------------------------------


class DocumentError(RemoteInputError):
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


class FetchError(Unavailable):
    """A document could not be fetched (unreachable server, HTTP error)."""

    def __init__(self, url: str, message: str, *, status: int | None = None):
        self.url = url
        self.status = status
        super().__init__(f"{url}: {message}")


class ResponseTooLarge(FetchError, DocumentTooLarge):
    """The response body exceeded ``max_bytes``; the rest was never read."""

    def __init__(self, url: str, limit: int, *, declared: int | None = None):
        self.limit = limit
        self.declared = declared
        if declared is not None:
            message = f"Content-Length {declared} exceeds the limit of {limit} bytes"
        else:
            message = f"response body exceeds the limit of {limit} bytes"
        # MRO: FetchError.__init__ -> DocumentError.__init__ -> Exception, so both
        # families' attributes (url/status and reason/line/element) are set.
        super().__init__(url, message)


class DeadlineExceeded(FetchError):
    """Headers and body together took longer than the fetch deadline.

    The deadline grows by one second per
    :data:`rsnotify.fetch.DEADLINE_CREDIT_RATE` bytes received, so only a
    transfer slower than that on average is cut.
    """

    def __init__(self, url: str, deadline: float, received: int):
        self.deadline = deadline
        self.received = received
        super().__init__(
            url,
            f"timed out: not complete within the fetch deadline of {deadline:g}s "
            f"({received} bytes received)",
        )


class UnwantedEncoding(FetchError, RemoteInputError):
    """The server encoded a body we asked for as ``identity``; refused before decoding it."""

    def __init__(self, url: str, encoding: str):
        self.encoding = encoding
        super().__init__(
            url,
            f"Content-Encoding {encoding} although Accept-Encoding: identity was asked "
            "(a compressed body of unbounded size is not decoded)",
        )


class OriginNotAllowed(FetchError, RemoteInputError):
    """The URL's origin (scheme://host:port) is not in the allowed set."""

    def __init__(self, url: str, origin: str, allowed: Collection[str]):
        self.origin = origin
        self.allowed = frozenset(allowed)
        listed = ", ".join(sorted(self.allowed)) or "(none)"
        super().__init__(url, f"origin {origin} is not allowed (allowed: {listed})")


class DiscoveryError(RemoteInputError):
    """No ResourceSync entry point could be found from the given location."""


# --- notifications and the changes they carry ------------------------------------


class InvalidNotification(RemoteInputError):
    """A payload that is not a notification rsnotify can apply (garbage, oversized, forged)."""


class SignatureError(InvalidNotification):
    """A payload that is unsigned, or signed with an unknown key or a wrong digest."""


class InvalidChange(RemoteInputError):
    """An object handed to the applier lacks a usable loc, change or datetime."""


class AlreadyHeld(RsNotifyError):
    """The Source serves exactly the bytes the mirror holds (see ``unless_sha256``).

    A signal between :mod:`rsnotify.subscriber.transfer` and its caller, never
    seen outside them: nothing is wrong, so it is in no branch.
    """


class CoverageHole(RemoteInputError):
    """The Change Lists no longer cover every change since the checkpoint.

    Raised by :meth:`rsnotify.publisher.watcher.CollectionWatcher.poll` when
    the watcher stops at holes (a Destination: it must re-baseline); a
    publisher only reports them.
    """


class UnusableDump(RemoteInputError):
    """The Resource Dump cannot serve as a baseline (the Resource List is used instead)."""


# --- transports --------------------------------------------------------------------


class TransportError(LocalError):
    """A push transport was misconfigured or cannot do what it was asked."""


class InvalidBrokerURL(TransportError):
    """A broker URL that rsnotify cannot connect to (wrong scheme, bad port, stray path)."""


class InvalidTopic(TransportError):
    """A topic prefix (or name) that some broker would refuse."""


class TrailerUnsupported(LocalError, ValueError):
    """A payload or signature that cannot take a trailer (not JSON or XML, odd key id).

    Still a :class:`ValueError`, as it was before the tree: callers catch it so.
    """


class InvalidSubscription(TransportError, RemoteInputError):
    """A client asked for something the gateway will not serve; ``code`` goes in the error frame."""

    def __init__(self, code: str, message: str, *, collection: str | None = None) -> None:
        self.code = code
        self.message = message
        self.collection = collection
        super().__init__(f"{code}: {message}")


class RequestError(TransportError, RemoteInputError):
    """A subscription request the hub answers with ``400`` (the message says why)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


# --- the notification log and local stores -------------------------------------------


class LogError(RsNotifyError):
    """The log refused an operation (a family: each subclass names its branch)."""


class LogUnavailable(LogError, Unavailable):
    """The log's backend cannot be reached right now; retry with backoff."""


class LogConflict(LogError, LocalError):
    """The head moved since the appender read it (another writer)."""


class Fenced(LogError, LocalError):
    """The appender's fencing token is older than the current leader's."""


class LogDiverged(LogError, LocalError):
    """The log no longer holds what this publisher pushed, and it cannot be restored.

    Issue 19: after a failover a sequence number that was pushed would come
    to mean another entry (see :mod:`rsnotify.publisher.pushed`).
    """


class StoreUnavailable(Unavailable):
    """The local database could not be used (disk full, I/O error, locked)."""


class CursorStoreUnavailable(Unavailable):
    """Redis holding the cursors cannot be reached or refused a command."""


class ResourceStoreError(LocalError):
    """The resource store cannot be read or written (locked, disk full, corrupt)."""


class AlreadyRunning(LocalError):
    """Another subscriber holds the lock on this mirror's state."""


class SpareUnusable(LocalError, OSError):
    """This swap cannot be done here (another filesystem, project quota, no exchange).

    Raised by :meth:`rsnotify.spare.SparePool.install` with the slot handed
    back: the caller writes a fresh temp file beside the target instead.  Still
    an :class:`OSError` (``errno``, ``strerror``), as it was before the tree.
    """


# --- the process's own set-up ------------------------------------------------


class CannotListen(LocalError):
    """A server socket could not be bound (port in use, address not on this host...)."""


class ConfigError(LocalError):
    """A configuration file or ``RSNOTIFY_*`` variable was refused (one line per problem)."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class ValueRefused(LocalError):
    """A value failed conversion; the message says why, the caller adds where."""


class ReportError(LocalError):
    """A telemetry target that cannot be used (a bad URL)."""


class SimulatorError(LocalError):
    """A simulator option or control request was refused (bad value, conflicting flags)."""


class WindowError(LocalError, RuntimeError):
    """An MQTT delivery-window driver bug: it booked past the window, or out of order on a lane."""


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
