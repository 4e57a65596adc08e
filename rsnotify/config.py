"""Options from a TOML file and ``RSNOTIFY_*`` environment variables, for every subcommand.

The layer knows no option by name.  It works from each subcommand's declared
options (:mod:`rsnotify.options`: dest, config key, kind of value, ``type=``
function, choices, secret-ness), so an option is configurable the moment it
is declared, and a value from a file goes through the very ``type`` function
and ``choices`` that check the command line (:mod:`rsnotify.configvalues`).
The values found become the defaults of the parser built for this run, which
gives the precedence for free and keeps argparse's own checks (required
options, types of flags) in charge:

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
and ``RSNOTIFY_WS_TOKEN`` are the declared defaults of ``--secret`` and
``--ws-token``, below any layer here.)

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .configfile import ConfigError, ConfigFile, Problem, load
from .configvalues import ValueRefused, expected, from_env, from_toml, shown_env
from .logs import redact_url
from .options import Opt, Options, add_arguments, fill, normalize

__all__ = [
    "COMMON",
    "CONFIG_ENV",
    "ENV_PREFIX",
    "ConfigError",
    "ConfigFile",
    "Problem",
    "Setting",
    "ValueRefused",
    "env_part",
    "env_settings",
    "file_sections",
    "from_toml",
    "in_order",
    "load",
    "normalize",
    "options",
    "parse_args",
    "resolve",
    "show",
    "suggest",
    "table_settings",
]

CONFIG_ENV = "RSNOTIFY_CONFIG"
ENV_PREFIX = "RSNOTIFY_"
COMMON = "common"


def suggest(name: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def env_part(name: str) -> str:
    return name.replace("-", "_").upper()


def options(declared: Options) -> dict[str, Opt]:
    """Every option of a command, by each config key it answers to."""
    found: dict[str, Opt] = {}
    for opt in declared:
        for alias in opt.aliases:
            found.setdefault(alias, opt)
    return found


def unique(opts: Mapping[str, Opt]) -> list[Opt]:
    """The options of a mapping from :func:`options`, once each, in declared order."""
    return list({id(o): o for o in opts.values()}.values())


# --- resolving -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Setting:
    """A value for one option and where it came from (for ``config show``)."""

    option: Opt
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
                    file.where(name),
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
    opts: Mapping[str, Opt],
    problems: list[Problem],
    *,
    strict: bool,
) -> dict[str, Setting]:
    settings: dict[str, Setting] = {}
    seen: dict[str, str] = {}
    for key, value in table.items():
        where = file.where(section, key)
        opt = opts.get(normalize(key))
        if opt is None:
            if strict:
                problems.append(
                    Problem(
                        where,
                        f"[{section}] {key}: unknown option{suggest(normalize(key), opts)}",
                    )
                )
            continue
        if opt.dest in seen:
            problems.append(
                Problem(where, f"[{section}] {key}: set twice (also as {seen[opt.dest]!r})")
            )
            continue
        seen[opt.dest] = key
        if isinstance(value, dict):
            problems.append(
                Problem(where, f"[{section}] {key}: expected {expected(opt)}, got a table")
            )
            continue
        try:
            converted = from_toml(opt, value)
        except ValueRefused as exc:
            problems.append(Problem(where, f"[{section}] {key}: {exc}"))
            continue
        settings[opt.dest] = Setting(opt, converted, value, f"{where} [{section}]")
    return settings


def env_settings(
    command: str,
    opts: Mapping[str, Opt],
    environ: Mapping[str, str],
    problems: list[Problem],
    *,
    prefix_part: str,
    strict: bool,
) -> dict[str, Setting]:
    prefix = f"{ENV_PREFIX}{prefix_part}_"
    by_name = {f"{prefix}{env_part(alias)}": opt for opt in unique(opts) for alias in opt.aliases}
    settings: dict[str, Setting] = {}
    for name in sorted(environ):
        if not name.startswith(prefix):
            continue
        opt = by_name.get(name)
        if opt is None:
            if strict:
                unknown = name[len(prefix) :]
                hint = suggest(name, by_name)
                problems.append(Problem(name, f"no option {unknown!r} in rsnotify {command}{hint}"))
            continue
        if opt.dest in settings:
            problems.append(Problem(name, f"set twice (also as {settings[opt.dest].origin})"))
            continue
        text = environ[name]
        try:
            value = from_env(opt, text)
        except ValueRefused as exc:
            problems.append(Problem(name, str(exc)))
            continue
        settings[opt.dest] = Setting(opt, value, shown_env(opt, value, text), name)
    return settings


def resolve(
    command: str,
    declared: Options,
    file: ConfigFile | None,
    environ: Mapping[str, str],
    *,
    sections: Iterable[str],
) -> dict[str, Setting]:
    """Merge file and environment for ``command`` (no flags yet); ConfigError on any problem.

    ``sections`` are every subcommand's name: a section for another subcommand
    is legal here, but its keys are checked only when that subcommand runs (or by
    ``rsnotify config check``, which knows every subcommand's options).
    """
    opts = options(declared)
    problems: list[Problem] = []
    merged: dict[str, Setting] = {}
    if file is not None:
        tables = file_sections(file, sections, problems)
        for section, strict in ((COMMON, False), (command, True)):
            if section in tables:
                merged.update(
                    table_settings(file, section, tables[section], opts, problems, strict=strict)
                )
    for part, strict in (("COMMON", False), (env_part(command), True)):
        merged.update(
            env_settings(command, opts, environ, problems, prefix_part=part, strict=strict)
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


# --- parsing -------------------------------------------------------------------------


def parse_args(
    declared: Options,
    parser: argparse.ArgumentParser,
    command: str,
    argv: Sequence[str],
    *,
    environ: Mapping[str, str] | None = None,
    sections: Iterable[str] = (),
) -> argparse.Namespace:
    """Parse ``argv`` with file and environment values beneath the flags.

    ``parser`` is new (it has no arguments yet): it gets the declared options,
    with the configured values as their defaults, and ``--config``.
    """
    environ = os.environ if environ is None else environ
    path = config_path(argv, environ)
    file = load(path) if path else None
    sections = dict.fromkeys([*sections, command])
    settings = resolve(command, declared, file, environ, sections=sections)
    configured = {dest: setting.value for dest, setting in settings.items()}
    add_arguments(declared, parser, environ=environ, configured=configured)
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"read options from this TOML file: section [{command}], "
        f"then [{COMMON}] (default: ${CONFIG_ENV}); flags and RSNOTIFY_* variables win",
    )
    return fill(parser.parse_args(list(argv)), declared, configured)


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


# --- showing -------------------------------------------------------------------------


def redact(opt: Opt, value: Any) -> Any:
    """Hide secrets: whole values of secret options, passwords inside URLs."""
    if value is None:
        return None
    if opt.secret:
        return [redact_text(v, True) for v in value] if isinstance(value, list) else "<redacted>"
    if isinstance(value, list):
        return [redact(opt, v) for v in value]
    return redact_text(value, False) if isinstance(value, str) else value


def redact_text(text: Any, whole: bool) -> Any:
    if whole:
        return "<redacted>"
    return redact_url(text) if isinstance(text, str) else text


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


def show(
    declared: Options, settings: Mapping[str, Setting], environ: Mapping[str, str]
) -> list[str]:
    """The effective options as TOML lines, each with where its value came from."""
    lines: list[str] = []
    for opt in declared:
        setting = settings.get(opt.dest)
        if setting is not None:
            text = toml_value(redact(opt, setting.shown))
            if text is None:
                text = json.dumps(str(setting.shown))
            lines.append(f"{opt.key} = {text}  # {setting.origin}")
            continue
        default = opt.default_value(environ)
        if opt.kind == "flag" and not opt.toggle:
            default = False  # the flag is not given
        text = toml_value(redact(opt, default))
        if default is None:
            required = " (required)" if opt.is_required else ""
            lines.append(f"# {opt.key} =  # not set{required}")
        elif text is None:
            lines.append(f"# {opt.key}: default {default!r}")
        else:
            lines.append(f"{opt.key} = {text}  # default")
    return lines
