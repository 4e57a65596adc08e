"""Fuzz (c): the WebSocket frame handler, both directions.

Server frames as a subscriber's channel reads them (only InvalidNotification
may escape), and what a client controls at the gateway: the handshake's
request target and token, and the subscribe frame (only InvalidSubscription).
"""

from __future__ import annotations

from hypothesis import given

from .fuzzers import CI, FUZZERS


@CI
@given(FUZZERS["ws-server-frame"].strategy)
def test_server_frames_parse_or_raise_invalid_notification(data: str) -> None:
    FUZZERS["ws-server-frame"].target(data)


@CI
@given(FUZZERS["ws-server-bytes"].strategy)
def test_raw_server_frames_parse_or_raise_invalid_notification(data: bytes) -> None:
    FUZZERS["ws-server-bytes"].target(data)


@CI
@given(FUZZERS["ws-request-target"].strategy)
def test_request_targets_parse_or_raise_invalid_subscription(target: str) -> None:
    FUZZERS["ws-request-target"].target(target)


@CI
@given(FUZZERS["ws-client-frame"].strategy)
def test_subscribe_frames_parse_or_raise_invalid_subscription(data: str) -> None:
    FUZZERS["ws-client-frame"].target(data)


@CI
@given(FUZZERS["ws-client-bytes"].strategy)
def test_raw_client_input_parses_or_raises_invalid_subscription(data: bytes) -> None:
    FUZZERS["ws-client-bytes"].target(data)
