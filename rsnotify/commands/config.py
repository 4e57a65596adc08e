"""``rsnotify config check|show``: validate a configuration file; print effective options.

``check`` validates every section of a file against the real parsers of the
subcommands, so it accepts exactly what ``rsnotify <command> --config FILE``
would accept and finds a typo before a service restarts on it at 3 a.m.
``show`` prints what a subcommand would run with, as TOML, each value with
where it came from; secrets are redacted so the output can be pasted in a
ticket.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from .. import config
from ..config import COMMON, ConfigError, Problem

NAME = "config"
HELP = "check a configuration file against every subcommand; show the effective options"
CONFIG_LAYER = False  # this command reads configuration files; it is not configured by one


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check",
        help="validate every section of FILE; exit 1 with one line per problem",
        description="Validate every section of a TOML configuration file against the "
        "subcommands' own option parsers.",
    )
    check.add_argument(
        "file", nargs="?", metavar="FILE", help=f"the file (default: ${config.CONFIG_ENV})"
    )
    check.add_argument(
        "--env",
        action="store_true",
        help="also check the RSNOTIFY_<COMMAND>_* and RSNOTIFY_COMMON_* environment variables",
    )
    show = actions.add_parser(
        "show",
        help="print the options COMMAND would run with (before flags), secrets redacted",
        description="Print the options a subcommand would run with from its file and "
        "environment, as TOML, with where each value comes from.",
    )
    show.add_argument("command", metavar="COMMAND", help="a subcommand, e.g. publish")
    show.add_argument("--config", metavar="FILE", help=f"the file (default: ${config.CONFIG_ENV})")


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every configurable subcommand's real parser."""
    from ..cli import COMMANDS, command_parser

    parsers: dict[str, argparse.ArgumentParser] = {}
    for name, _, _ in COMMANDS:
        module, parser = command_parser(name)
        if getattr(module, "CONFIG_LAYER", True):
            parsers[name] = parser
    return parsers


def _check_common(
    file: config.ConfigFile,
    table: Mapping[str, object],
    parsers: Mapping[str, argparse.ArgumentParser],
    problems: list[Problem],
) -> None:
    """[common] keys must mean something to at least one subcommand, and be valid for each."""
    per_command = {name: config.options(parser) for name, parser in parsers.items()}
    every = sorted({key for opts in per_command.values() for key in opts})
    for key, value in table.items():
        where = file.where(COMMON, key)
        users = {
            n: o[config.normalize(key)]
            for n, o in per_command.items()
            if config.normalize(key) in o
        }
        if not users:
            hint = config.suggest(config.normalize(key), every)
            problems.append(
                Problem(where, f"[{COMMON}] {key}: no subcommand has this option{hint}")
            )
            continue
        for command, option in users.items():
            try:
                config.from_toml(option, value)
            except config.ValueRefused as exc:
                problems.append(Problem(where, f"[{COMMON}] {key}: {exc} (for rsnotify {command})"))


def check(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> list[Problem]:
    """Every problem in the file (and in ``environ``'s RSNOTIFY_* variables, if given)."""
    try:
        file = config.load(path)
    except ConfigError as exc:
        return exc.problems
    parsers = _parsers()
    problems: list[Problem] = []
    tables = config.file_sections(file, parsers, problems)
    for section, table in tables.items():
        if section == COMMON:
            _check_common(file, table, parsers, problems)
        else:
            opts = config.options(parsers[section])
            config.table_settings(file, section, table, opts, problems, strict=True)
    if environ is not None:
        problems += check_environment(environ, parsers)
    return config.in_order(problems)


def check_environment(
    environ: Mapping[str, str], parsers: Mapping[str, argparse.ArgumentParser] | None = None
) -> list[Problem]:
    parsers = _parsers() if parsers is None else parsers
    problems: list[Problem] = []
    common_seen: set[str] = set()
    for name, parser in parsers.items():
        opts = config.options(parser)
        for strict, part in ((False, "COMMON"), (True, config.env_part(name))):
            found = config.env_settings(
                name, opts, environ, problems, prefix_part=part, strict=strict
            )
            if not strict:
                common_seen.update(s.origin for s in found.values())
    common_prefix = f"{config.ENV_PREFIX}COMMON_"
    for variable in sorted(environ):
        if variable.startswith(common_prefix) and variable not in common_seen:
            if any(p.where == variable for p in problems):
                continue
            problems.append(Problem(variable, "no subcommand has this option"))
    return config.in_order(problems)


def _summary(path: str, parsers_used: list[str]) -> str:
    sections = ", ".join(f"[{s}]" for s in parsers_used) or "no sections"
    return f"{path}: OK ({sections})"


def run(args: argparse.Namespace) -> int:
    if args.action == "check":
        path = args.file or os.environ.get(config.CONFIG_ENV)
        if not path:
            print(f"rsnotify config check: give FILE or set {config.CONFIG_ENV}", file=sys.stderr)
            return 2
        problems = check(path, os.environ if args.env else None)
        for problem in problems:
            print(problem)
        if problems:
            print(f"rsnotify config check: {len(problems)} problem(s)", file=sys.stderr)
            return 1
        sections = list(config.load(path).data)
        print(_summary(path, sections))
        return 0
    return show(args.command, args.config, os.environ)


def show(command: str, path: str | None, environ: Mapping[str, str]) -> int:
    from ..cli import COMMANDS, command_parser

    names = [n for n, _, _ in COMMANDS]
    if command not in names or command == NAME:
        hint = config.suggest(command, [n for n in names if n != NAME])
        print(
            f"rsnotify config show: no configurable subcommand {command!r}{hint}", file=sys.stderr
        )
        return 2
    _, parser = command_parser(command)
    path = path or environ.get(config.CONFIG_ENV)
    try:
        file = config.load(path) if path else None
        settings = config.resolve(
            command, parser, file, environ, sections=[n for n in names if n != NAME]
        )
    except ConfigError as exc:
        print(exc)
        return 1
    source = f"{path}, the environment" if path else "the environment"
    print(f"# rsnotify {command}: options from {source} and defaults; flags still win")
    print(f"[{command}]")
    for line in config.show(parser, settings):
        print(line)
    return 0
