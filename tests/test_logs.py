"""Command-line logging (rsnotify.logs): what each level shows."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from rsnotify import logs


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    websockets = logging.getLogger("websockets")
    saved = (root.handlers[:], root.level, websockets.level)
    yield
    root.handlers[:], root.level = saved[0], saved[1]
    websockets.setLevel(saved[2])


@pytest.mark.parametrize(("level", "shown"), [("info", False), ("warning", False), ("debug", True)])
def test_websockets_connection_chatter_only_at_debug(
    restore_logging: None, level: str, shown: bool
) -> None:
    """websockets' per-connection INFO lines would flood a gateway's log with 2,000 clients."""
    logs.setup(level, "text")
    assert logging.getLogger("websockets.server").isEnabledFor(logging.INFO) is shown
    assert logging.getLogger("websockets.server").isEnabledFor(logging.WARNING)
    assert logging.getLogger("rsnotify.ws").isEnabledFor(logging.INFO) is (level != "warning")
