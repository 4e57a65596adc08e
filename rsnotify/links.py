"""HTTP ``Link`` headers (RFC 8288): parsed without any HTTP client.

Discovery reads a resource's ``Link: <...>; rel="resourcesync"`` (Z39.99
section 6.3.3) and the HTTP client hands every response's links back
resolved; neither should need the other to read a header, so the parser lives
here on its own, pure and importable from anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote

__all__ = ["has_rel", "parse_link_header"]


def parse_link_header(value: str) -> list[tuple[str, dict[str, str]]]:
    """Parse an HTTP ``Link`` header (RFC 8288) into ``(target, params)`` pairs.

    Header values come from the network, so the parser is lenient: a malformed
    link-value is skipped up to the next top-level comma and parsing continues,
    never raising.  Targets are returned as written (not resolved; see
    :meth:`rsnotify.fetch.FetchResult.links` for resolved ones).  Parameter names are
    lower-cased; the first occurrence of a parameter wins (RFC 8288 section
    3.3 for ``rel``); ``rel`` and ``rev`` values are lower-cased with their
    whitespace collapsed, so ``has_rel`` can split them.  Extended parameters
    (``title*=UTF-8''...``, RFC 8187) are decoded and stored under their
    starred name.
    """
    links: list[tuple[str, dict[str, str]]] = []
    i, n = 0, len(value)
    while i < n:
        while i < n and value[i] in " \t\r\n,":
            i += 1
        if i >= n:
            break
        if value[i] != "<":
            i = _skip_to_comma(value, i)
            continue
        end = value.find(">", i + 1)
        if end < 0:
            break
        target = value[i + 1 : end].strip()
        i = end + 1
        params: dict[str, str] = {}
        while True:
            i = _skip_ows(value, i)
            if i >= n or value[i] == ",":
                break
            if value[i] != ";":
                i = _skip_to_comma(value, i)
                break
            i = _skip_ows(value, i + 1)
            start = i
            while i < n and value[i] not in ";,= \t\r\n":
                i += 1
            name = value[start:i].lower()
            i = _skip_ows(value, i)
            param_value = ""
            if i < n and value[i] == "=":
                i = _skip_ows(value, i + 1)
                if i < n and value[i] == '"':
                    param_value, i = _quoted_string(value, i)
                else:
                    start = i
                    while i < n and value[i] not in ";, \t\r\n":
                        i += 1
                    param_value = value[start:i]
            if not name or name in params:
                continue
            if name.endswith("*"):
                param_value = _decode_ext_value(param_value)
            if name in ("rel", "rev"):
                param_value = " ".join(param_value.lower().split())
            params[name] = param_value
        links.append((target, params))
    return links


def has_rel(params: Mapping[str, str], rel: str) -> bool:
    """True when a link's space-separated ``rel`` includes ``rel`` (case-insensitive)."""
    return rel.lower() in params.get("rel", "").lower().split()


def _skip_ows(value: str, i: int) -> int:
    while i < len(value) and value[i] in " \t\r\n":
        i += 1
    return i


def _skip_to_comma(value: str, i: int) -> int:
    """Index just past the next comma outside quotes and angle brackets."""
    n = len(value)
    while i < n:
        char = value[i]
        if char == ",":
            return i + 1
        if char == '"':
            _, i = _quoted_string(value, i)
            continue
        if char == "<":
            end = value.find(">", i + 1)
            i = n if end < 0 else end + 1
            continue
        i += 1
    return n


def _quoted_string(value: str, i: int) -> tuple[str, int]:
    """Read a quoted-string starting at ``value[i] == '"'``; unterminated ends at EOS."""
    out: list[str] = []
    i += 1
    n = len(value)
    while i < n:
        char = value[i]
        if char == "\\" and i + 1 < n:
            out.append(value[i + 1])
            i += 2
            continue
        if char == '"':
            return "".join(out), i + 1
        out.append(char)
        i += 1
    return "".join(out), n


def _decode_ext_value(raw: str) -> str:
    """RFC 8187 ``charset'lang'pct-encoded``; anything else is returned unchanged."""
    charset, sep, rest = raw.partition("'")
    if not sep:
        return raw
    _lang, sep, encoded = rest.partition("'")
    if not sep:
        return raw
    try:
        return unquote(encoded, encoding=charset or "utf-8", errors="strict")
    except (LookupError, UnicodeDecodeError):
        return raw
