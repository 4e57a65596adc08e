"""The ``rsnotify`` command line.

Each subcommand lives in its own module exposing ``NAME``, ``HELP``, its
declared ``OPTIONS`` (:mod:`rsnotify.options`) and ``run(args) -> int``;
modules are imported only when their subcommand runs, so ``rsnotify --help``
stays fast and one broken optional dependency cannot take down every command.
``rsnotify config``, which reads configuration rather than being configured,
has subcommands of its own and builds its parser in ``configure(parser)``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import NoReturn

from . import __version__, config, options
from .runtime import tune_gc

# (subcommand name, module, one-line help). Order is the order shown in --help.
COMMANDS: list[tuple[str, str, str]] = [
    ("inspect", "rsnotify.commands.inspect", "read a ResourceSync document and describe it"),
    ("simulate", "rsnotify.simulator.command", "serve a changing ResourceSync Source over HTTP"),
    ("publish", "rsnotify.publisher.command", "watch a Source; log and push every new entry"),
    ("subscribe", "rsnotify.subscriber.command", "mirror a Source: baseline, push, catch-up"),
    ("audit", "rsnotify.commands.audit", "compare a mirror with the Source's Resource List"),
    ("dashboard", "rsnotify.dashboard.command", "live page, JSON API and /metrics of telemetry"),
    ("config", "rsnotify.commands.config", "check a configuration file; show effective options"),
]


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser whose every refusal is one line on stderr, exit status 2.

    argparse would print the whole usage (a dozen lines for ``publish``) above
    the one line that says what is wrong; an operator reading a journal
    needs only that line, and ``--help`` is named for the rest.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, str]]:
    parser = argparse.ArgumentParser(
        prog="rsnotify",
        description="Push notifications for ResourceSync (ANSI/NISO Z39.99).",
    )
    parser.add_argument("--version", action="version", version=f"rsnotify {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules: dict[str, str] = {}
    for name, module, help_text in COMMANDS:
        modules[name] = module
        sub.add_parser(name, help=help_text, add_help=False)
    return parser, modules


def command_module(name: str) -> ModuleType:
    """A subcommand's module (imported now)."""
    return importlib.import_module(dict((n, m) for n, m, _ in COMMANDS)[name])


def configurable() -> dict[str, options.Options]:
    """Every subcommand configured by files and variables, with its declared options."""
    found: dict[str, options.Options] = {}
    for name, _, _ in COMMANDS:
        declared = getattr(command_module(name), "OPTIONS", None)
        if declared is not None:
            found[name] = declared
    return found


def parse_command(
    name: str, argv: Sequence[str], environ: Mapping[str, str] | None = None
) -> tuple[ModuleType, argparse.Namespace]:
    """Parse a subcommand's arguments over its --config file and RSNOTIFY_* variables.

    The configuration layer (:mod:`rsnotify.config`) applies to every
    subcommand that declares ``OPTIONS``, from that declaration alone.
    """
    module = command_module(name)
    parser = CommandParser(prog=f"rsnotify {name}", description=module.HELP)
    declared = getattr(module, "OPTIONS", None)
    if declared is None:
        module.configure(parser)
        return module, parser.parse_args(list(argv))
    sections = [n for n, _, _ in COMMANDS if n != "config"]  # `config` reads no [config]
    env = os.environ if environ is None else environ
    return module, config.parse_args(declared, parser, name, argv, environ=env, sections=sections)


def is_batch(args: argparse.Namespace) -> bool:
    """A run that ends when its work is done, with no latency to keep (``--once``)."""
    return bool(getattr(args, "once", False))


def main(argv: Sequence[str] | None = None) -> int:
    argv_given = argv
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, modules = build_parser()
    if not argv or argv[0] not in modules:
        args = parser.parse_args(argv)  # prints help / version / usage errors
        parser.print_help()
        return 2
    name = argv[0]
    try:
        module, args = parse_command(name, argv[1:])
    except config.ConfigError as exc:
        print(f"rsnotify {name}: configuration error:\n{exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help, or a refused argument (already printed): its status
        return exc.code if isinstance(exc.code, int) else 2
    if argv_given is None:  # the program itself, not a caller embedding the CLI
        tune_gc(batch=is_batch(args))
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
