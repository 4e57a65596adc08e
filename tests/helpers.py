"""Small pieces several integration test modules share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from rsnotify.simulator.server import Simulator, SimulatorConfig


@asynccontextmanager
async def running_simulator(**options: Any) -> AsyncIterator[tuple[Simulator, str]]:
    """An in-process ``rsnotify simulate``, quiet unless ``rate`` is given; yields it, its URL."""
    options.setdefault("rate", 0)
    sim = Simulator(SimulatorConfig(**options))
    url = await sim.start()
    try:
        yield sim, url
    finally:
        await sim.stop()
