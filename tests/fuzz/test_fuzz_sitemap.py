"""Fuzz (a): the document parser, from hand-written ResourceSync markup and raw bytes."""

from __future__ import annotations

from hypothesis import given

from .fuzzers import CI, FUZZERS


@CI
@given(FUZZERS["sitemap-grammar"].strategy)
def test_hand_written_documents_parse_or_raise_documented_errors(data: bytes) -> None:
    FUZZERS["sitemap-grammar"].target(data)


@CI
@given(FUZZERS["sitemap-bytes"].strategy)
def test_raw_bytes_parse_or_raise_documented_errors(data: bytes) -> None:
    FUZZERS["sitemap-bytes"].target(data)
