"""The fuzzers: one hypothesis strategy feeding one target each.

The tests in this package run every fuzzer for a bounded number of examples
(:data:`CI`); ``python -m tests.fuzz --minutes N`` runs the same fuzzers for a
wall-clock budget, plus atheris on the raw-bytes targets when it is installed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from . import strategies as s
from . import targets as t


@dataclass(frozen=True)
class Fuzzer:
    name: str
    strategy: st.SearchStrategy[Any]
    target: Callable[[Any], None]


def _signed(args: tuple[bytes, str | None]) -> None:
    t.envelope_signature(*args)


FUZZERS = {
    f.name: f
    for f in [
        Fuzzer("sitemap-grammar", s.resourcesync_xml(), t.sitemap_document),
        Fuzzer("sitemap-bytes", st.binary(max_size=2048), t.sitemap_document),
        Fuzzer("envelope-json", s.envelope_json, t.envelope_payload),
        Fuzzer("envelope-xml", s.envelope_xml(), t.envelope_payload),
        Fuzzer(
            "envelope-any", st.binary(max_size=512) | s.json_values.map(s._dump), t.envelope_payload
        ),
        Fuzzer("envelope-signature", st.tuples(st.binary(max_size=64), s.signatures), _signed),
        Fuzzer("ws-server-frame", s.server_frames(), t.ws_server_frame),
        Fuzzer("ws-server-bytes", st.binary(max_size=512), t.raw_ws_server),
        Fuzzer("ws-request-target", s.request_targets(), t.ws_request_target),
        Fuzzer("ws-client-frame", s.client_frames(), t.ws_client_frame),
        Fuzzer("ws-client-bytes", st.binary(max_size=512), t.raw_ws_client),
    ]
}

_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
#: What `make test` spends: a few seconds per fuzzer (RSNOTIFY_FUZZ_EXAMPLES to change).
CI = settings(
    max_examples=int(os.environ.get("RSNOTIFY_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=_QUIET,
)


def long_run(examples: int) -> settings:
    """Settings for one round of the long runner: no shrinking budget cut, no database noise."""
    return settings(
        max_examples=examples, deadline=None, suppress_health_check=_QUIET, print_blob=True
    )
