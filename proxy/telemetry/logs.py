"""structlog configuration: one chain for structlog and the standard ``logging`` module.

One JSON object per line (or a console rendering), through the same chain::

    framing (request fields, process fields, level, timestamp) -> Redactor -> renderer

The request fields (its id, then its session and tenant once known) live in one dict per
request in a context variable; a field the line sets itself wins.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Final, TextIO

import msgspec
import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from proxy.config import LoggingConfig
from proxy.telemetry.redaction import SAFE_KEYS, Redactor

__all__ = ["SAFE_KEYS", "Redactor", "bind_request_fields", "configure_logging",
           "reset_logging", "start_request_fields"]

_HANDLER_NAME: Final = "compact-proxy"
_QUIET_LOGGERS: Final = ("anthropic", "httpx", "httpx2", "httpcore", "httpcore2", "aiohttp.access")
_JSON: Final = msgspec.json.Encoder()
_COMPACT: Final = (",", ":")


def _json_line(event_dict: EventDict, **dumps_kw: Any) -> str:
    """One event as compact JSON: msgspec's text, or ``json.dumps``'s where they could differ
    in more than spacing (a value msgspec does not encode, a NaN or infinity, non-ASCII
    text: ``json.dumps`` escapes it, so a line stays ASCII)."""
    try:
        line = _JSON.encode(event_dict)
    except (TypeError, ValueError, msgspec.EncodeError):
        return json.dumps(event_dict, **{**dumps_kw, "separators": _COMPACT})
    if not line.isascii() or (b"null" in line and _holds_non_finite(event_dict.values())):
        return json.dumps(event_dict, **{**dumps_kw, "separators": _COMPACT})
    return line.decode("ascii")


def _holds_non_finite(values: Iterable[object]) -> bool:
    """Whether a float among ``values`` (or in a list or tuple among them) is not finite."""
    for value in values:
        if isinstance(value, float) and not math.isfinite(value):
            return True
        if isinstance(value, (list, tuple)) and _holds_non_finite(value):
            return True
    return False


def _renderer(config: LoggingConfig) -> Processor:
    if config.format == "console":
        return structlog.dev.ConsoleRenderer(colors=False)
    return structlog.processors.JSONRenderer(serializer=_json_line, sort_keys=False)


def utc_text(when: datetime) -> str:
    """``when`` (aware) as structlog's ``TimeStamper(fmt="iso", utc=True)`` writes it, by
    msgspec's RFC 3339 encoder."""
    return _JSON.encode(when.astimezone(UTC))[1:-1].decode("ascii")


_REQUEST_FIELDS: Final[ContextVar[dict[str, Any] | None]] = ContextVar(
    "compact_proxy_request_fields", default=None)


def start_request_fields(**fields: Any) -> None:
    """Begin the fields of the request now served: every line of this task, and of the
    tasks it starts, carries them."""
    _REQUEST_FIELDS.set(fields)


def bind_request_fields(**fields: Any) -> None:
    """Add ``fields`` to the current request's (a name bound before takes the new value)."""
    current = _REQUEST_FIELDS.get()
    if current is None:
        _REQUEST_FIELDS.set(fields)
    else:
        current.update(fields)


#: The level a logger method writes when it is not the method's name (as ``add_log_level``).
_LEVEL_OF: Final = {"warn": "warning", "exception": "error"}


class _Framing:
    """The chain's first step: the request's fields, then the process's (a field the line
    sets itself wins), the ``level`` and the ``timestamp``. One step: it runs on every line."""

    def __init__(self, fields: Mapping[str, int | str] | None = None) -> None:
        self._fields = tuple((fields or {}).items())

    def __call__(self, logger: WrappedLogger, method_name: str,
                 event_dict: EventDict) -> EventDict:
        request = _REQUEST_FIELDS.get()
        if request:
            for key, value in request.items():
                event_dict.setdefault(key, value)
        for key, value in self._fields:
            event_dict.setdefault(key, value)
        event_dict["level"] = _LEVEL_OF.get(method_name, method_name)
        event_dict["timestamp"] = utc_text(datetime.now(UTC))
        return event_dict


def configure_logging(
    config: LoggingConfig, *, stream: TextIO | None = None, secrets: Iterable[str] = (),
    fields: Mapping[str, int | str] | None = None, final: bool = False,
) -> None:
    """Configure structlog and the standard ``logging`` module for the whole process.

    ``secrets`` are blanked wherever they appear; ``fields`` go on every line (a worker's
    ``worker`` and ``pid``); ``final``: logging is not configured again in this process (not
    a supervisor that forks, not a test), so each logger is bound on its first line.
    """
    out = stream if stream is not None else sys.stderr
    level = logging.getLevelName(config.level.upper())
    framing = _Framing(fields)
    redactor = Redactor(secrets, trusted=frozenset({"level", "timestamp"}))  # framing's own
    renderer = _renderer(config)
    structlog.configure(
        processors=[framing, redactor, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.WriteLoggerFactory(file=out),
        context_class=dict,
        cache_logger_on_first_use=final,
    )
    # Foreign (stdlib) records: aiohttp's and asyncio's own errors, in the same format.
    handler = logging.StreamHandler(out)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[framing, structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, redactor,
                    renderer],
    ))
    handler.set_name(_HANDLER_NAME)
    root = logging.getLogger()
    _remove_handler(root)
    root.addHandler(handler)
    root.setLevel(max(level, logging.WARNING))
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def reset_logging() -> None:
    """Undo :func:`configure_logging`: structlog's defaults, the stdlib handler removed."""
    structlog.reset_defaults()
    _remove_handler(logging.getLogger())


def _remove_handler(root: logging.Logger) -> None:
    for handler in list(root.handlers):
        if handler.get_name() == _HANDLER_NAME:
            root.removeHandler(handler)
