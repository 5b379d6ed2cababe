"""Structured logs for the tuner: one JSON object per line (``log_json: true``).

Every record carries ``ts`` (ISO 8601 UTC), ``level``, ``logger`` and ``msg``; the tuner adds
``event`` (start, switch, dropped, agent_down, agent_up, restored, ...) and its facts as
extra fields, so a log shipper can index switches and drops without parsing sentences.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": _dt.datetime.fromtimestamp(record.created, _dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def use_json_logs(level: int = logging.INFO) -> None:
    """Switch the root logger's handlers to JSON lines (on stderr when there are none)."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
    for handler in root.handlers:
        handler.setFormatter(JsonFormatter())
    root.setLevel(min(root.level or level, level))
