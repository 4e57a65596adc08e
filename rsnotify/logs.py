"""Structured logging: one JSON object per line, or readable text on a terminal.

Operators ship publisher and subscriber logs to a collector; fields such as
``collection`` and ``seq`` passed through ``extra=`` become JSON keys there,
so a gap or a failover can be found by query rather than by grep.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from urllib.parse import urlsplit, urlunsplit

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def setup(level: str = "info", fmt: str = "auto") -> None:
    """Configure the root logger once for a command-line process."""
    handler = logging.StreamHandler(sys.stderr)
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler.setFormatter(
        JsonFormatter()
        if use_json
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # websockets logs each connection opened and closed at INFO: with thousands
    # of subscribers on a gateway that is most of the log.  --log-level debug
    # shows them; the gateway logs what matters (refusals, slow clients) itself.
    quiet = logging.DEBUG if level.upper() == "DEBUG" else logging.WARNING
    logging.getLogger("websockets").setLevel(quiet)


def redact_url(text: str) -> str:
    """``text`` with a URL's password replaced by ``<redacted>`` (for messages and logs)."""
    if "@" not in text or "://" not in text:
        return text
    try:
        parts = urlsplit(text)
        password = parts.password
    except ValueError:
        return text
    if password is None:
        return text
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:<redacted>@{host}"))
