"""What to do with one change, given what the mirror holds: the applier's rules (pure).

Everything here decides; nothing fetches, writes or waits.  The applier
(:mod:`.applier`) reads a change once into a :class:`ChangeView`, asks the
resource store for the state of its ``loc``, and follows these rules:

* :func:`already_applied`: nothing to do (the same change again, or an older
  one, when the state is trusted);
* :func:`to_recheck`: the change time cannot decide, so the Source is asked
  (a state nobody vouched for, a change that would make the resource exist or
  vanish against a newer state, a change from a list out of order);
* :func:`classify`: what a failed fetch means, and whether to retry.

The outcomes (:class:`Outcome`) are what the apply log records.
"""

from __future__ import annotations

import datetime as dt  # for classes with a field named datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from ..errors import AlreadyHeld, FetchError, InvalidChange
from ..fetch import OriginNotAllowed, ResponseTooLarge
from ..model import ChangeType, Entry, parse_hashes
from .mirror import FixityMismatch, PathConflict, UnsafePath
from .resources import ResourceState
from .trust import beyond_skew

# Any (strict module): read_change takes any object with loc/change/datetime
# attributes (model.Entry, envelope.Notification) and checks each at run time.

__all__ = [
    "DONE_OUTCOMES",
    "AlreadyHeld",
    "ChangeView",
    "Failure",
    "InvalidChange",
    "Outcome",
    "Record",
    "already_applied",
    "classify",
    "read_change",
    "read_changes",
    "to_recheck",
]

RETRYABLE_STATUS = frozenset({408, 425, 429})
GONE_STATUS = frozenset({404, 410})
OUTDATED_DELETE = "the Source still serves it: a newer change than this deletion was applied"
OUTDATED_BYTES = "the Source serves what the mirror already holds from a newer change"
NOT_SERVED = "the Source does not serve this older change now"
SAME_BYTES = "older, and the mirror already holds its bytes"


class Outcome(StrEnum):
    """What became of one change; the value is what the apply log records."""

    APPLIED = "applied"  # created/updated: fetched, verified, written
    DELETED = "deleted"  # deleted: file removed (or already absent)
    RECORDED = "recorded"  # metadata_only: state recorded, nothing fetched
    SKIPPED_ALREADY_APPLIED = "skipped_already_applied"
    CONFIRMED = "confirmed"  # the Change List lists the change a provisional state holds
    OUTDATED = "outdated"  # older than what the mirror holds, and the Source agrees with that
    HELD = "held"  # a baseline's resource the mirror already held, byte for byte
    SUPERSEDED = "superseded"  # failed, but a newer change of the loc is queued
    REFUSED_ORIGIN = "refused_origin"
    UNSAFE_PATH = "unsafe_path"
    PATH_CONFLICT = "path_conflict"
    HASH_MISMATCH = "hash_mismatch"
    LENGTH_MISMATCH = "length_mismatch"
    NOT_FOUND = "not_found"
    FETCH_FAILED = "fetch_failed"
    UNCONFIRMED = "unconfirmed"  # an unsigned deletion the Source does not confirm

    @property
    def done(self) -> bool:
        """True when nothing is left to do for this change (a cursor may pass it)."""
        return self in DONE_OUTCOMES


DONE_OUTCOMES = frozenset(
    {
        Outcome.APPLIED,
        Outcome.DELETED,
        Outcome.RECORDED,
        Outcome.SKIPPED_ALREADY_APPLIED,
        Outcome.CONFIRMED,
        Outcome.OUTDATED,
        Outcome.HELD,
        Outcome.SUPERSEDED,
    }
)
# What a back-dated change's fetch says when the Source has moved past it.
NOT_CURRENT = frozenset({Outcome.NOT_FOUND, Outcome.HASH_MISMATCH, Outcome.LENGTH_MISMATCH})


@dataclass(frozen=True, slots=True)
class ChangeView:
    """The fields the applier needs, read once from whatever object was given."""

    loc: str
    change: ChangeType
    datetime: dt.datetime
    seq: int | None
    hashes: dict[str, str]
    length: int | None
    duplicates: tuple[str, ...]
    # False: nobody vouched for this change (pushed unsigned, or dated beyond
    # the allowed skew); its state is provisional and a deletion is checked.
    confirmed: bool = True
    collection: str | None = None  # recorded with the state: what a re-baseline compares
    # A baseline's change: the mirror may already hold these bytes (a re-baseline
    # after a coverage hole), so compare the file with the advertised digests first.
    reuse: bool = False
    # Read from a Change List out of forward chronological order (section 12.1):
    # its change time proves nothing about order, so the Source is asked instead.
    unordered: bool = False

    @property
    def identity(self) -> tuple[str, dt.datetime, ChangeType]:
        return (self.loc, self.datetime, self.change)


def _slot_setter(name: str) -> Callable[[ChangeView, Any], None]:
    setter: Callable[[ChangeView, Any], None] = ChangeView.__dict__[name].__set__
    return setter


(
    _set_loc, _set_change, _set_datetime, _set_seq, _set_hashes, _set_length, _set_duplicates,
    _set_confirmed, _set_collection, _set_reuse, _set_unordered,
) = map(_slot_setter, (
    "loc", "change", "datetime", "seq", "hashes", "length", "duplicates",
    "confirmed", "collection", "reuse", "unordered",
))  # fmt: skip
_new = object.__new__


def _view(
    loc: str,
    change: ChangeType,
    when: dt.datetime,
    seq: int | None,
    hashes: dict[str, str],
    length: int | None,
    duplicates: tuple[str, ...],
    confirmed: bool,
    collection: str | None,
    reuse: bool,
    unordered: bool,
) -> ChangeView:
    """``ChangeView(...)``, every field given, made through the slots themselves.

    A frozen dataclass's ``__init__`` sets each field with
    ``object.__setattr__``: 2.8 us for these eleven against 0.9 us through
    the slots' own descriptors, and a view is made for every change a
    Destination reads (50,000 in a catch-up; read on the event loop).  The
    view is as frozen as any other afterwards.  ``test_rules_read`` holds
    this to ``ChangeView(...)`` field by field.
    """
    view = _new(ChangeView)
    _set_loc(view, loc)
    _set_change(view, change)
    _set_datetime(view, when)
    _set_seq(view, seq)
    _set_hashes(view, hashes)
    _set_length(view, length)
    _set_duplicates(view, duplicates)
    _set_confirmed(view, confirmed)
    _set_collection(view, collection)
    _set_reuse(view, reuse)
    _set_unordered(view, unordered)
    return view


def read_change(
    obj: Any,
    *,
    confirmed: bool = True,
    max_skew: float | None = None,
    collection: str | None = None,
    reuse: bool = False,
    unordered: bool = False,
    now: datetime | None = None,
) -> ChangeView:
    """The fields of ``obj`` the applier uses, checked (:class:`InvalidChange` otherwise).

    ``now``: the clock for the skew check, read once by a caller reading a batch.
    """
    if type(obj) is Entry and not obj.links:
        # A Change List entry, as a walk reads tens of thousands: the same
        # checks and view by the short way (no lookups by name, no links).
        horizon = None if max_skew is None else _horizon(now, max_skew)
        return _read_entry(obj, confirmed, horizon, collection, reuse, unordered)
    loc = getattr(obj, "loc", None)
    if not isinstance(loc, str) or not loc:
        raise InvalidChange(f"change without a loc: {obj!r:.200}")
    kind = getattr(obj, "change", None)
    if type(kind) is not ChangeType:  # a member as it is: Enum's call is slow
        try:
            # Whatever the object holds: a value that is no change type is the ValueError.
            kind = ChangeType(kind)  # type: ignore[arg-type]
        except ValueError:
            raise InvalidChange(f"{loc}: change is not created, updated or deleted") from None
    when = getattr(obj, "change_time", None)  # model.Entry: rs:md datetime, else lastmod
    if when is None:
        when = getattr(obj, "datetime", None)
    if not isinstance(when, datetime) or when.tzinfo is None:
        raise InvalidChange(f"{loc}: change without an aware datetime")
    seq = getattr(obj, "seq", None)
    length = getattr(obj, "length", None)
    if length is not None and (not isinstance(length, int) or length < 0):
        raise InvalidChange(f"{loc}: invalid length {length!r}")
    duplicates: list[tuple[int, str]] = []
    for link in getattr(obj, "links", None) or ():
        if isinstance(link, Mapping):
            rel, href, pri = link.get("rel"), link.get("href"), link.get("pri")
        else:
            rel, href, pri = (getattr(link, n, None) for n in ("rel", "href", "pri"))
        if rel == "duplicate" and isinstance(href, str) and href:
            duplicates.append((pri if isinstance(pri, int) else 999_999, href))
    duplicates.sort(key=lambda item: item[0])  # stable: document order among equals
    if max_skew is not None and beyond_skew(
        when, datetime.now(UTC) if now is None else now, max_skew
    ):
        confirmed = False
    return _view(
        loc,
        kind,
        when,
        seq if isinstance(seq, int) else None,
        parse_hashes(getattr(obj, "hash", None)),
        length,
        tuple(href for _, href in duplicates),
        confirmed,
        collection,
        reuse,
        unordered,
    )


def read_changes(
    changes: list[Any],
    *,
    max_skew: float,
    now: datetime,
    collection: str | None = None,
    unordered: bool = False,
) -> list[ChangeView]:
    """:func:`read_change` of each of ``changes`` (confirmed: read from the Source).

    For a walk's batch: one clock (``now``) and so one skew bound for all of
    them (computed per entry, it was a sixth of reading one).
    """
    horizon = _horizon(now, max_skew)
    return [
        _read_entry(change, True, horizon, collection, False, unordered)
        if type(change) is Entry and not change.links
        else read_change(
            change, max_skew=max_skew, collection=collection, unordered=unordered, now=now
        )
        for change in changes
    ]


def _horizon(now: datetime | None, max_skew: float) -> datetime:
    """The latest change time :func:`~.trust.beyond_skew` lets through at ``now``."""
    return (datetime.now(UTC) if now is None else now) + timedelta(seconds=max_skew)


def _read_entry(
    entry: Entry,
    confirmed: bool,
    horizon: datetime | None,
    collection: str | None,
    reuse: bool,
    unordered: bool,
) -> ChangeView:
    """:func:`read_change` of a :class:`~rsnotify.model.Entry` without links.

    ``horizon``: :func:`_horizon` (None: no skew check); beyond it the change is
    unconfirmed (``when - now > max_skew`` is ``when > now + max_skew``, exactly).
    """
    loc = entry.loc
    if not isinstance(loc, str) or not loc:
        raise InvalidChange(f"change without a loc: {entry!r:.200}")
    kind = entry.change
    if type(kind) is not ChangeType:
        try:
            kind = ChangeType(kind)  # type: ignore[arg-type]
        except ValueError:
            raise InvalidChange(f"{loc}: change is not created, updated or deleted") from None
    when = entry.datetime if entry.datetime is not None else entry.lastmod
    if not isinstance(when, datetime) or when.tzinfo is None:
        raise InvalidChange(f"{loc}: change without an aware datetime")
    length = entry.length
    if length is not None and (not isinstance(length, int) or length < 0):
        raise InvalidChange(f"{loc}: invalid length {length!r}")
    if horizon is not None and when > horizon:  # beyond_skew
        confirmed = False
    return _view(
        loc, kind, when, None, parse_hashes(entry.hash), length, (), confirmed, collection,
        reuse, unordered,
    )  # fmt: skip


def provisional(state: ResourceState, max_skew: float, now: datetime | None = None) -> bool:
    """A state whose datetime nobody vouched for (see :mod:`.trust`).

    ``now``: the clock for the skew check, read once by a caller deciding a batch.
    """
    return not state.confirmed or beyond_skew(
        state.datetime, datetime.now(UTC) if now is None else now, max_skew
    )


def same_change(state: ResourceState, change: ChangeView) -> bool:
    return state.datetime == change.datetime and state.change == change.change


def flips(state: ResourceState, change: ChangeView) -> bool:
    """``change`` would make the resource exist where it does not, or vanish where it does."""
    return (state.change is ChangeType.DELETED) != (change.change is ChangeType.DELETED)


def doubtful(state: ResourceState, change: ChangeView) -> bool:
    """An older change the Source should be asked about (see :func:`to_recheck`)."""
    if flips(state, change):
        return True
    if not change.unordered or change.change is ChangeType.DELETED or not change.hashes:
        return False
    digest = change.hashes.get("sha-256")
    return digest is None or state.sha256 is None or digest != state.sha256


def already_applied(
    state: ResourceState | None,
    change: ChangeView,
    max_skew: float,
    *,
    recheck: bool = False,
    now: datetime | None = None,
) -> bool:
    """Nothing to do for ``change`` given ``state`` (``recheck``: see :func:`to_recheck`).

    ``now``: as for :func:`provisional`.
    """
    if state is None:
        return False
    if provisional(state, max_skew, now):
        # Its datetime may be forged: only the very same change counts as done.
        return same_change(state, change)
    if state.datetime < change.datetime:
        return False
    if state.datetime > change.datetime:
        return not (recheck and doubtful(state, change))
    if state.seq is not None and change.seq is not None:
        return state.seq >= change.seq
    return state.change == change.change


def to_recheck(state: ResourceState | None, change: ChangeView, max_skew: float) -> str | None:
    """Why ``change``, older than what the mirror holds, must be checked at the Source.

    Two cases where a change time cannot be believed (Z39.99 section 12.1
    makes it the order of changes, but Sources get it wrong and forgers lie):

    * ``provisional``: the state came from a notification nobody vouched for
      (rsnotify.subscriber.trust); it may be forged, so an older change is not
      "already applied" but asked about.
    * ``back-dated``: the change would make the resource exist or vanish
      although the mirror holds a newer state.  resync 2.0.1 dates a deletion
      with the deleted file's old modification time, earlier than the
      baseline that still listed the file, and a file copied with its old
      time (``cp -p``) is a creation dated in the past; skipping either as
      "old" would keep the mirror wrong for ever.  The Source says whether
      the resource exists now (gone, or serving exactly the change's bytes);
      otherwise the change is outdated.  The state keeps the newer time.

    An older update of a resource that exists either way is skipped without
    a request, as before: which *bytes* are newer is what change times order
    (section 12.1), and a Source (or a cache in front of it) serving an old
    copy must not roll the mirror back.  Unless the change was read from a
    list out of order (``unordered``): its time orders nothing, so an older
    creation or update advertising other bytes than the mirror holds is
    applied if the Source serves exactly those bytes now (a ``cp -p`` copy
    dated by its old mtime), and a deletion, older or newer, only once the
    Source answers 404/410.
    """
    if state is None or same_change(state, change):
        return None
    if provisional(state, max_skew):
        return "provisional" if change.datetime <= state.datetime else None
    if change.datetime < state.datetime and doubtful(state, change):
        return "back-dated"
    return None


@dataclass(frozen=True, slots=True)
class Record:
    """The time to record a change's state at, and the apply log's detail."""

    when: datetime
    detail: str | None = None
    # None: as trusted as the change itself; False: provisional whatever the change
    # (an older change re-checked against a state nobody vouched for).
    confirmed: bool | None = None


@dataclass(slots=True)
class Failure:
    outcome: Outcome
    retryable: bool
    detail: str


def path_failure(exc: UnsafePath | PathConflict) -> Failure:
    outcome = Outcome.PATH_CONFLICT if isinstance(exc, PathConflict) else Outcome.UNSAFE_PATH
    return Failure(outcome, False, str(exc))


def classify(exc: FetchError | FixityMismatch, view: ChangeView) -> Failure:
    """What a failed fetch means: its outcome, and whether trying again can help."""
    detail = str(exc)
    if isinstance(exc, FixityMismatch):
        outcome = Outcome.LENGTH_MISMATCH if exc.length_mismatch else Outcome.HASH_MISMATCH
        return Failure(outcome, True, detail)
    if isinstance(exc, OriginNotAllowed):  # a redirect off the allowed origins
        return Failure(Outcome.REFUSED_ORIGIN, False, detail)
    if isinstance(exc, ResponseTooLarge):
        if view.length is not None:
            return Failure(Outcome.LENGTH_MISMATCH, True, detail)
        return Failure(Outcome.FETCH_FAILED, False, detail)
    status = exc.status
    if status in GONE_STATUS:
        return Failure(Outcome.NOT_FOUND, True, detail)
    retryable = status is None or status >= 500 or status in RETRYABLE_STATUS
    return Failure(Outcome.FETCH_FAILED, retryable, detail)
