"""The command-line options that fill an :class:`~rsnotify.httppolicy.HttpPolicy`.

``rsnotify publish``, ``subscribe`` and ``inspect`` read Sources over the same
HTTP client, so they share one option group, :data:`HTTP`, whose values
:func:`policy_from_args` reads back.  Like every option, each is also
settable from the TOML file or ``RSNOTIFY_<COMMAND>_<OPTION>`` (a bearer token
is better kept out of the process list: ``RSNOTIFY_SUBSCRIBE_HEADER='Authorization:
Bearer ...'``), and ``config show`` redacts ``header`` values.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from .httppolicy import (
    DEFAULT_DEADLINE,
    DEFAULT_MAX_RETRY_AFTER,
    HttpPolicy,
    parse_header,
)
from .options import Group, option, repeated

__all__ = ["HTTP", "policy_from_args"]


def _header(text: str) -> tuple[str, str]:
    try:
        return parse_header(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(kind: type[float] | type[int], *, zero: bool) -> Callable[[str], float | int]:
    def convert(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value < 0 or (value == 0 and not zero) or value != value:
            bound = ">= 0" if zero else "> 0"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text!r}")
        return value

    convert.__name__ = kind.__name__
    return convert


# Not fields of the config object themselves: policy_from_args() makes its ``http``.
HTTP = Group(
    "HTTP (credentials go to the Source's own origin only, never to mirrors or "
    "across a redirect to another origin)",
    repeated(
        "--header",
        type=_header,
        metavar="'NAME: VALUE'",
        help="send this header to the Source's origin (repeatable), e.g. "
        "'Authorization: Bearer TOKEN'",
        secret=True,  # carries credentials (a bearer token)
        field=None,
    ),
    option(
        "--netrc",
        nargs="?",
        const="",
        metavar="FILE",
        help="Basic credentials for the Source's host from FILE (default $NETRC or ~/.netrc)",
        field=None,
    ),
    option(
        "--ca",
        metavar="FILE",
        help="also trust this CA certificate (PEM) for https:// Sources and mirrors",
        field=None,
    ),
    option(
        "--contact",
        metavar="EMAIL|URL",
        help="add this address to the User-Agent, so the Source's operator can reach you",
        field=None,
    ),
    option(
        "--max-rate",
        type=_positive(float, zero=True),
        default=0.0,
        metavar="N",
        help="at most N requests per second to any one origin (default 0: no rate cap; "
        "429/503 Retry-After is always honoured)",
        field=None,
    ),
    option(
        "--max-connections",
        type=_positive(int, zero=False),
        metavar="N",
        help="at most N connections to any one origin (default 8; subscribe: --concurrency)",
        field=None,
    ),
    option(
        "--fetch-deadline",
        type=_positive(float, zero=False),
        default=DEFAULT_DEADLINE,
        metavar="SECONDS",
        help="give up a fetch whose headers and body take longer, plus 1 s per 100 kB "
        f"received (default {DEFAULT_DEADLINE:g})",
        field=None,
    ),
    option(
        "--max-retry-after",
        type=_positive(float, zero=True),
        default=DEFAULT_MAX_RETRY_AFTER,
        metavar="SECONDS",
        help="wait out a 429/503 Retry-After up to this long within one fetch "
        f"(default {DEFAULT_MAX_RETRY_AFTER:g}); longer: the fetch fails and is retried later",
        field=None,
    ),
)


def policy_from_args(args: argparse.Namespace) -> HttpPolicy:
    """The policy the options ask for; ValueError (one line) for a file that cannot be used.

    Credentials are not yet scoped: the service scopes them to its Source's
    origin (:meth:`HttpPolicy.with_credential_origins`).
    """
    policy = HttpPolicy(
        headers=tuple(args.header or ()),
        netrc_file=args.netrc,
        ca_file=args.ca,
        contact=args.contact,
        max_rate=args.max_rate,
        max_connections=args.max_connections,
        deadline=args.fetch_deadline,
        max_retry_after=args.max_retry_after,
    )
    policy.check()
    return policy
