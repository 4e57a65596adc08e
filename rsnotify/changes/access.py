"""How rsnotify reads a Source's documents: over HTTP, or from a directory.

Both answer the same three questions: the whole document (or "not modified"
against the validators we hold), and the bytes from an offset on (a Range
request or a file seek), so :mod:`.incremental` works the same on either.

The HTTP client (:mod:`rsnotify.fetch`, aiohttp underneath) is named here
only for type checking: :class:`HttpAccess` is handed a fetcher built
elsewhere, so a process that watches a directory never loads it (11 MB of
RSS, a fifth of a snapshot poll's 50 MB bound; ``bench.snapshot_diff``).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol, cast
from urllib.parse import unquote, urlsplit

from ..errors import FetchError, TooManyEntries
from ..sitemap import MAX_DOCUMENT_BYTES, MAX_ENTRIES_PER_DOCUMENT
from .incremental import EntryCounter

if TYPE_CHECKING:
    from ..fetch import Fetcher, FetchStream

# A streamed HTTP body stays in memory up to this size, then goes to a
# temporary file (tempfile's directory: TMPDIR): a 15 MB Resource List part
# is then hashed and parsed from the page cache, as from a directory Source.
SPOOL_IN_MEMORY = 1 << 20


@dataclass(frozen=True, slots=True)
class Fetched:
    """One read: ``body`` is the whole document, or the bytes from ``range_start`` on.

    ``file``: the whole document as an open file at its start, instead of
    ``body``, when the reader asked for it (``read(..., stream=True)``): the
    document's own file, or an HTTP body spooled as it arrived; the reader
    closes it (:meth:`close`).  A 15 MB Resource List part is then hashed
    and parsed from the page cache and never held (issue 23: a snapshot
    poll within 50 MB).
    """

    url: str
    body: bytes = b""
    etag: str | None = None
    last_modified: str | None = None
    not_modified: bool = False
    range_start: int | None = None  # set when body is a partial answer
    file: IO[bytes] | None = None

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


class DocumentAccess(Protocol):
    async def read(
        self,
        url: str,
        *,
        etag: str | None = None,
        last_modified: str | None = None,
        range_start: int | None = None,
        stream: bool = False,
    ) -> Fetched:
        """The document, or "not modified"; ``stream``: as a file where it is one."""
        ...

    def local_path(self, url: str) -> Path | None: ...


class HttpAccess:
    """Documents over HTTP with conditional GET and Range (aiohttp underneath).

    The validators handed back follow :mod:`rsnotify.validators`: a weak
    ``Last-Modified`` comes back as None, so the next read of a list written
    twice in one second is unconditional and never a wrong 304; a Range is
    asked only with a strong entity tag.  The body is read chunk by chunk and
    refused as soon as it holds more than ``max_entries`` entries (Z39.99
    section 7: 50,000 items per document), so a hostile ten-million-entry
    list costs a few megabytes, not the 50 MB byte limit.  Asked to
    ``stream``, it spools the body (:data:`SPOOL_IN_MEMORY`) and hands back
    the file: a snapshot poll never holds a part's bytes.
    """

    def __init__(
        self,
        fetcher: Fetcher,
        *,
        timeout: float = 30.0,
        max_entries: int = MAX_ENTRIES_PER_DOCUMENT,
    ) -> None:
        self._fetcher = fetcher
        self._timeout = timeout
        self._max_entries = max_entries

    async def read(
        self,
        url: str,
        *,
        etag: str | None = None,
        last_modified: str | None = None,
        range_start: int | None = None,
        stream: bool = False,
    ) -> Fetched:
        try:
            async with self._fetcher.stream(
                url,
                etag=etag,
                last_modified=last_modified,
                range_start=range_start,
                max_bytes=MAX_DOCUMENT_BYTES,
                timeout=self._timeout,
                deadline=min(self._timeout, self._fetcher.policy.deadline),
            ) as response:
                result = response.result
                if result.not_modified:
                    return Fetched(url, etag=etag, last_modified=last_modified, not_modified=True)
                if stream and not result.partial:
                    file = await self._spool(url, response)
                    return Fetched(
                        url, etag=result.etag, last_modified=result.last_modified, file=file
                    )
                body = b"".join([chunk async for chunk in self._counted(url, response)])
        except FetchError as exc:
            if range_start is not None and exc.status == 416:  # the list shrank: read it whole
                return await self.read(url)
            raise
        return Fetched(
            url,
            body=body,
            etag=result.etag,
            last_modified=result.last_modified,
            range_start=result.range_start if result.partial else None,
        )

    async def _counted(self, url: str, stream: FetchStream) -> AsyncIterator[bytes]:
        """The body's chunks, refused as soon as they hold more than ``max_entries`` entries."""
        counter = EntryCounter()
        async for chunk in stream:
            if counter.feed(chunk) > self._max_entries:
                raise TooManyEntries(
                    f"{url}: more than {self._max_entries} entries, refused while reading "
                    "(Z39.99 section 7: at most 50,000 items per document; a larger list "
                    "is split under an index)"
                )
            yield chunk

    async def _spool(self, url: str, stream: FetchStream) -> IO[bytes]:
        """The body in a temporary file at its start (gone when closed)."""
        spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)  # noqa: SIM115
        try:
            async for chunk in self._counted(url, stream):
                spool.write(chunk)
            spool.seek(0)
        except BaseException:
            spool.close()
            raise
        return cast(IO[bytes], spool)

    def local_path(self, url: str) -> Path | None:
        return None


class DirectoryAccess:
    """Documents in a local directory (the Source's document root).

    A URL maps to ``root / <its path>`` whatever its host, so a directory
    written by ``rsnotify simulate --dir`` or any static-site generator can
    be watched where it is produced.  The validator is the file's identity
    (inode, size, mtime), which changes on every atomic replace.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self._paths: dict[str, Path] = {}

    def local_path(self, url: str) -> Path:
        cached = self._paths.get(url)
        if cached is not None:
            return cached
        path = self._resolve(url)
        if len(self._paths) < 10_000:
            self._paths[url] = path
        return path

    def _resolve(self, url: str) -> Path:
        parts = urlsplit(url)
        path = unquote(parts.path if parts.scheme else url).lstrip("/")
        candidate = (self.root / path).resolve()
        if candidate != self.root and self.root not in candidate.parents:
            raise FetchError(url, f"maps outside the Source directory {self.root}")
        return candidate

    def _read(
        self, path: Path, etag: str | None, range_start: int | None, stream: bool = False
    ) -> Fetched:
        try:
            handle = open(path, "rb")  # noqa: SIM115 (handed out open when streamed)
        except FileNotFoundError:
            raise FetchError(str(path), "no such file", status=404) from None
        except OSError as exc:
            raise FetchError(str(path), str(exc)) from None
        handed_out = False
        try:
            st = os.fstat(handle.fileno())
            tag = f'"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"'
            if etag == tag:
                return Fetched(str(path), etag=tag, not_modified=True)
            if st.st_size > MAX_DOCUMENT_BYTES:
                raise FetchError(str(path), f"{st.st_size} bytes exceeds the document limit")
            if range_start is not None and range_start <= st.st_size:
                handle.seek(range_start)
                return Fetched(str(path), body=handle.read(), etag=tag, range_start=range_start)
            if stream and range_start is None:
                # The file's identity is the tag: what is read from this handle is
                # the version tagged, even if the Source replaces it meanwhile.
                handed_out = True
                return Fetched(str(path), etag=tag, file=handle)
            return Fetched(str(path), body=handle.read(), etag=tag)
        except OSError as exc:
            raise FetchError(str(path), str(exc)) from None
        finally:
            if not handed_out:
                handle.close()

    async def read(
        self,
        url: str,
        *,
        etag: str | None = None,
        last_modified: str | None = None,
        range_start: int | None = None,
        stream: bool = False,
    ) -> Fetched:
        path = self.local_path(url)
        if range_start is not None or etag is not None or stream:
            # The common watch-mode read: a stat and the appended tail, from the
            # page cache; a thread hop would cost more than the read itself.
            return self._read(path, etag, range_start, stream)
        # A whole document may be 50 MB: keep the loop free.
        return await asyncio.to_thread(self._read, path, etag, range_start)
