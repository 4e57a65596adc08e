"""Fixity (ResourceSync section 7): hashing stored bytes and checking them as advertised.

Pure but for :func:`digest_if_equal`, which reads a file.  The mirror never
replaces a file with bytes that fail these checks.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from ...model import DIGEST_SIZES, normalize_digest
from .errors import FixityMismatch

__all__ = [
    "DEFAULT_ALGORITHMS",
    "HASHLIB_NAMES",
    "Written",
    "checkable",
    "digest_if_equal",
    "known_algorithms",
    "verify",
]

log = logging.getLogger("rsnotify.subscribe")

#: hash attribute names (ResourceSync section 7) -> hashlib constructors.
HASHLIB_NAMES = {"md5": "md5", "sha-1": "sha1", "sha-256": "sha256", "sha-512": "sha512"}
DEFAULT_ALGORITHMS = ("md5", "sha-256")


class Written(NamedTuple):
    """What a write stored: byte count and hex digests by algorithm."""

    length: int
    digests: dict[str, str]


def known_algorithms(
    algorithms: Iterable[str], expected: Mapping[str, str], path: Path | str
) -> list[str]:
    """The hash algorithms to compute (asked for or advertised), unknown ones logged and skipped."""
    known = []
    for algo in dict.fromkeys(a.lower() for a in (*algorithms, *expected)):
        if algo in HASHLIB_NAMES:
            known.append(algo)
        else:
            log.warning("cannot verify unknown hash algorithm %r for %s", algo, path)
    return known


_MAX_REPORTED = 4096  # unverifiable digests remembered, so each is reported once


def checkable(
    expected_hashes: Mapping[str, str] | None,
    path: Path | str,
    reported: dict[tuple[str, str, str], None],
) -> dict[str, str]:
    """The advertised digests that can be verified, as lowercase hex by algorithm.

    Hex and base64 digests both verify (:func:`rsnotify.model.normalize_digest`).
    A digest of a known algorithm in neither form can never match any body:
    comparing it anyway failed every fetch and retried forever.  It is left
    out of the check and reported once per resource and digest, as an error
    naming the rule (section 7: "a hex-encoded digest"); the other digests and
    the length are still verified.  Unknown algorithms pass through, for
    :func:`known_algorithms` to log and skip.
    """
    out: dict[str, str] = {}
    for algo, digest in (expected_hashes or {}).items():
        algo = algo.lower()
        if algo not in DIGEST_SIZES:
            out[algo] = digest
            continue
        normal = normalize_digest(algo, digest)
        if normal is not None:
            out[algo] = normal
            continue
        key = (str(path), algo, digest)
        if key not in reported:
            if len(reported) >= _MAX_REPORTED:
                reported.pop(next(iter(reported)))
            reported[key] = None
            log.error(
                "%s: advertised %s digest %r is neither hex nor base64 of a %d-byte digest "
                "(Z39.99 section 7: hash values are hex-encoded); not verified by it",
                path,
                algo,
                digest[:200],
                DIGEST_SIZES[algo],
                extra={"path": str(path), "outcome": "unverifiable_digest"},
            )
    return out


def digest_if_equal(path: Path, length: int | None, expected: Mapping[str, str]) -> str | None:
    """sha-256 of the regular file at ``path`` if its bytes match ``expected`` (hex)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or (length is not None and info.st_size != length):
            return None
        digests = {algo: hashlib.new(HASHLIB_NAMES[algo]) for algo in {*expected, "sha-256"}}
        while chunk := handle.read(1 << 20):
            for digest in digests.values():
                digest.update(chunk)
    if any(digests[algo].hexdigest() != value for algo, value in expected.items()):
        return None
    return digests["sha-256"].hexdigest()


def verify(
    path: Path | str,
    length: int,
    digests: Mapping[str, str],
    expected_length: int | None,
    expected: Mapping[str, str],
) -> None:
    """Raise :class:`FixityMismatch` unless ``length`` and ``digests`` are as advertised."""
    mismatched = {
        algo: (want, digests[algo])
        for algo, want in expected.items()
        if algo in digests and digests[algo] != want
    }
    if (expected_length is not None and length != expected_length) or mismatched:
        problems = [f"{a} {got} != advertised {want}" for a, (want, got) in mismatched.items()]
        if expected_length is not None and length != expected_length:
            problems.insert(0, f"length {length} != advertised {expected_length}")
        raise FixityMismatch(
            f"{path}: {'; '.join(problems)}",
            path=path,
            length=length,
            expected_length=expected_length,
            mismatched=mismatched,
        )
