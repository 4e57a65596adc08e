"""``rsnotify config check|show``: validate a configuration file; print effective options.

``check`` validates every section of a file against the declared options of
the subcommands, so it accepts exactly what ``rsnotify <command> --config FILE``
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
from ..options import Options

NAME = "config"
HELP = "check a configuration file against every subcommand; show the effective options"
# No OPTIONS: this command reads configuration files; it is not configured by one.


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check",
        help="validate every section of FILE; exit 1 with one line per problem",
        description="Validate every section of a TOML configuration file against the "
        "subcommands' own options.",
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


def _declared() -> dict[str, Options]:
    """Every configurable subcommand's declared options."""
    from ..cli import configurable

    return configurable()


def _check_common(
    file: config.ConfigFile,
    table: Mapping[str, object],
    declared: Mapping[str, Options],
    problems: list[Problem],
) -> None:
    """[common] keys must mean something to at least one subcommand, and be valid for each."""
    per_command = {name: config.options(opts) for name, opts in declared.items()}
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
    declared = _declared()
    problems: list[Problem] = []
    tables = config.file_sections(file, declared, problems)
    for section, table in tables.items():
        if section == COMMON:
            _check_common(file, table, declared, problems)
        else:
            opts = config.options(declared[section])
            config.table_settings(file, section, table, opts, problems, strict=True)
    if environ is not None:
        problems += check_environment(environ, declared)
    return config.in_order(problems)


def check_environment(
    environ: Mapping[str, str], declared: Mapping[str, Options] | None = None
) -> list[Problem]:
    declared = _declared() if declared is None else declared
    problems: list[Problem] = []
    common_seen: set[str] = set()
    for name, command_options in declared.items():
        opts = config.options(command_options)
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
    declared = _declared()
    if command not in declared:
        hint = config.suggest(command, declared)
        print(
            f"rsnotify config show: no configurable subcommand {command!r}{hint}", file=sys.stderr
        )
        return 2
    path = path or environ.get(config.CONFIG_ENV)
    try:
        file = config.load(path) if path else None
        settings = config.resolve(command, declared[command], file, environ, sections=declared)
    except ConfigError as exc:
        print(exc)
        return 1
    source = f"{path}, the environment" if path else "the environment"
    print(f"# rsnotify {command}: options from {source} and defaults; flags still win")
    print(f"[{command}]")
    for line in config.show(declared[command], settings, environ):
        print(line)
    return 0
