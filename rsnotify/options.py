"""Each command's options, declared once: the parser, the configuration layer and the config object.

A command lists its options as :class:`Opt` values (made by :func:`option`,
:func:`flag`, :func:`repeated`, :func:`positional`, :func:`count`), grouped
for ``--help`` by :class:`Group`, in one :class:`Options`.  From that one
declaration:

* :func:`add_arguments` builds the argparse parser (flags, ``type=`` function
  from :mod:`rsnotify.argtypes`, default, help, metavar, choices);
* :mod:`rsnotify.config` layers the TOML file and ``RSNOTIFY_*`` variables
  over the same declarations (config key, kind of value, secret-ness), and
  hands its values back to :func:`add_arguments` as the defaults the flags
  override: argparse's own checks stay in charge and no parser is touched
  after it is built;
* :func:`build` makes the command's config object (``SubscriberConfig``...)
  from the parsed values, each option filling the field it names.

An option that is not a field of the config object says ``field=None``; one
whose field has another name or form says ``field="..."`` and ``to_field=``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

__all__ = [
    "Group",
    "Opt",
    "Options",
    "add_arguments",
    "build",
    "count",
    "fill",
    "flag",
    "normalize",
    "option",
    "positional",
    "repeated",
]

Kind = Literal["flag", "count", "list", "value"]
T = TypeVar("T")

_SAME = "<the dest>"  # Opt.field's default: the field is named like the option's dest


@dataclass(frozen=True, slots=True)
class Opt:
    """One option: how it is spelled and parsed, its default, and where its value goes."""

    flags: tuple[str, ...]  # ("--into",), ("-v", "--verbose"), or a positional's name
    kind: Kind
    help: str | None = None
    type: Callable[[str], Any] | None = None
    default: Any = None
    metavar: str | None = None
    choices: tuple[Any, ...] | None = None
    required: bool = False
    # list: None is a repeatable flag; "+", "*" or a count take several words at once.
    # value: "?" takes an optional word (``const`` when it is left out).
    nargs: int | str | None = None
    const: Any = None
    dest_name: str | None = None  # argparse's dest when not derived from the flag
    negative: bool = False  # flag: giving it stores False (``--no-cache``)
    toggle: bool = False  # flag: both ``--x`` and ``--no-x``
    secret: bool = False  # redacted by ``rsnotify config show``
    # The default is this variable's value when it is set (read at parse time).
    default_env: str | None = None
    field: str | None = _SAME  # the config object's field; None: not one
    to_field: Callable[[Any], Any] | None = None  # the field's value from the option's

    @property
    def positional(self) -> bool:
        return not self.flags[0].startswith("-")

    @property
    def is_required(self) -> bool:
        """Required unless configured: ``required=`` options and one-word positionals."""
        return self.required or (self.positional and self.nargs in (None, "+"))

    @property
    def longs(self) -> list[str]:
        """The long flags without their dashes (``from-beginning``)."""
        return [f[2:] for f in self.flags if f.startswith("--")]

    @property
    def key(self) -> str:
        """The name in a configuration file: the first long flag, else the dest."""
        return normalize((self.longs or [self.dest])[0])

    @property
    def aliases(self) -> tuple[str, ...]:
        """Every config key it answers to, ``key`` first (dashes and underscores alike).

        The dest is one only where it means the same as the flag: for
        ``--no-cache`` (dest ``cache``) "cache = true" would read backwards.
        """
        names = [normalize(long) for long in self.longs]
        if self.kind != "flag" or not names or normalize(self.dest) in names:
            names.append(normalize(self.dest))
        return tuple(dict.fromkeys(names))

    @property
    def dest(self) -> str:
        """The attribute of the parsed namespace, named as argparse would name it."""
        if self.dest_name is not None:
            return self.dest_name
        if self.positional:
            return self.flags[0]
        name = (self.longs or [self.flags[0].lstrip("-")])[0]
        return name.replace("-", "_")

    @property
    def field_name(self) -> str | None:
        return self.dest if self.field == _SAME else self.field

    def default_value(self, environ: Mapping[str, str]) -> Any:
        """The built-in default, or ``default_env``'s value where that variable is set.

        A repeatable option takes the variable as one item, and only when it is
        not empty; a single value takes it as it is, so an empty one meets the
        option's own check (``--secret: must not be empty``).
        """
        text = environ.get(self.default_env) if self.default_env else None
        if self.kind == "list":
            return [text] if text else _fresh(self.default)
        return self.default if text is None else text


def normalize(key: str) -> str:
    """Config keys compare with dashes: ``from_beginning`` is ``from-beginning``."""
    return key.strip().replace("_", "-").lower()


def _fresh(value: T) -> T:
    """A list default is copied, so no parse can append to the declaration's own list."""
    # The ignore: list(value) is a list[Any] where mypy wants the T it cannot see is a list.
    return list(value) if isinstance(value, list) else value  # type: ignore[return-value]


def option(*flags: str, **spec: Any) -> Opt:
    """An option that takes one value (``--poll 0.5``)."""
    return Opt(flags, "value", **spec)


def flag(*flags: str, **spec: Any) -> Opt:
    """An option that takes no value: ``store_true``, ``negative`` or ``toggle``."""
    if not spec.get("toggle"):
        spec.setdefault("default", bool(spec.get("negative")))  # as store_true/store_false
    return Opt(flags, "flag", **spec)


def repeated(*flags: str, **spec: Any) -> Opt:
    """A list: a repeatable option (``--collection a --collection b``) or ``nargs`` words."""
    spec.setdefault("default", None if spec.get("nargs") is not None else [])
    return Opt(flags, "list", **spec)


def count(*flags: str, **spec: Any) -> Opt:
    """An option counted each time it is given (``-vv``)."""
    spec.setdefault("default", 0)
    return Opt(flags, "count", **spec)


def positional(name: str, **spec: Any) -> Opt:
    """A positional argument; ``nargs="+"`` or ``"*"`` makes it a list."""
    kind: Kind = "list" if spec.get("nargs") in ("+", "*") else "value"
    return Opt((name,), kind, **spec)


class Group:
    """Options shown together in ``--help`` under ``title`` (argparse's argument group)."""

    def __init__(self, title: str, *options: Opt | Sequence[Opt]) -> None:
        self.title = title
        self.options: tuple[Opt, ...] = _flat(options)


def _flat(items: Sequence[Opt | Sequence[Opt]]) -> tuple[Opt, ...]:
    return tuple(o for item in items for o in ([item] if isinstance(item, Opt) else item))


class Options:
    """One command's options in the order ``--help`` and ``config show`` list them."""

    def __init__(self, *items: Opt | Group | Sequence[Opt]) -> None:
        self.items: tuple[Opt | Group, ...] = tuple(
            part for item in items for part in ([item] if isinstance(item, Opt | Group) else item)
        )

    def __iter__(self) -> Iterator[Opt]:
        for item in self.items:
            yield from item.options if isinstance(item, Group) else (item,)


# --- the parser ------------------------------------------------------------------------


def _arguments(opt: Opt, default: Any, required: bool) -> dict[str, Any]:
    """``add_argument`` keywords for ``opt`` with this default."""
    keywords: dict[str, Any] = {"help": opt.help}
    if opt.dest_name is not None and not opt.positional:
        keywords["dest"] = opt.dest_name
    if opt.kind == "flag":
        if opt.toggle:
            keywords["action"] = argparse.BooleanOptionalAction
        else:
            keywords["action"] = "store_false" if opt.negative else "store_true"
        keywords["default"] = default
    elif opt.kind == "count":
        keywords.update(action="count", default=default)
    else:
        keywords.update(type=opt.type, default=default, metavar=opt.metavar)
        if opt.choices is not None:
            keywords["choices"] = opt.choices
        nargs = opt.nargs
        if opt.kind == "list" and nargs is None and not opt.positional:
            keywords["action"] = "append"
        if opt.positional and not required:  # configured: the word may be left out
            nargs = "*" if opt.kind == "list" else "?"
        if nargs is not None:
            keywords["nargs"] = nargs
        if opt.const is not None:
            keywords["const"] = opt.const
    if not opt.positional and required:
        keywords["required"] = True
    return {k: v for k, v in keywords.items() if v is not None or k == "default"}


def add_arguments(
    options: Options,
    parser: argparse.ArgumentParser,
    *,
    environ: Mapping[str, str],
    configured: Mapping[str, Any] | None = None,
) -> argparse.ArgumentParser:
    """Add every option to a new ``parser``; ``configured`` values (by dest) replace defaults.

    A configured option is no longer required (a configured positional may be
    left out).  A configured repeatable option gets no default at all (argparse
    would append the flags' items to it); :func:`fill` puts its value in the
    namespace when no flag gave one, so ``--collection c`` replaces the file's
    list rather than extending it.
    """
    configured = configured or {}
    for item in options.items:
        target: Any = parser
        members = item.options if isinstance(item, Group) else (item,)
        if isinstance(item, Group):
            target = parser.add_argument_group(item.title)
        for opt in members:
            required = opt.is_required
            if opt.dest in configured:
                required = False
                value = configured[opt.dest]
                default = argparse.SUPPRESS if _appends(opt) else value
            else:
                default = opt.default_value(environ)
            target.add_argument(*opt.flags, **_arguments(opt, default, required))
    return parser


def _appends(opt: Opt) -> bool:
    return opt.kind == "list" and opt.nargs is None and not opt.positional


def fill(
    namespace: argparse.Namespace, options: Options, configured: Mapping[str, Any]
) -> argparse.Namespace:
    """Configured list values the flags did not replace (see :func:`add_arguments`)."""
    for opt in options:
        if opt.dest in configured and not hasattr(namespace, opt.dest):
            setattr(namespace, opt.dest, _fresh(configured[opt.dest]))
    return namespace


# --- the config object -----------------------------------------------------------------


def build(cls: Callable[..., T], options: Options, values: argparse.Namespace, **derived: Any) -> T:
    """``cls(...)`` from the parsed values: each option's ``field``, then ``derived`` ones.

    ``derived`` carries the fields made from several options at once (the HTTP
    policy, the lenient rules) or from another field.
    """
    fields: dict[str, Any] = {}
    for opt in options:
        name = opt.field_name
        if name is None:
            continue
        value = getattr(values, opt.dest)
        fields[name] = opt.to_field(value) if opt.to_field is not None else value
    fields.update(derived)
    return cls(**fields)
