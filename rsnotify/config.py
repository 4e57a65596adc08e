"""Options from a TOML file and ``RSNOTIFY_*`` environment variables, for every subcommand.

The layer knows no option by name.  It reads each subcommand's own argparse
parser (every action's dest, type, choices, nargs, flag or list nature), so a
new option is configurable the moment it is added to ``configure()``, and a
value from a file goes through the very ``type`` function and ``choices``
that check the command line.  Values found are installed as the parser's
defaults before it parses, which gives the precedence for free and keeps
argparse's own checks (required options, types of flags) in charge:

    command-line flags  >  RSNOTIFY_<COMMAND>_<OPTION>  >  RSNOTIFY_COMMON_<OPTION>
                        >  [<command>] in the file     >  [common] in the file
                        >  built-in defaults

The file is named by ``--config FILE`` (added to every subcommand) or
``RSNOTIFY_CONFIG``.  Sections are subcommand names plus ``[common]``, whose
keys apply to every subcommand that has the option (``redis``, ``log-level``,
``metrics-host``...) and are ignored by the others.  Keys are option names
with dashes or underscores; positional arguments use their dest
(``source = "https://..."``); repeatable options take an array.  Environment
values are strings as on a command line; repeatable options take one value
or a TOML array (``RSNOTIFY_SUBSCRIBE_COLLECTION='["a", "b"]'``); flags take
``1/0, true/false, yes/no, on/off``.

Generic variables carry ``COMMON`` (``RSNOTIFY_COMMON_REDIS``) rather than
being bare ``RSNOTIFY_<OPTION>``: the subscriber exports ``RSNOTIFY_CHANGE``,
``RSNOTIFY_LOC``, ``RSNOTIFY_PATH``... to its hooks, and a hook that runs
``rsnotify`` must not have those read back as options.  (``RSNOTIFY_SECRET``
and ``RSNOTIFY_WS_TOKEN`` are read by the publish and subscribe commands
themselves, below any layer here.)

Every refusal is a :class:`ConfigError` listing each problem with where it
is (file and line, or variable name), what is wrong, and a "did you mean"
when a name is close to a real one.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from .errors import ConfigError, ValueRefused

CONFIG_ENV = "RSNOTIFY_CONFIG"
ENV_PREFIX = "RSNOTIFY_"
COMMON = "common"

Kind = Literal["flag", "count", "list", "value"]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_NOT_CONFIGURABLE = (
    argparse._HelpAction,
    argparse._VersionAction,
    argparse._SubParsersAction,
    argparse._AppendConstAction,
)
_SECRET_NAME = re.compile(r"(?:^|-)(?:secret|token|password|passwd)s?$", re.IGNORECASE)
# --header carries credentials (a bearer token) for the Source: shown redacted too.
_SECRET_NAME = re.compile(rf"{_SECRET_NAME.pattern}|^headers?$", re.IGNORECASE)


# --- problems ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong, located: ``where`` is ``file:line``, a file, or a variable name."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def suggest(name: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


# --- options, read from the parser ---------------------------------------------------


def normalize(key: str) -> str:
    """Config keys compare with dashes: ``from_beginning`` is ``from-beginning``."""
    return key.strip().replace("_", "-").lower()


def env_part(name: str) -> str:
    return name.replace("-", "_").upper()


@dataclass(frozen=True, slots=True)
class Option:
    """One configurable argparse action, and the names it answers to."""

    action: argparse.Action
    kind: Kind
    key: str  # canonical config key (dashes)
    aliases: tuple[str, ...]  # every accepted normalized key, ``key`` first

    @property
    def dest(self) -> str:
        return self.action.dest

    @property
    def positional(self) -> bool:
        return not self.action.option_strings

    @property
    def secret(self) -> bool:
        return bool(_SECRET_NAME.search(self.key))

    def env_names(self, command: str) -> list[str]:
        return [f"{ENV_PREFIX}{env_part(command)}_{env_part(a)}" for a in self.aliases]

    def expected(self, *, item: bool = False) -> str:
        """What a value (or, with ``item``, one element of a list) must look like."""
        if self.kind == "flag":
            return "true or false"
        if self.kind == "count":
            return "a non-negative integer"
        kind = self.action.type
        if kind is int:
            text = "an integer"
        elif kind is float:
            text = "a number"
        elif kind is None or kind is str:
            text = "a string"
        else:  # a type function may say what it takes (rsnotify.argtypes)
            text = getattr(kind, "expected", None) or (
                f"a {getattr(kind, '__name__', 'value').strip('_')} value"
            )
        return f"{text} or an array of them" if self.kind == "list" and not item else text


def _kind(action: argparse.Action) -> Kind | None:
    if isinstance(action, _NOT_CONFIGURABLE):
        return None
    if isinstance(action, argparse._CountAction):
        return "count"
    if action.nargs == 0:  # store_true/false/const, BooleanOptionalAction
        return "flag"
    if isinstance(action, argparse._AppendAction) or action.nargs in ("*", "+"):
        return "list"
    if isinstance(action.nargs, int) and action.nargs > 1:
        return "list"
    return "value"


def options(parser: argparse.ArgumentParser) -> dict[str, Option]:
    """Every configurable option of ``parser``, by each name it answers to."""
    found: dict[str, Option] = {}
    for action in parser._actions:
        kind = _kind(action)
        if kind is None or action.dest in (argparse.SUPPRESS, "config"):
            continue
        longs = [normalize(s.lstrip("-")) for s in action.option_strings if s.startswith("--")]
        names = [*longs]
        dest = normalize(action.dest)
        # The dest is an alias only where it means the same thing as the flag:
        # for ``--no-cache`` (dest ``cache``) "cache = true" would read backwards.
        if kind != "flag" or not longs or dest in longs:
            names.append(dest)
        aliases = tuple(dict.fromkeys(names))
        option = Option(action, kind, aliases[0], aliases)
        for alias in aliases:
            found.setdefault(alias, option)
    return found


def unique(opts: Mapping[str, Option]) -> list[Option]:
    """The options of a mapping from :func:`options`, once each, in parser order."""
    return list({id(o.action): o for o in opts.values()}.values())


# --- conversion ----------------------------------------------------------------------


def _toml_kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, datetime | date | time):
        return "a date/time"
    return type(value).__name__


def _call_type(action: argparse.Action, text: str) -> Any:
    """Convert like argparse does for a command-line string, with its messages."""
    convert = action.type
    if convert is None:
        return text
    if not callable(convert):
        raise ValueRefused(f"option type {convert!r} is not callable")
    try:
        return convert(text)
    except argparse.ArgumentTypeError as exc:
        raise ValueRefused(str(exc)) from None
    except (TypeError, ValueError):
        name = getattr(convert, "__name__", repr(convert))
        raise ValueRefused(f"invalid {name} value: {text!r}") from None


def _check_choice(action: argparse.Action, value: Any) -> Any:
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(repr(c) for c in action.choices)
        raise ValueRefused(f"invalid choice: {value!r} (choose from {choices})")
    return value


def _scalar_from_toml(option: Option, value: Any, *, item: bool = False) -> Any:
    action = option.action
    if isinstance(value, str):
        return _check_choice(action, _call_type(action, value))
    untyped = action.type is None or action.type is str
    untyped = untyped or getattr(action.type, "expected", None) == "a string"
    if isinstance(value, int | float) and not isinstance(value, bool) and not untyped:
        # As the command line would spell it (str(inf) is "inf", which float() reads).
        return _check_choice(action, _call_type(action, str(value)))
    hint = " (quote it)" if untyped and isinstance(value, int | float) else ""
    raise ValueRefused(f"expected {option.expected(item=item)}, got {_toml_kind(value)}{hint}")


def _flag_value(option: Option, given: bool) -> Any:
    """The dest value of a flag given (True) or not (False)."""
    action = option.action
    if isinstance(action, argparse.BooleanOptionalAction):
        return given
    return action.const if given else _original_default(action)


def from_toml(option: Option, value: Any) -> Any:
    """The dest value for a TOML value, converted and checked as argparse would."""
    if option.kind == "flag":
        if not isinstance(value, bool):
            raise ValueRefused(f"expected true or false, got {_toml_kind(value)}")
        return _flag_value(option, value)
    if option.kind == "count":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueRefused(f"expected a non-negative integer, got {_toml_kind(value)}")
        return value
    if option.kind == "list":
        items = value if isinstance(value, list) else [value]
        out = []
        for index, item in enumerate(items):
            try:
                out.append(_scalar_from_toml(option, item, item=isinstance(value, list)))
            except ValueRefused as exc:
                where = f"item {index + 1}: " if isinstance(value, list) else ""
                raise ValueRefused(f"{where}{exc}") from None
        return _check_count(option, out)
    return _scalar_from_toml(option, value)


def _check_count(option: Option, items: list[Any]) -> list[Any]:
    nargs = option.action.nargs
    if nargs == "+" and not items:
        raise ValueRefused("expected at least one value")
    if isinstance(nargs, int) and nargs > 1 and len(items) != nargs:
        raise ValueRefused(f"expected {nargs} values, got {len(items)}")
    return items


def from_env(option: Option, text: str) -> Any:
    """The dest value for an environment string (flags: yes/no words; lists: TOML arrays)."""
    if option.kind == "flag":
        word = text.strip().lower()
        if word in _TRUE:
            return _flag_value(option, True)
        if word in _FALSE:
            return _flag_value(option, False)
        raise ValueRefused(f"expected 1/0, true/false, yes/no or on/off, got {text!r}")
    if option.kind == "count":
        if not text.strip().isdigit():
            raise ValueRefused(f"expected a non-negative integer, got {text!r}")
        return int(text)
    if option.kind == "list":
        if text.lstrip().startswith("["):
            try:
                items = tomllib.loads(f"v = {text}")["v"]
            except tomllib.TOMLDecodeError as exc:
                raise ValueRefused(f"not a TOML array ({exc}): {text!r}") from None
            return from_toml(option, items)
        return _check_count(option, [_check_choice(option.action, _call_type(option.action, text))])
    return _check_choice(option.action, _call_type(option.action, text))


# --- the file ------------------------------------------------------------------------

_HEADER = re.compile(r"^\s*\[\s*([A-Za-z0-9_\-\"' .]+?)\s*\]\s*(?:#.*)?$")
_KEY = re.compile(r"""^\s*(?:"([^"]+)"|'([^']+)'|([A-Za-z0-9_\-]+))\s*=""")


@dataclass(slots=True)
class ConfigFile:
    """A parsed TOML configuration file and where its keys are (for messages)."""

    path: Path
    data: dict[str, Any]
    lines: dict[tuple[str, str], int] = field(default_factory=dict)
    section_lines: dict[str, int] = field(default_factory=dict)

    def where(self, section: str | None = None, key: str | None = None) -> str:
        line = None
        if section is not None:
            line = self.section_lines.get(section)
            if key is not None:
                line = self.lines.get((section, key), line)
        return f"{self.path}:{line}" if line else str(self.path)


def _locate(text: str) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
    """Lines of ``[section]`` headers and their ``key =`` lines (tomllib gives none)."""
    keys: dict[tuple[str, str], int] = {}
    sections: dict[str, int] = {}
    section = ""
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header:
            section = header.group(1).strip().strip("\"'")
            sections.setdefault(section, number)
            continue
        key = _KEY.match(line)
        if key:
            name = next(g for g in key.groups() if g is not None)
            keys.setdefault((section, name), number)
    return keys, sections


def load(path: str | os.PathLike[str]) -> ConfigFile:
    """Read and parse a TOML file; unreadable files and syntax errors are ConfigErrors."""
    location = Path(path)
    try:
        raw = location.read_bytes()
    except OSError as exc:
        raise ConfigError([Problem(str(location), f"cannot read: {exc.strerror or exc}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([Problem(str(location), f"not UTF-8: {exc}")]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([Problem(str(location), f"invalid TOML: {exc}")]) from None
    keys, sections = _locate(text)
    return ConfigFile(location, data, keys, sections)


# --- resolving -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Setting:
    """A value for one option and where it came from (for ``config show``)."""

    option: Option
    value: Any  # the dest value, converted
    shown: Any  # a TOML-able form of what was written
    origin: str


def file_sections(
    file: ConfigFile, sections: Iterable[str], problems: list[Problem]
) -> dict[str, dict[str, Any]]:
    """The file's tables by section name; reports non-tables and unknown sections."""
    known = [*sections, COMMON]
    out: dict[str, dict[str, Any]] = {}
    for name, table in file.data.items():
        where = file.where(name)
        if not isinstance(table, dict):
            problems.append(
                Problem(
                    file.where("", name),
                    f"{name!r} is outside any section; put it under [{COMMON}] or a "
                    f"subcommand's section ({', '.join(f'[{s}]' for s in known)})",
                )
            )
        elif name not in known:
            problems.append(
                Problem(
                    where,
                    f"unknown section [{name}]{suggest(name, known)} "
                    f"(sections: {', '.join(f'[{s}]' for s in known)})",
                )
            )
        else:
            out[name] = table
    return out


def table_settings(
    file: ConfigFile,
    section: str,
    table: Mapping[str, Any],
    opts: Mapping[str, Option],
    problems: list[Problem],
    *,
    strict: bool,
) -> dict[str, Setting]:
    settings: dict[str, Setting] = {}
    seen: dict[str, str] = {}
    for key, value in table.items():
        where = file.where(section, key)
        option = opts.get(normalize(key))
        if option is None:
            if strict:
                problems.append(
                    Problem(
                        where,
                        f"[{section}] {key}: unknown option{suggest(normalize(key), opts)}",
                    )
                )
            continue
        if option.dest in seen:
            problems.append(
                Problem(where, f"[{section}] {key}: set twice (also as {seen[option.dest]!r})")
            )
            continue
        seen[option.dest] = key
        if isinstance(value, dict):
            problems.append(
                Problem(where, f"[{section}] {key}: expected {option.expected()}, got a table")
            )
            continue
        try:
            converted = from_toml(option, value)
        except ValueRefused as exc:
            problems.append(Problem(where, f"[{section}] {key}: {exc}"))
            continue
        settings[option.dest] = Setting(option, converted, value, f"{where} [{section}]")
    return settings


def _shown_env(option: Option, value: Any, text: str) -> Any:
    if option.kind == "flag":  # as in the file: was the flag given?
        return text.strip().lower() in _TRUE
    if option.kind == "count":
        return value
    if option.kind == "list":
        if text.lstrip().startswith("["):
            return tomllib.loads(f"v = {text}")["v"]
        return [text]
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        return value
    return text


def env_settings(
    command: str,
    opts: Mapping[str, Option],
    environ: Mapping[str, str],
    problems: list[Problem],
    *,
    prefix_part: str,
    strict: bool,
) -> dict[str, Setting]:
    prefix = f"{ENV_PREFIX}{prefix_part}_"
    by_name = {
        f"{prefix}{env_part(alias)}": option for option in unique(opts) for alias in option.aliases
    }
    settings: dict[str, Setting] = {}
    for name in sorted(environ):
        if not name.startswith(prefix):
            continue
        option = by_name.get(name)
        if option is None:
            if strict:
                unknown = name[len(prefix) :]
                hint = suggest(name, by_name)
                problems.append(Problem(name, f"no option {unknown!r} in rsnotify {command}{hint}"))
            continue
        if option.dest in settings:
            problems.append(Problem(name, f"set twice (also as {settings[option.dest].origin})"))
            continue
        text = environ[name]
        try:
            value = from_env(option, text)
        except ValueRefused as exc:
            problems.append(Problem(name, str(exc)))
            continue
        settings[option.dest] = Setting(option, value, _shown_env(option, value, text), name)
    return settings


def resolve(
    command: str,
    parser: argparse.ArgumentParser,
    file: ConfigFile | None,
    environ: Mapping[str, str],
    *,
    sections: Iterable[str],
) -> dict[str, Setting]:
    """Merge file and environment for ``command`` (no flags yet); ConfigError on any problem.

    ``sections`` are every subcommand's name: a section for another subcommand
    is legal here, but its keys are checked only when that subcommand runs (or by
    ``rsnotify config check``, which knows every parser).
    """
    opts = options(parser)
    problems: list[Problem] = []
    merged: dict[str, Setting] = {}
    if file is not None:
        tables = file_sections(file, sections, problems)
        if COMMON in tables:
            merged.update(
                table_settings(file, COMMON, tables[COMMON], opts, problems, strict=False)
            )
        if command in tables:
            merged.update(
                table_settings(file, command, tables[command], opts, problems, strict=True)
            )
    merged.update(
        env_settings(command, opts, environ, problems, prefix_part="COMMON", strict=False)
    )
    merged.update(
        env_settings(command, opts, environ, problems, prefix_part=env_part(command), strict=True)
    )
    if problems:
        raise ConfigError(in_order(problems))
    return merged


def in_order(problems: Iterable[Problem]) -> list[Problem]:
    """File problems by line, then variables by name; duplicates dropped."""

    def key(problem: Problem) -> tuple[int, str, int, str]:
        path, _, line = problem.where.rpartition(":")
        if path and line.isdigit():
            return (0, path, int(line), problem.message)
        return (1 if problem.where.startswith(ENV_PREFIX) else 0, problem.where, 0, problem.message)

    return sorted(dict.fromkeys(problems), key=key)


# --- installing the values into the parser --------------------------------------------

_ORIGINAL = "_rsnotify_original"  # (default, required, nargs) before install()


def _original_default(action: argparse.Action) -> Any:
    saved = getattr(action, _ORIGINAL, None)
    return action.default if saved is None else saved[0]


def uninstall(parser: argparse.ArgumentParser) -> None:
    """Undo :func:`install`, so a parser can be used again with other settings."""
    for action in parser._actions:
        saved = getattr(action, _ORIGINAL, None)
        if saved is not None:
            action.default, action.required, action.nargs = saved
            delattr(action, _ORIGINAL)


def install(settings: Mapping[str, Setting]) -> dict[str, Any]:
    """Make the settings the parser's defaults; returns the list values to restore after parse.

    A repeatable option's configured list is not a default argparse may append
    to (``--collection c`` would give file items + c): its default becomes a
    fresh empty list, and :func:`finish` puts the configured list back only if
    no flag replaced that very object.
    """
    lists: dict[str, Any] = {}
    for dest, setting in settings.items():
        action = setting.option.action
        if not hasattr(action, _ORIGINAL):
            setattr(action, _ORIGINAL, (action.default, action.required, action.nargs))
        action.required = False
        if setting.option.positional:
            action.nargs = "*" if action.nargs in ("*", "+") else "?"
        if setting.option.kind == "list" and isinstance(action, argparse._AppendAction):
            empty: list[Any] = []
            action.default = empty
            lists[dest] = (empty, setting.value)
        else:
            action.default = setting.value
    return lists


def finish(namespace: argparse.Namespace, lists: Mapping[str, Any]) -> argparse.Namespace:
    for dest, (placeholder, configured) in lists.items():
        if getattr(namespace, dest, None) is placeholder:
            setattr(namespace, dest, list(configured))
    return namespace


def add_config_option(parser: argparse.ArgumentParser) -> None:
    if "--config" not in parser._option_string_actions:
        parser.add_argument(
            "--config",
            metavar="FILE",
            help=f"read options from this TOML file: section [{parser.prog.split()[-1]}], "
            f"then [{COMMON}] (default: ${CONFIG_ENV}); flags and RSNOTIFY_* variables win",
        )


def config_path(argv: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """The ``--config`` value in ``argv``, else ``$RSNOTIFY_CONFIG``."""
    scout = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    scout.add_argument("--config")
    try:
        known, _ = scout.parse_known_args(list(argv))
    except argparse.ArgumentError:
        known = argparse.Namespace(config=None)  # the real parser reports it
    if known.config:
        return str(known.config)
    return environ.get(CONFIG_ENV) or None


def parse_args(
    parser: argparse.ArgumentParser,
    command: str,
    argv: Sequence[str],
    *,
    environ: Mapping[str, str] | None = None,
    sections: Iterable[str] = (),
) -> argparse.Namespace:
    """``parser.parse_args(argv)`` with file and environment values beneath the flags."""
    environ = os.environ if environ is None else environ
    add_config_option(parser)
    uninstall(parser)
    path = config_path(argv, environ)
    file = load(path) if path else None
    settings = resolve(command, parser, file, environ, sections=dict.fromkeys([*sections, command]))
    lists = install(settings)
    return finish(parser.parse_args(list(argv)), lists)


# --- showing -------------------------------------------------------------------------


def redact(option: Option, value: Any) -> Any:
    """Hide secrets: whole values of secret options, passwords inside URLs."""
    if value is None:
        return None
    if option.secret:
        return [redact_text(v, True) for v in value] if isinstance(value, list) else "<redacted>"
    if isinstance(value, list):
        return [redact(option, v) for v in value]
    return redact_text(value, False) if isinstance(value, str) else value


def redact_text(text: Any, whole: bool) -> Any:
    if whole:
        return "<redacted>"
    if not isinstance(text, str) or "@" not in text or "://" not in text:
        return text
    try:
        parts = urlsplit(text)
    except ValueError:
        return text
    if parts.password is None:
        return text
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:<redacted>@{host}"))


def toml_value(value: Any) -> str | None:
    """``value`` as TOML text, or None when TOML cannot say it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, os.PathLike):
        return json.dumps(os.fspath(value), ensure_ascii=False)
    if isinstance(value, list | tuple):
        items = [toml_value(v) for v in value]
        if any(i is None for i in items):
            return None
        return "[" + ", ".join(items) + "]"  # type: ignore[arg-type]
    return None


def show(parser: argparse.ArgumentParser, settings: Mapping[str, Setting]) -> list[str]:
    """The effective options as TOML lines, each with where its value came from."""
    lines: list[str] = []
    for option in unique(options(parser)):
        setting = settings.get(option.dest)
        if setting is not None:
            text = toml_value(redact(option, setting.shown))
            if text is None:
                text = json.dumps(str(setting.shown))
            lines.append(f"{option.key} = {text}  # {setting.origin}")
            continue
        default = _original_default(option.action)
        if option.kind == "flag" and not isinstance(option.action, argparse.BooleanOptionalAction):
            default = False  # the flag is not given
        text = toml_value(redact(option, default))
        if default is None or default == argparse.SUPPRESS:
            required = " (required)" if option.action.required else ""
            lines.append(f"# {option.key} =  # not set{required}")
        elif text is None:
            lines.append(f"# {option.key}: default {default!r}")
        else:
            lines.append(f"{option.key} = {text}  # default")
    return lines


# --- lenient reading of Sources (Z39.99 rules a reader may relax) ---------------------


def _lenient_text(text: str) -> str:
    """``--lenient`` values checked now (an unknown rule is a usage error), kept as text."""
    from .sitemap import Lenient, parse_lenient

    try:
        rules = parse_lenient(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return ",".join(rule.value for rule in Lenient if rule in rules) or "none"


def add_lenient_option(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, default: str = "none"
) -> None:
    """``--lenient RULE[,RULE]`` (and ``--strict``): the specification rules a reader relaxes.

    One spelling for ``inspect``, ``publish`` and ``subscribe``; the rules are
    :class:`rsnotify.sitemap.Lenient` and end up in ``sitemap.Limits.lenient``
    through :func:`lenient_rules`.
    """
    from .sitemap import LENIENT_HELP

    rules = "; ".join(f"{rule.value}: {text}" for rule, text in LENIENT_HELP.items())
    parser.add_argument(
        "--lenient",
        metavar="RULE[,RULE]",
        type=_lenient_text,
        default=default,
        help=f"relax these rules of the specification, each reported once per document "
        f"({rules}; also all, none; default: {default})",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="relax no rule of the specification (overrides --lenient)",
    )


def lenient_rules(args: argparse.Namespace) -> frozenset[Any]:
    """The :class:`~rsnotify.sitemap.Lenient` rules ``args`` asks for (none with ``--strict``)."""
    from .sitemap import parse_lenient

    if getattr(args, "strict", False):
        return frozenset()
    return parse_lenient(getattr(args, "lenient", "none") or "none")
