"""Fuzz (b): the envelope decoder (JSON and Change Notification XML) and signature check."""

from __future__ import annotations

from typing import Any

from hypothesis import given

from .fuzzers import CI, FUZZERS


@CI
@given(FUZZERS["envelope-json"].strategy)
def test_json_envelopes_decode_or_raise_invalid_notification(data: bytes) -> None:
    FUZZERS["envelope-json"].target(data)


@CI
@given(FUZZERS["envelope-xml"].strategy)
def test_xml_envelopes_decode_or_raise_invalid_notification(data: bytes) -> None:
    FUZZERS["envelope-xml"].target(data)


@CI
@given(FUZZERS["envelope-any"].strategy)
def test_any_payload_decodes_or_raises_invalid_notification(data: bytes) -> None:
    FUZZERS["envelope-any"].target(data)


@CI
@given(FUZZERS["envelope-signature"].strategy)
def test_any_signature_verifies_or_raises_signature_error(args: Any) -> None:
    FUZZERS["envelope-signature"].target(args)
