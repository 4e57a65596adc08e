"""Options several commands share, declared once (see :mod:`rsnotify.options`).

Each is spelled, checked and documented the same wherever it appears:
``--lenient``/``--strict`` (``inspect``, ``publish``, ``subscribe``), the log
and metrics options and the MQTT version.  The HTTP group is
:data:`rsnotify.httpoptions.HTTP`.
"""

from __future__ import annotations

import argparse
from typing import Any

from . import argtypes
from .options import Opt, flag, option
from .transport.topics import protocol_argument

__all__ = [
    "LOG",
    "METRICS_HOST",
    "MQTT_PROTOCOL",
    "lenient_options",
    "lenient_rules",
]

LOG = (
    option("--log-level", type=argtypes.log_level, default="info", field=None),
    option("--log-format", choices=("auto", "json", "text"), default="auto", field=None),
)
METRICS_HOST = option("--metrics-host", default="127.0.0.1")
MQTT_PROTOCOL = option(
    "--mqtt-protocol",
    type=protocol_argument,
    default="auto",
    help="MQTT version: auto (5, falling back to 3.1.1 when refused; default), 5 or 3.1.1",
)


# --- lenient reading of Sources (Z39.99 rules a reader may relax) ---------------------


def _lenient_text(text: str) -> str:
    """``--lenient`` values checked now (an unknown rule is a usage error), kept as text."""
    from .sitemap import Lenient, parse_lenient

    try:
        rules = parse_lenient(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return ",".join(rule.value for rule in Lenient if rule in rules) or "none"


def lenient_options(*, default: str = "none") -> tuple[Opt, Opt]:
    """``--lenient RULE[,RULE]`` (and ``--strict``): the specification rules a reader relaxes.

    One spelling for ``inspect``, ``publish`` and ``subscribe``; the rules are
    :class:`rsnotify.sitemap.Lenient` and end up in ``sitemap.Limits.lenient``
    through :func:`lenient_rules` (neither option is a field of its own).
    """
    from .sitemap import LENIENT_HELP

    rules = "; ".join(f"{rule.value}: {text}" for rule, text in LENIENT_HELP.items())
    return (
        option(
            "--lenient",
            metavar="RULE[,RULE]",
            type=_lenient_text,
            default=default,
            help=f"relax these rules of the specification, each reported once per document "
            f"({rules}; also all, none; default: {default})",
            field=None,
        ),
        flag(
            "--strict",
            help="relax no rule of the specification (overrides --lenient)",
            field=None,
        ),
    )


def lenient_rules(args: argparse.Namespace) -> frozenset[Any]:
    """The :class:`~rsnotify.sitemap.Lenient` rules ``args`` asks for (none with ``--strict``)."""
    from .sitemap import parse_lenient

    if getattr(args, "strict", False):
        return frozenset()
    return parse_lenient(getattr(args, "lenient", "none") or "none")
