"""Where each ``loc`` lives in the mirror, and back: a pure URI <-> path mapping.

:func:`path_for` maps a resource URI to a path strictly inside the mirror
root and :func:`loc_for` maps it back; any URI that cannot be mapped safely
is refused.  Nothing here touches the filesystem.

Path mapping (``root/<scheme>/<host>[_<port>]/<segment>/.../<leaf>``)
--------------------------------------------------------------------

The mapping is injective on URIs up to RFC 3986 equivalence (so ``%7E`` and
``~``, ``%C3%BC`` and a raw ``ü``, ``HOST`` and ``host``, ``:80`` and no port
name one file), and every path it produces decodes back to its URI
(:func:`loc_for`).  Two different resources therefore never share a file.

* ``<scheme>`` is ``http`` or ``https``.  It is a directory of its own rather
  than being dropped because ``http://h/x`` and ``https://h/x`` are different
  URIs (and may be different servers); any other scheme is refused.
* ``<host>`` is the lower-case IDNA (punycode) host, IPv6 literals in brackets.
  The port is appended as ``_<port>`` only when it is not the scheme's default.
  ``_`` inside a host is written ``%5F`` so the port separator is unambiguous.
* Each path segment is percent-*decoded* and stored under its real name, so
  spaces, ``&``, combining marks and emoji appear as themselves.  Only these
  are escaped as ``%XX`` (upper-case hex): ``%`` itself, ``/`` (so ``a%2Fb`` is
  one file named ``a%2Fb``, never a directory), ASCII control characters, and
  bytes that are not UTF-8.
* A trailing ``/`` (and the empty path) maps to a leaf named ``%index``; a
  query maps into the leaf name after ``%3F``: ``name?q=1`` -> ``name%3Fq=1``
  (the query is kept as sent, its ``%`` and ``/`` escaped).  A literal ``?`` in
  a segment (``name%3Fq``) stays ``?``, so the two never collide.  Fragments
  are dropped: they are never sent to a server.
* Names that start with ``%`` followed by a non-hex letter (``%index``,
  ``%tmp.``) can never come from a URI, because a real ``%`` is always written
  ``%25``.  The mirror keeps those names for itself.

Refused with :class:`UnsafePath`: schemes other than http(s), URIs without a
host or with user info, hosts with characters no DNS name or IP literal has,
segments that decode to ``.`` or ``..`` (also spelt ``%2e%2e``), empty segments
other than the trailing one (``a//b`` would alias ``a/b`` on disk), NUL,
backslash, raw control characters in the URI, file names over 255 bytes and
paths over 4,095 bytes (Linux limits).

The mirror assumes a case-sensitive filesystem that does not normalise Unicode
(ext4, xfs, btrfs).  On case-insensitive or normalising filesystems (default
macOS and Windows) distinct URIs can share a file.

A resource ``http://h/a`` and a resource under ``http://h/a/`` cannot both
exist on a filesystem (``a`` cannot be a file and a directory); whichever
arrives second is refused with :class:`PathConflict`.  No naming trick avoids
this without making every ordinary path unnatural.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from urllib.parse import quote, unquote_to_bytes, urlsplit

import yarl

from .errors import MirrorError, UnsafePath

__all__ = ["INDEX_NAME", "TEMP_PREFIX", "loc_for", "path_for", "relative_names"]

INDEX_NAME = "%index"
#: Temp files the mirror makes start so (never a name :func:`path_for` gives: a
#: real ``%`` is always written ``%25``).
TEMP_PREFIX = "%tmp."
QUERY_MARK = "%3F"
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4095
DEFAULT_PORTS = {"http": 80, "https": 443}
_HOST = re.compile(r"[a-z0-9._-]+")
_IPV6 = re.compile(r"[0-9a-f:.]+")
_HEX = frozenset("0123456789ABCDEF")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Characters _escape rewrites (surrogates stand for undecodable bytes).
_ESCAPED = re.compile(r"[%/\x00-\x1f\x7f\udc80-\udcff]")
PATH_CACHE_SIZE = 16_384  # loc -> path answers kept (a catch-up asks once per change)
# A loc whose mirror names are its own text: lower-case http(s), an authority
# without user info or brackets, segments of characters that need no decoding or
# escaping (RFC 3986 unreserved, sub-delims, ":" and "@": no "%", "\\", controls
# or non-ASCII), no empty segment but the last, no query, no fragment.  Groups:
# scheme, authority, the directory ("" or "/a/b"), the leaf ("" for a trailing "/").
_PLAIN_SEGMENT = r"[A-Za-z0-9._~!$&'()*+,;=:@-]"
_PLAIN_LOC = re.compile(
    rf"(https?)://([A-Za-z0-9.:_-]+)((?:/{_PLAIN_SEGMENT}+)*)/({_PLAIN_SEGMENT}*)\Z"
)
# Safe in a URI path segment (RFC 3986 pchar minus pct-encoded); quote() adds
# the unreserved set itself.
_PCHAR_SAFE = "!$&'()*+,;=:@"


# --- pure mapping -----------------------------------------------------------------


def _escape(raw: bytes, *, extra: str = "") -> str:
    """A file name for the bytes ``raw``: UTF-8 text as itself, the rest as ``%XX``."""
    text = raw.decode("utf-8", errors="surrogateescape")
    if not extra and not _ESCAPED.search(text):
        return text  # the common case: nothing to rewrite
    out: list[str] = []
    for char in text:
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, smuggled by surrogateescape
            out.append(f"%{code - 0xDC00:02X}")
        elif char in "%/" or char in extra or code < 0x20 or code == 0x7F:
            out.append("".join(f"%{b:02X}" for b in char.encode()))
        else:
            out.append(char)
    return "".join(out)


def _unescape(name: str) -> bytes:
    """Inverse of :func:`_escape`; raises ValueError on names it could not have made."""
    out = bytearray()
    i = 0
    while i < len(name):
        char = name[i]
        if char == "%":
            pair = name[i + 1 : i + 3]
            if len(pair) != 2 or not set(pair) <= _HEX:
                raise ValueError(f"{name!r} is not a mirror file name")
            out.append(int(pair, 16))
            i += 3
        else:
            out += char.encode("utf-8", errors="surrogateescape")
            i += 1
    return bytes(out)


def _host_dir(loc: str, scheme: str, netloc: str) -> str:
    host, problem = _host_dir_of(scheme, netloc)
    if problem is not None:
        raise UnsafePath(f"{loc!r}: {problem}")
    return host


@functools.lru_cache(maxsize=1024)
def _host_dir_of(scheme: str, netloc: str) -> tuple[str, str | None]:
    """The host directory of ``scheme://netloc`` (or why there is none), memoized.

    It depends on the scheme and authority only (yarl reads host, port and
    user info from nothing else), and a catch-up maps thousands of URIs on
    one or two hosts: parsing each whole URL again was a third of mapping it.
    """
    try:
        url = yarl.URL(f"{scheme}://{netloc}/")
        raw_host = (url.raw_host or "").lower()
        port = url.port
        user = url.raw_user
    except (ValueError, TypeError, UnicodeError) as exc:
        return "", f"invalid host or port ({exc})"
    if user is not None:
        return "", "user info in a resource URI is not mirrored"
    if ":" in raw_host:
        if not _IPV6.fullmatch(raw_host):
            return "", "invalid IPv6 host"
        host = f"[{raw_host}]"
    elif not _HOST.fullmatch(raw_host) or set(raw_host) == {"."}:
        return "", f"invalid host {raw_host!r}"
    else:
        host = raw_host.replace("_", "%5F")
    if port is not None and port != DEFAULT_PORTS[scheme]:
        host = f"{host}_{port}"
    return host, None


def _segment_name(segment: str, loc: str) -> str:
    raw = unquote_to_bytes(segment)
    if raw in (b".", b".."):
        raise UnsafePath(f"{loc!r}: a path segment decodes to {raw.decode()!r}")
    if b"\x00" in raw:
        raise UnsafePath(f"{loc!r}: a path segment contains NUL")
    if b"\\" in raw:
        raise UnsafePath(f"{loc!r}: a path segment contains a backslash")
    return _escape(raw)


def _check_name(name: str, loc: str) -> None:
    if len(name.encode("utf-8", errors="surrogateescape")) > MAX_NAME_BYTES:
        raise UnsafePath(f"{loc[:200]!r}: a file name would exceed {MAX_NAME_BYTES} bytes")


def path_for(loc: str, root: Path) -> Path:
    """The mirror path of ``loc`` under ``root`` (see the module docstring for the rules).

    Raises :class:`UnsafePath` for any URI that cannot be mapped safely.  Pure:
    the filesystem is not consulted (symlinks are :mod:`.safedirs`' business),
    so answers are memoized: a catch-up maps the same few thousand URIs tens of
    thousands of times.  Refusals are not memoized (they raise).
    """
    if not isinstance(loc, str):
        raise UnsafePath(f"{loc!r}: not a URI")
    if not loc.isascii():
        try:
            loc.encode()
        except UnicodeEncodeError:
            # No XML document holds one and the payload decoder refuses them; a
            # library caller might still pass one: a refusal, not a crash.
            raise UnsafePath(
                f"{loc[:200]!r}: not a URI (a lone surrogate is not a character, RFC 3629)"
            ) from None
    return _path_for(loc, root if isinstance(root, Path) else Path(root))


@functools.lru_cache(maxsize=PATH_CACHE_SIZE)
def _path_for(loc: str, root: Path) -> Path:
    """The short way for a loc in the common form (:data:`_PLAIN_LOC`), else the general one.

    A catch-up maps thousands of new locs, nearly all plain ASCII under a few
    directories; the general way decodes and checks every segment of each
    (~11 us).  Here the directory is vetted once (:func:`_plain_dir`) and only
    the leaf per loc.  Anything the short way is not sure of (a ``.``/``..``
    segment, a name or path over the limits, a host the general way refuses)
    takes the general way, which refuses it with its own message: the answer
    is the general way's, property-tested (``tests/test_mirror.py``).
    """
    plain = _PLAIN_LOC.match(loc)
    if plain is not None:
        scheme, netloc, directory, leaf = plain.groups()
        parent = _plain_dir(root, scheme, netloc, directory)
        if parent is not None and leaf not in (".", ".."):
            name = leaf or INDEX_NAME
            directory_path, directory_bytes = parent
            # Plain names are ASCII: one character, one byte.
            if len(name) <= MAX_NAME_BYTES and directory_bytes + 1 + len(name) <= MAX_PATH_BYTES:
                return directory_path / name
    return _path_for_general(loc, root)


@functools.lru_cache(maxsize=1024)
def _plain_dir(root: Path, scheme: str, netloc: str, directory: str) -> tuple[Path, int] | None:
    """The mirror directory of a plain loc's ``directory`` and its length in bytes, or None.

    None when any of its names is one the general way refuses (or the host is):
    the loc then takes the general way.  Pure, so memoized: a catch-up's new
    locs sit in a few directories.
    """
    host, problem = _host_dir_of(scheme, netloc)
    if problem is not None:
        return None
    names = [scheme, host, *directory[1:].split("/")] if directory else [scheme, host]
    if any(name in (".", "..") or len(name) > MAX_NAME_BYTES for name in names):
        return None  # the host is ASCII (IDNA), the plain segments too
    text = os.path.join(root, *names)
    return Path(text), len(os.fsencode(text))


def _path_for_general(loc: str, root: Path) -> Path:
    """:func:`path_for` for any loc: every rule of the module docstring, one by one."""
    if not isinstance(loc, str) or not loc:
        raise UnsafePath(f"{loc!r}: not a URI")
    if _CONTROL.search(loc):
        # urlsplit silently deletes tabs and newlines, which would alias URIs.
        raise UnsafePath(f"{loc[:200]!r}: control characters in a URI")
    try:
        parts = urlsplit(loc)
    except ValueError as exc:
        raise UnsafePath(f"{loc[:200]!r}: not a URI ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise UnsafePath(f"{loc[:200]!r}: only http and https resources are mirrored")
    if not parts.netloc:
        raise UnsafePath(f"{loc[:200]!r}: no host")
    names = [scheme, _host_dir(loc, scheme, parts.netloc)]
    path = parts.path or "/"
    if not path.startswith("/"):
        raise UnsafePath(f"{loc[:200]!r}: relative path")
    segments = path[1:].split("/")
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "":
            if not last:
                raise UnsafePath(f"{loc[:200]!r}: empty path segment (would alias)")
            names.append(INDEX_NAME)
        else:
            names.append(_segment_name(segment, loc))
    if parts.query or loc.split("#", 1)[0].endswith("?"):
        names[-1] += QUERY_MARK + _escape(parts.query.encode("utf-8", errors="surrogateescape"))
    for name in names[1:]:
        _check_name(name, loc)
    # One string, parsed once into a Path (joinpath parsed the root and every name
    # again): no name holds a "/" or is empty, "." or "..", so this is the same path.
    text = os.path.join(root, *names)
    if len(os.fsencode(text)) > MAX_PATH_BYTES:
        raise UnsafePath(f"{loc[:200]!r}: the mirror path would exceed {MAX_PATH_BYTES} bytes")
    return Path(text)


@functools.lru_cache(maxsize=PATH_CACHE_SIZE)
def relative_names(path: Path, root: Path) -> tuple[str, ...]:
    """The names of ``path`` below ``root``, vetted; memoized like :func:`path_for`.

    Pure (no filesystem), and asked once per write and delete for paths that
    :func:`path_for` handed out, where pathlib's work is most of the cost.
    """
    try:
        names = path.relative_to(root).parts
    except ValueError:
        raise UnsafePath(f"{path} is not inside the mirror root {root}") from None
    if not names or any(n in ("", ".", "..") for n in names):
        raise UnsafePath(f"{path} is not a file path inside the mirror root", path=path)
    return names


def loc_for(path: Path | str, root: Path) -> str:
    """The URI whose mirror path is ``path`` (the inverse of :func:`path_for`).

    The URI comes back in a normal form (percent-encoded UTF-8, upper-case hex,
    default port omitted), so ``path_for(loc_for(p), root) == p``.  Raises
    :class:`MirrorError` for a path the mapping cannot have produced.
    """
    try:
        names = Path(path).relative_to(root).parts
    except ValueError:
        raise MirrorError(f"{path} is not inside the mirror root {root}", path=path) from None
    if len(names) < 3 or names[0] not in DEFAULT_PORTS:
        raise MirrorError(f"{path} is not a mirrored resource path", path=path)
    try:
        scheme, host_dir, *segments = names
        host, sep, port = host_dir.rpartition("_")
        if not sep:
            host, port = host_dir, ""
        elif not port.isdigit():
            raise ValueError(host_dir)
        host = _unescape(host).decode("ascii")
        leaf, mark, query = segments[-1].partition(QUERY_MARK)
        segments[-1] = leaf
        pieces = []
        for i, name in enumerate(segments):
            if name == INDEX_NAME and i == len(segments) - 1:
                pieces.append("")
            elif name.startswith("%") and not set(name[1:3]) <= _HEX:
                raise ValueError(name)
            else:
                pieces.append(quote(_unescape(name), safe=_PCHAR_SAFE))
        uri = f"{scheme}://{host}{':' + port if port else ''}/" + "/".join(pieces)
        if mark:
            uri += "?" + _unescape(query).decode("utf-8", errors="surrogateescape")
    except (ValueError, UnicodeError):
        raise MirrorError(f"{path} is not a mirrored resource path", path=path) from None
    return uri
