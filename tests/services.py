"""Transitional alias: the process fixtures live in :mod:`rsnotify.devstack`."""

from rsnotify.devstack import *  # noqa: F403
from rsnotify.devstack import async_wait_for, free_port, wait_for  # noqa: F401
