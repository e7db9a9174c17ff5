"""structlog configuration: one chain for structlog and the standard ``logging`` module.

One JSON object per line (or a console rendering) from both structlog and the standard
``logging`` module (aiohttp, asyncio), through the same chain::

    framing (request fields, process fields, level, timestamp) -> Redactor -> renderer

The request fields are those of the request being served (its id, then its session and
tenant once known): one dict per request in a context variable, begun by the request
middleware (:func:`start_request_fields`) and added to by the handler
(:func:`bind_request_fields`); a field the line sets itself wins.

:class:`~proxy.telemetry.redaction.Redactor` (an allow-list: no message text, no credential) runs
last before the renderer.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Iterable, Mapping, MutableMapping
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


def _json_line(event_dict: EventDict, **dumps_kw: Any) -> str:
    """One event as compact JSON (no spaces after ``,`` and ``:``, every line alike):
    msgspec's text, or ``json.dumps``'s where the two could differ in more than spacing — a
    value msgspec does not encode (a subclass of ``str``), a NaN or an infinity (msgspec writes
    ``null``, ``json.dumps`` ``NaN`` or ``Infinity``), text outside ASCII (``json.dumps``
    escapes it: a line stays ASCII whatever the stream's encoding)."""
    try:
        line = _JSON.encode(event_dict)
    except (TypeError, ValueError, msgspec.EncodeError):
        return json.dumps(event_dict, **{**dumps_kw, "separators": _COMPACT})
    if not line.isascii() or (b"null" in line and _holds_non_finite(event_dict.values())):
        return json.dumps(event_dict, **{**dumps_kw, "separators": _COMPACT})
    return line.decode("ascii")


def _holds_non_finite(values: Iterable[object]) -> bool:
    """Whether a float among ``values``, or in a list or tuple among them, is a NaN or an
    infinity (a redacted line holds nothing deeper)."""
    for value in values:
        if isinstance(value, float) and not math.isfinite(value):
            return True
        if isinstance(value, (list, tuple)) and _holds_non_finite(value):
            return True
    return False


_COMPACT: Final = (",", ":")


def _renderer(config: LoggingConfig) -> Processor:
    if config.format == "console":
        return structlog.dev.ConsoleRenderer(colors=False)
    return structlog.processors.JSONRenderer(serializer=_json_line, sort_keys=False)


def utc_text(when: datetime) -> str:
    """``when`` (aware) as structlog's ``TimeStamper(fmt="iso", utc=True)`` writes it —
    ``isoformat()`` with ``Z`` for ``+00:00``, no fraction when it is zero — written by
    msgspec's RFC 3339 encoder, which gives the same text in a fraction of the time."""
    return _JSON.encode(when.astimezone(UTC))[1:-1].decode("ascii")


_REQUEST_FIELDS: Final[ContextVar[dict[str, Any] | None]] = ContextVar(
    "compact_proxy_request_fields", default=None)


def start_request_fields(**fields: Any) -> None:
    """Begin the fields of the request now served (nothing of an earlier request's kept):
    from now on, every line of this task, and of the tasks it starts, carries them."""
    _REQUEST_FIELDS.set(fields)


def bind_request_fields(**fields: Any) -> None:
    """Add ``fields`` to the current request's (a name bound before takes the new value)."""
    current = _REQUEST_FIELDS.get()
    if current is None:
        _REQUEST_FIELDS.set(fields)
    else:
        current.update(fields)


#: The level a logger method writes when it is not the method's name (structlog's
#: ``add_log_level``: ``warn`` is the stdlib's alias, ``exception`` is ``error`` with a
#: traceback).
_LEVEL_OF: Final = {"warn": "warning", "exception": "error"}


class _Framing:
    """The chain's first step, what every line gets: the fields of the request being
    served, then the process's fixed fields (a field the line sets itself wins), the
    ``level`` (structlog's ``add_log_level``) and the ``timestamp`` (:func:`utc_text` of
    now). One step rather than four: it runs on every request."""

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

    Args:
        config: ``logging.format`` (``json`` | ``console``) and ``logging.level``.
        stream: where lines go (default ``sys.stderr``); one line per event, flushed.
        secrets: exact values to blank wherever they would appear (the admin token...).
        fields: added to every line of the process (a worker's ``worker`` and ``pid``); a
            field the line sets itself wins.
        final: the process will not configure logging again (a server's own process, not
            a supervisor that forks, not a test): each logger is then bound to this
            configuration on its first line and not looked up again on every line.
    """
    out = stream if stream is not None else sys.stderr
    level = logging.getLevelName(config.level.upper())
    framing = _Framing(fields)
    # The framing sets these two on every event, whatever it held.
    redactor = Redactor(secrets, trusted=frozenset({"level", "timestamp"}))
    renderer = _renderer(config)
    processors: list[Processor] = [framing, redactor, renderer]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.WriteLoggerFactory(file=out),
        context_class=dict,
        cache_logger_on_first_use=final,
    )
    # Foreign (stdlib) records: aiohttp's and asyncio's own errors, in the same format.
    handler = logging.StreamHandler(out)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[framing, structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    _drop_positional_args, redactor, renderer],
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


def _drop_positional_args(
    logger: WrappedLogger, method_name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    event_dict.pop("positional_args", None)
    return event_dict
