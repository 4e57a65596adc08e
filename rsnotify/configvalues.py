"""A declared option's value from a TOML value or an ``RSNOTIFY_*`` string.

A value goes through the option's own ``type=`` function and ``choices``
(:mod:`rsnotify.argtypes`), the very checks of the command line, so it is
refused with the same words; only the shape of the value is TOML's (an array
for a repeatable option, ``true``/``false`` for a flag).  Environment values
are strings as on a command line; a list takes one value or a TOML array, a
flag ``1/0, true/false, yes/no, on/off``.
"""

from __future__ import annotations

import argparse
import tomllib
from datetime import date, datetime, time
from typing import Any

from .errors import ValueRefused
from .options import Opt

__all__ = ["TRUE", "ValueRefused", "expected", "from_env", "from_toml", "shown_env"]

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})


def expected(opt: Opt, *, item: bool = False) -> str:
    """What a value (or, with ``item``, one element of a list) must look like."""
    if opt.kind == "flag":
        return "true or false"
    if opt.kind == "count":
        return "a non-negative integer"
    kind = opt.type
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
    return f"{text} or an array of them" if opt.kind == "list" and not item else text


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


def _call_type(opt: Opt, text: str) -> Any:
    """Convert like argparse does for a command-line string, with its messages."""
    convert = opt.type
    if convert is None:
        return text
    try:
        return convert(text)
    except argparse.ArgumentTypeError as exc:
        raise ValueRefused(str(exc)) from None
    except (TypeError, ValueError):
        name = getattr(convert, "__name__", repr(convert))
        raise ValueRefused(f"invalid {name} value: {text!r}") from None


def _check_choice(opt: Opt, value: Any) -> Any:
    if opt.choices is not None and value not in opt.choices:
        choices = ", ".join(repr(c) for c in opt.choices)
        raise ValueRefused(f"invalid choice: {value!r} (choose from {choices})")
    return value


def _word(opt: Opt, text: str) -> Any:
    return _check_choice(opt, _call_type(opt, text))


def _scalar_from_toml(opt: Opt, value: Any, *, item: bool = False) -> Any:
    if isinstance(value, str):
        return _word(opt, value)
    untyped = opt.type is None or opt.type is str
    untyped = untyped or getattr(opt.type, "expected", None) == "a string"
    if isinstance(value, int | float) and not isinstance(value, bool) and not untyped:
        # As the command line would spell it (str(inf) is "inf", which float() reads).
        return _word(opt, str(value))
    hint = " (quote it)" if untyped and isinstance(value, int | float) else ""
    raise ValueRefused(f"expected {expected(opt, item=item)}, got {_toml_kind(value)}{hint}")


def _flag_value(opt: Opt, given: bool) -> bool:
    """The dest value of a flag given (True) or not (False)."""
    return given if opt.toggle else given != opt.negative


def _check_count(opt: Opt, items: list[Any]) -> list[Any]:
    if opt.nargs == "+" and not items:
        raise ValueRefused("expected at least one value")
    if isinstance(opt.nargs, int) and opt.nargs > 1 and len(items) != opt.nargs:
        raise ValueRefused(f"expected {opt.nargs} values, got {len(items)}")
    return items


def from_toml(opt: Opt, value: Any) -> Any:
    """The dest value for a TOML value, converted and checked as argparse would."""
    if opt.kind == "flag":
        if not isinstance(value, bool):
            raise ValueRefused(f"expected true or false, got {_toml_kind(value)}")
        return _flag_value(opt, value)
    if opt.kind == "count":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueRefused(f"expected a non-negative integer, got {_toml_kind(value)}")
        return value
    if opt.kind == "list":
        items = value if isinstance(value, list) else [value]
        out = []
        for index, item in enumerate(items):
            try:
                out.append(_scalar_from_toml(opt, item, item=isinstance(value, list)))
            except ValueRefused as exc:
                where = f"item {index + 1}: " if isinstance(value, list) else ""
                raise ValueRefused(f"{where}{exc}") from None
        return _check_count(opt, out)
    return _scalar_from_toml(opt, value)


def _toml_array(text: str) -> list[Any]:
    try:
        items: list[Any] = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError as exc:
        raise ValueRefused(f"not a TOML array ({exc}): {text!r}") from None
    return items


def from_env(opt: Opt, text: str) -> Any:
    """The dest value for an environment string (flags: yes/no words; lists: TOML arrays)."""
    if opt.kind == "flag":
        word = text.strip().lower()
        if word in TRUE:
            return _flag_value(opt, True)
        if word in FALSE:
            return _flag_value(opt, False)
        raise ValueRefused(f"expected 1/0, true/false, yes/no or on/off, got {text!r}")
    if opt.kind == "count":
        if not text.strip().isdigit():
            raise ValueRefused(f"expected a non-negative integer, got {text!r}")
        return int(text)
    if opt.kind == "list":
        if text.lstrip().startswith("["):
            return from_toml(opt, _toml_array(text))
        return _check_count(opt, [_word(opt, text)])
    return _word(opt, text)


def shown_env(opt: Opt, value: Any, text: str) -> Any:
    """A TOML-able form of what a variable said (for ``config show``)."""
    if opt.kind == "flag":  # as in the file: was the flag given?
        return text.strip().lower() in TRUE
    if opt.kind == "count":
        return value
    if opt.kind == "list":
        return _toml_array(text) if text.lstrip().startswith("[") else [text]
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        return value
    return text
