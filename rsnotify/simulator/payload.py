"""Resource content as a pure function of (seed, loc, version).

The simulator never stores resource bodies: it stores a version number and
regenerates the bytes on request.  Ground truth (``/_simulator/state``), the
hashes written into Change Lists, the bytes served over HTTP and the files
written with ``--dir`` therefore cannot disagree, and memory stays flat
however many resources a collection holds.

The body starts with a readable line naming the resource and version (handy
when eyeballing a mirror) and is padded with SHAKE-256 output in hex, so it is
``text/plain`` and differs between any two (seed, loc, version) triples.  The
length varies around ``mean_bytes`` (from half to one and a half times it) so
that ``length`` checks in a Destination are exercised.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

MEDIA_TYPE = "text/plain"
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Fixity:
    """What a Change List entry says about one resource version."""

    length: int
    md5: str
    sha256: str

    @property
    def hash(self) -> str:
        """The ``rs:md hash`` attribute value (md5 and sha-256, space separated)."""
        return f"md5:{self.md5} sha-256:{self.sha256}"


def _seed_bytes(seed: int, loc: str, version: int) -> bytes:
    return f"{seed}\x00{loc}\x00{version}".encode()


def body_length(seed: int, loc: str, version: int, mean_bytes: int) -> int:
    """The body length for this version: deterministic, within [mean/2, 3*mean/2]."""
    if mean_bytes <= 0:
        return 0
    spread = mean_bytes + 1
    digest = hashlib.blake2b(_seed_bytes(seed, loc, version), digest_size=8).digest()
    return mean_bytes // 2 + int.from_bytes(digest, "big") % spread


LARGE_CACHE_BYTES = 256 * 1024  # bodies above this get a small cache of their own


def is_large(loc: str, every: int) -> bool:
    """Whether ``loc`` is one of the one-in-``every`` large resources (by its digest)."""
    digest = hashlib.blake2b(loc.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % every == 0


def body(seed: int, loc: str, version: int, mean_bytes: int) -> bytes:
    """The exact bytes of ``loc`` at ``version``.

    Cached because the same version is typically hashed once when the change
    happens and then fetched by every Destination right after the notification;
    large bodies have a cache of their own, so a few of them cannot hold
    gigabytes.
    """
    if mean_bytes > LARGE_CACHE_BYTES:
        return _large_body(seed, loc, version, mean_bytes)
    return _body(seed, loc, version, mean_bytes)


@lru_cache(maxsize=8)
def _large_body(seed: int, loc: str, version: int, mean_bytes: int) -> bytes:
    return _make(seed, loc, version, mean_bytes)


@lru_cache(maxsize=4096)
def _body(seed: int, loc: str, version: int, mean_bytes: int) -> bytes:
    return _make(seed, loc, version, mean_bytes)


def _make(seed: int, loc: str, version: int, mean_bytes: int) -> bytes:
    length = body_length(seed, loc, version, mean_bytes)
    if length == 0:
        return b""
    head = f"{loc} version {version}\n".encode()
    if len(head) >= length:
        return head[:length]
    pad = length - len(head)
    filler = hashlib.shake_256(_seed_bytes(seed, loc, version)).hexdigest((pad + 1) // 2)
    return head + filler[:pad].encode("ascii")


def fixity(seed: int, loc: str, version: int, mean_bytes: int) -> Fixity:
    """Length and digests of ``loc`` at ``version``."""
    data = body(seed, loc, version, mean_bytes)
    return Fixity(
        length=len(data),
        md5=hashlib.md5(data, usedforsecurity=False).hexdigest(),
        sha256=hashlib.sha256(data).hexdigest(),
    )
