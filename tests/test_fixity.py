"""Fixity in the forms Sources write: hex (section 7) and base64 (older resync, the Cornell
simulator), for md5, sha-1 and sha-256; a digest in neither form is reported once and never
retried (issue 17, item 4).

The property tests drive :func:`rsnotify.model.parse_hashes` with digests hashlib computes
itself, in every spelling; the mirror and applier tests check the same digests against real
bytes on a real HTTP server.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from rsnotify.envelope import Notification
from rsnotify.fetch import Fetcher
from rsnotify.metrics import serving
from rsnotify.model import DIGEST_SIZES, ChangeType, is_checkable, normalize_digest, parse_hashes
from rsnotify.subscriber.applier import Applier, Outcome
from rsnotify.subscriber.mirror import FixityMismatch, Mirror
from rsnotify.subscriber.resources import ResourceStore

HASHLIB = {"md5": hashlib.md5, "sha-1": hashlib.sha1, "sha-256": hashlib.sha256}
ALGOS = sorted(HASHLIB)

Spelling = Callable[[bytes], str]
SPELLINGS: dict[str, Spelling] = {
    "hex": lambda raw: raw.hex(),
    "HEX": lambda raw: raw.hex().upper(),
    "base64": lambda raw: base64.b64encode(raw).decode(),
    "base64 unpadded": lambda raw: base64.b64encode(raw).decode().rstrip("="),
    "base64 url-safe": lambda raw: base64.urlsafe_b64encode(raw).decode(),
}


@settings(max_examples=200, deadline=None)
@given(
    body=st.binary(max_size=256),
    algos=st.lists(st.sampled_from(ALGOS), min_size=1, max_size=3, unique=True),
    spellings=st.lists(st.sampled_from(sorted(SPELLINGS)), min_size=3, max_size=3),
    algo_case=st.booleans(),
)
def test_every_spelling_of_a_digest_reads_as_its_hex(
    body: bytes, algos: list[str], spellings: list[str], algo_case: bool
) -> None:
    tokens = []
    for algo, spelling in zip(algos, spellings, strict=False):
        name = algo.upper() if algo_case else algo
        tokens.append(f"{name}:{SPELLINGS[spelling](HASHLIB[algo](body).digest())}")
    parsed = parse_hashes(" \n".join(tokens))
    assert parsed == {algo: HASHLIB[algo](body).hexdigest() for algo in algos}
    assert all(is_checkable(algo, digest) for algo, digest in parsed.items())


@settings(max_examples=300, deadline=None)
@given(algo=st.sampled_from(sorted(DIGEST_SIZES)), text=st.text(max_size=100))
def test_any_text_is_either_a_digest_of_the_right_size_or_refused(algo: str, text: str) -> None:
    """Nothing in between: a result is always lowercase hex of the algorithm's size, and
    equals the bytes the text spells (as hex or as base64)."""
    normal = normalize_digest(algo, text)
    if normal is None:
        return
    size = DIGEST_SIZES[algo]
    assert is_checkable(algo, normal)
    raw = bytes.fromhex(normal)
    stripped = text.strip()
    spelled = {stripped.lower()} | {
        base64.b64encode(raw).decode().rstrip("="),
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
    }
    assert stripped.lower() == normal or stripped.rstrip("=") in spelled
    assert len(raw) == size


@pytest.mark.parametrize(
    "digest",
    ["r2d2", "", "0" * 31, "0" * 33, "E+0tzxHYD0ohNZG+DFqXrA=", "E+0tzxHYD0ohNZG+DFqXr!==", "é"],
)
def test_digests_in_neither_form_are_kept_as_written_and_not_checkable(digest: str) -> None:
    token = f"md5:{digest}" if digest else "md5:"
    parsed = parse_hashes(token)
    if not digest:
        assert parsed == {}  # "md5:" carries no digest at all
        return
    assert parsed == {"md5": digest}
    assert not is_checkable("md5", parsed["md5"])


def test_the_corpus_base64_md5_is_the_hex_of_the_same_bytes() -> None:
    """resync-client's captured simulator Change List writes md5 in base64 (section 7 says hex)."""
    assert parse_hashes("md5:E+0tzxHYD0ohNZG+DFqXrA==") == {
        "md5": "13ed2dcf11d80f4a213591be0c5a97ac"
    }


def test_unknown_algorithms_pass_through_unchanged() -> None:
    assert parse_hashes("whirlpool:AbC= md5:" + "A" * 32) == {
        "whirlpool": "AbC=",
        "md5": "a" * 32,
    }


# --- the mirror verifies every form, and reports an unusable digest once ------------------


@settings(max_examples=25, deadline=None)
@given(body=st.binary(max_size=64), spelling=st.sampled_from(sorted(SPELLINGS)))
async def test_the_mirror_verifies_base64_and_hex_alike(
    tmp_path_factory: pytest.TempPathFactory, body: bytes, spelling: str
) -> None:
    mirror = Mirror(tmp_path_factory.mktemp("mirror"))
    advertised = " ".join(
        f"{algo}:{SPELLINGS[spelling](HASHLIB[algo](body).digest())}" for algo in ALGOS
    )
    path = mirror.path_for("http://s/res")
    written = await mirror.write_bytes(path, body, expected_hashes=parse_hashes(advertised))
    assert written.length == len(body)
    assert path.read_bytes() == body
    wrong = parse_hashes(f"sha-1:{SPELLINGS[spelling](hashlib.sha1(body + b'!').digest())}")
    with pytest.raises(FixityMismatch):
        await mirror.write_bytes(path, body, expected_hashes=wrong)


async def test_an_unusable_digest_is_one_error_and_the_other_checks_still_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mirror = Mirror(tmp_path / "mirror")
    path = mirror.path_for("http://s/res")
    sha = hashlib.sha256(b"body").hexdigest()
    expected = parse_hashes(f"md5:r2d2 sha-256:{sha}")
    with caplog.at_level(logging.ERROR, logger="rsnotify.subscribe"):
        for _ in range(3):
            await mirror.write_bytes(path, b"body", expected_hashes=expected)
        with pytest.raises(FixityMismatch, match="sha-256"):
            await mirror.write_bytes(path, b"other", expected_hashes=expected)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert "'r2d2'" in errors[0] and "section 7" in errors[0], errors[0]
    assert path.read_bytes() == b"body"


# --- through the applier: applied once, fetched once ------------------------------------


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, list[str], dict[str, bytes]]]:
    files: dict[str, bytes] = {}
    requests: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        requests.append(request.path)
        if request.path not in files:
            raise web.HTTPNotFound()
        return web.Response(body=files[request.path])

    app = web.Application()
    app.router.add_get("/{path:.*}", handle)
    async with serving(app) as base:
        yield base, requests, files


@pytest.mark.parametrize(
    ("advertised", "outcome", "fetches"),
    [
        ("md5:{b64md5}", Outcome.APPLIED, 1),
        ("sha-1:{b64sha1} sha-256:{b64sha256}", Outcome.APPLIED, 1),
        ("md5:r2d2", Outcome.APPLIED, 1),  # unverifiable: reported, not retried
        ("md5:{b64wrong}", Outcome.HASH_MISMATCH, 3),  # a real mismatch is retried
    ],
)
async def test_applier_fetches_once_whatever_form_the_digest_has(
    tmp_path: Path,
    served: tuple[str, list[str], dict[str, bytes]],
    caplog: pytest.LogCaptureFixture,
    advertised: str,
    outcome: Outcome,
    fetches: int,
) -> None:
    base, requests, files = served
    body = b"a resource\n"
    files["/res"] = body

    def b64(digest: bytes) -> str:
        return base64.b64encode(digest).decode()

    hashes = advertised.format(
        b64md5=b64(hashlib.md5(body).digest()),
        b64sha1=b64(hashlib.sha1(body).digest()),
        b64sha256=b64(hashlib.sha256(body).digest()),
        b64wrong=b64(hashlib.md5(b"not the body").digest()),
    )
    store = ResourceStore(tmp_path / "resources.sqlite")
    try:
        async with Fetcher() as fetcher:
            applier = Applier(
                Mirror(tmp_path / "mirror"),
                store,
                fetcher,
                allowed_origins=[base],
                retries=2,
                backoff_initial=0.001,
                backoff_max=0.002,
            )
            change = Notification(
                collection="c",
                seq=1,
                capabilitylist=f"{base}/capabilitylist.xml",
                changelist=f"{base}/changelist.xml",
                loc=f"{base}/res",
                change=ChangeType.CREATED,
                datetime=datetime(2024, 1, 1, tzinfo=UTC),
                hash=hashes,
            )
            with caplog.at_level(logging.ERROR, logger="rsnotify.subscribe"):
                assert await applier.apply(change) is outcome
    finally:
        await store.close()
    assert requests == ["/res"] * fetches
    unverifiable = [r for r in caplog.records if "neither hex nor base64" in r.getMessage()]
    assert len(unverifiable) == (1 if "r2d2" in hashes else 0)
