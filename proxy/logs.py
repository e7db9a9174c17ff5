"""structlog configuration, and the redaction step that backs "no message text, no credential".

One JSON object per line (or a console rendering) from both structlog and the standard
``logging`` module (aiohttp, asyncio), through the same chain::

    framing (request fields, process fields, level, timestamp) -> Redactor -> renderer

The request fields are those of the request being served (its id, then its session and
tenant once known): one dict per request in a context variable, begun by the request
middleware (:func:`start_request_fields`) and added to by the handler
(:func:`bind_request_fields`); a field the line sets itself wins. The line every request
writes goes through :func:`log_info`: the same chain, without structlog's logger around it.

:class:`Redactor` is an allow-list: a field whose name is not in :data:`SAFE_KEYS` is dropped
(its name is listed under ``redacted``), a value that is not a scalar or a list of scalars is
dropped, a string that looks like a credential (or equals a configured secret) is blanked and
long strings are cut. Code that logs a prompt by mistake therefore logs nothing of it. An
``exc_info`` becomes ``error_class`` and ``traceback`` (its frames as ``file:line in function``,
then the class), never the exception's message.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Final, TextIO

import msgspec
import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from proxy.config import LoggingConfig

__all__ = ["SAFE_KEYS", "Redactor", "bind_request_fields", "configure_logging", "log_info",
           "reset_logging", "start_request_fields"]

#: Fields a log line may carry. Every one holds an id, a count, a status or a code name.
SAFE_KEYS: Final = frozenset({
    # structlog / stdlib framing
    "event", "level", "timestamp", "logger",
    # the request (SPEC section 8)
    "request_id", "session_id", "tenant", "role", "route", "method", "status", "outcome",
    "tokens_before", "tokens_after", "layers", "upstream_status", "duration_ms",
    "reason", "hard_limit", "kind", "tool_use_id", "message_index",
    # failures: class names and code locations only (``traceback``: frames, see Redactor)
    "error", "error_class", "error_location", "detail", "traceback",
    # summaries and durable state
    "layer", "saved", "cached", "summary_model", "durable_items", "mode", "pieces", "joined",
    # what the provider answered: its counts (calibration, recovery, billed usage)
    "provider_input_tokens", "estimate_error", "provider_tokens", "provider_maximum",
    "usage_input", "usage_cache_read", "usage_cache_write", "usage_output",
    # body repairs
    "replaced",
    "version", "expected_version", "created", "action", "removed",
    "facts", "pending_items", "retrieval_evidence",
    # startup
    "host", "port", "upstream_host", "store_backend", "token_counter", "summary_enabled",
    "admin_enabled", "log_format", "allocator", "event_loop",
    # the admin listener (admin.listen) and a locked-out client's wait
    "admin_port", "retry_after_s",
    # worker processes (``listen.workers``): which one logged, and the supervisor's events
    "worker", "pid", "workers", "worker_pid", "exit_code", "signal", "restart_in_s",
    "uptime_s", "drain_timeout_s",
    # the store's outages (store_unavailable): the policy, what went without the store and
    # how many times since the previous such line
    "on_unavailable", "what", "events",
    # connections held without finishing a request (proxy.http.connections): limits, counts
    "open_files_limit", "max_connections", "configured", "refused", "timeout_s",
    # the redaction report itself
    "redacted",
})

_REDACTED: Final = "[redacted]"
_HANDLER_NAME: Final = "compact-proxy"
_LEADING: Final = ("timestamp", "level", "event")
_LEADING_KEYS: Final = frozenset(_LEADING)
_MAX_STRING: Final = 256
#: Strings up to this length have their cleaned form remembered, this many at most.
_CLEANED_LENGTH: Final = 128
_CLEANED_ENTRIES: Final = 4096
_MAX_FRAMES: Final = 64  # lines of a logged traceback
_MAX_CHAIN: Final = 8  # exceptions followed through __cause__ / __context__

# What a credential looks like on the wire: Anthropic/OpenAI-style keys, HTTP auth schemes,
# JWTs, and "name=value" pairs of the usual secret names.
_CREDENTIAL: Final = re.compile(
    r"sk-ant-[A-Za-z0-9_\-]{4,}"
    r"|\bsk-[A-Za-z0-9_\-]{16,}"
    r"|\b(?:[Bb]earer|[Bb]asic)\s+[A-Za-z0-9._~+/=\-]{8,}"
    r"|\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"
    r"|(?i:api[_-]?key|auth[_-]?token|secret|password|x-api-key)\s*[=:]\s*\S+"
    r"|://[^/\s@:]*:[^\s@]+@"  # a URL's password (redis://:secret@host)
)


def _may_hold_credential(value: str) -> bool:
    """Whether ``value`` holds one of the literals every :data:`_CREDENTIAL` match holds
    (``sk-``, ``eyJ``, ``earer``, ``asic``, ``=``, ``:``): a cheap test that spares most ids and
    names the search, which tries the pattern at every character."""
    return ("sk-" in value or "eyJ" in value or "earer" in value or "asic" in value
            or "=" in value or ":" in value)


# Values that hold no text, kept as they are (a subclass of one goes through _clean).
_PLAIN: Final = frozenset({bool, int, float, type(None)})


class _CleanedStrings(dict[str, str]):
    """Each string's cleaned form (``cleaned[value]``), made by ``clean`` the first time;
    the forms of short strings are kept (:data:`_CLEANED_ENTRIES` at most: a line's values
    are mostly the same ids, names and outcomes as the previous line's)."""

    def __init__(self, clean: Callable[[str], str]) -> None:
        super().__init__()
        self._clean = clean

    def __missing__(self, value: str) -> str:
        cleaned = self._clean(value)
        if len(value) <= _CLEANED_LENGTH:
            if len(self) >= _CLEANED_ENTRIES:
                self.clear()
            self[value] = cleaned
        return cleaned

# Loggers that would print request bodies at debug level; never below WARNING.
_QUIET_LOGGERS: Final = ("anthropic", "httpx", "httpx2", "httpcore", "httpcore2", "aiohttp.access")


class Redactor:
    """The allow-list processor; run it last before the renderer.

    Args:
        secrets: exact strings (the admin token, a summary key) blanked wherever they appear.
        safe_keys: the fields allowed through (default :data:`SAFE_KEYS`).
        trusted: fields an earlier processor of the chain always sets itself (the timestamp,
            the level), kept as they are.

    A short string's cleaned form is remembered (:data:`_CLEANED_ENTRIES` of them): a line's
    values are mostly the same ids, names and outcomes as the previous line's.
    """

    def __init__(self, secrets: Iterable[str] = (), safe_keys: frozenset[str] = SAFE_KEYS,
                 trusted: frozenset[str] = frozenset()) -> None:
        self._secrets = tuple(s for s in secrets if s)
        self._safe_keys = safe_keys
        self._trusted = trusted & safe_keys
        self._cleaned = _CleanedStrings(self._checked)
        self._skips: dict[frozenset[str], frozenset[str]] = {}  # own -> own | trusted

    def _clean_str(self, value: str) -> str:
        return self._cleaned[value]

    def _checked(self, value: str) -> str:
        if _may_hold_credential(value) and _CREDENTIAL.search(value):
            return _REDACTED
        for secret in self._secrets:
            if secret in value:
                return _REDACTED
        if len(value) > _MAX_STRING:
            return value[:_MAX_STRING] + "...[cut]"
        return value

    def _clean(self, value: object) -> tuple[bool, object]:
        """``(keep, cleaned)`` for one value."""
        if value is None or isinstance(value, (bool, int, float)):
            return True, value
        if isinstance(value, str):
            return True, self._clean_str(value)
        if isinstance(value, (list, tuple)):
            items: list[object] = []
            for item in value:
                if item is None or isinstance(item, (bool, int, float)):
                    items.append(item)
                elif isinstance(item, str):
                    items.append(self._clean_str(item))
                else:
                    return False, None
            return True, items
        return False, None

    def __call__(self, logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
        """Return a new event dict holding only safe fields and safe values."""
        if event_dict.keys() <= self._safe_keys:  # (no exc_info: it is not a safe key)
            return self._all_safe(event_dict)
        return self._field_by_field(event_dict)

    def redact_own(self, event_dict: EventDict, own: frozenset[str]) -> EventDict:
        """:meth:`__call__` for a line whose fields named in ``own`` hold what the proxy made
        itself (its counts, its own names and codes, ``None``): those are kept as they are,
        only the others are cleaned (the request line: its session id and method, of ~20
        fields)."""
        if event_dict.keys() <= self._safe_keys:
            skip = self._skips.get(own)
            if skip is None:
                skip = self._skips[own] = own | self._trusted
            return self._all_safe(event_dict, skip)
        return self._field_by_field(event_dict)

    def _all_safe(self, event_dict: EventDict, skip: frozenset[str] | None = None) -> EventDict:
        """:meth:`__call__` for an event whose fields are all allowed (most events): a copy
        with the framing fields first, in which the strings are replaced by their cleaned
        forms from the cache of cleaned strings (:class:`_CleanedStrings`, which cleans those
        it does not hold) and the other values that are not plain are cleaned one by one; a
        value that cannot be kept sends the event field by field. One plain loop that
        writes only what it changes: timed, it beats chains of C iterators (``map``,
        ``compress``, sets), whose objects cost more than the steps they save. ``skip``:
        the fields kept as they are (default: the trusted ones), left out of the loop."""
        if event_dict.keys() >= _LEADING_KEYS:  # (every line of the chain)
            out = dict.fromkeys(_LEADING)
        else:
            out = dict.fromkeys(key for key in _LEADING if key in event_dict)
        out.update(event_dict)
        cleaned = self._cleaned
        if skip is None:
            skip = self._trusted
            items: Iterable[tuple[str, Any]] = event_dict.items()
        else:
            items = [(key, event_dict[key]) for key in event_dict.keys() - skip]
        for key, value in items:
            kind = type(value)
            if kind is str:
                if key not in skip:
                    out[key] = cleaned[value]
            elif kind not in _PLAIN and key not in skip:  # (skip: kept as it is)
                keep, value = self._clean(value)
                if not keep:
                    return self._field_by_field(event_dict)
                out[key] = value
        return out

    def _field_by_field(self, event_dict: EventDict) -> EventDict:
        out: dict[str, Any] = {}
        dropped: list[str] = []
        exc_info = event_dict.get("exc_info")
        # The framing fields first, so a line reads "when, how bad, what" from the left.
        keys = [k for k in _LEADING if k in event_dict]
        keys += [k for k in event_dict if k not in _LEADING]
        trusted = self._trusted
        for key in keys:
            if key not in self._safe_keys:
                if key != "exc_info" and not key.startswith("_"):
                    dropped.append(key)
                continue
            value = event_dict[key]
            # The common cases first, without _clean's tests.
            if type(value) in _PLAIN or key in trusted:
                out[key] = value
            elif type(value) is str:
                out[key] = self._clean_str(value)
            else:
                keep, cleaned = self._clean(value)
                if keep:
                    out[key] = cleaned
                else:
                    dropped.append(key)
        # A traceback's text can quote data (the exception's message, a repr): keep the
        # exception's class and where it was raised, frame by frame, and nothing it said.
        exc = _exception_of(exc_info)
        if exc is not None:
            out.setdefault("error_class", type(exc).__name__)
            out["traceback"] = [self._clean_str(line) for line in _frames(exc)]
        if dropped:
            out["redacted"] = sorted(dropped)
        return out


def _exception_of(exc_info: object) -> BaseException | None:
    """The exception an ``exc_info`` value stands for (a tuple, an exception, ``True``)."""
    if isinstance(exc_info, tuple) and len(exc_info) == 3:
        return exc_info[1] if isinstance(exc_info[1], BaseException) else None
    if isinstance(exc_info, BaseException):
        return exc_info
    if exc_info is True:
        return sys.exc_info()[1]
    return None


def _frames(exc: BaseException) -> list[str]:
    """``file:line in function`` for each frame, then the exception's class; a cause (or the
    exception being handled) first, as Python prints it. File names are cut to their last
    two parts (``compactor/_pipeline.py``). At most :data:`_MAX_FRAMES` lines, the innermost
    kept."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < _MAX_CHAIN and all(current is not c for c in chain):
        chain.append(current)
        current = current.__cause__ if current.__cause__ is not None else (
            None if current.__suppress_context__ else current.__context__)
    lines: list[str] = []
    for link in reversed(chain):
        for frame in traceback.extract_tb(link.__traceback__):
            name = "/".join(frame.filename.replace("\\", "/").rsplit("/", 2)[-2:])
            lines.append(f"{name}:{frame.lineno} in {frame.name}")
        lines.append(type(link).__name__)
    return lines[-_MAX_FRAMES:]


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


class _DirectLines:
    """The configured chain run without structlog's logger around it (:func:`log_info`):
    the same steps, then the line written as structlog's ``WriteLogger`` writes it."""

    def __init__(self, processors: list[Processor], out: TextIO, *, enabled: bool,
                 final: bool, redactor: Redactor | None = None) -> None:
        self.processors = processors
        self.enabled = enabled
        self.final = final
        self._redactor = redactor
        self._write = out.write
        self._flush = out.flush

    def write(self, event: str, fields: dict[str, Any],
              own: frozenset[str] = frozenset()) -> None:
        event_dict: Any = fields
        event_dict["event"] = event
        redactor = self._redactor if own else None
        try:
            for step in self.processors:
                if step is redactor:
                    event_dict = redactor.redact_own(event_dict, own)
                else:
                    event_dict = step(None, "info", event_dict)
        except structlog.DropEvent:  # (as structlog's logger does: a step dropped it)
            return
        self._write(event_dict + "\n")
        self._flush()


_DIRECT: _DirectLines | None = None


def log_info(logger: Any, event: str, fields: dict[str, Any],
             own: frozenset[str] = frozenset()) -> None:
    """``logger.info(event, **fields)``, for the line every request writes: the configured
    chain's own steps run on ``fields`` (which become the line), without structlog's logger
    around them (it copies the fields three times, a third of the line's time); the same
    line, to the same stream. The steps are structlog's own list, which a test's
    ``capture_logs`` changes in place. Goes through ``logger`` when logging is not
    configured, or was configured with another list since (a process configured with
    ``final`` is not configured again).

    ``own``: the fields whose values the proxy made itself (counts, its own names and codes,
    ``None``; also those of the request and the process the framing adds): the redaction
    keeps them as they are and cleans only the others (:meth:`Redactor.redact_own`). The
    allow-list of field names holds for every field."""
    direct = _DIRECT
    if direct is None or not (
            direct.final or structlog.get_config()["processors"] is direct.processors):
        logger.info(event, **fields)
    elif direct.enabled:
        direct.write(event, fields, own)


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
            configuration on its first line and not looked up again on every line, and
            :func:`log_info` no longer checks that this configuration is still in place.
    """
    global _DIRECT
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
    _DIRECT = _DirectLines(processors, out, enabled=level <= logging.INFO, final=final,
                           redactor=redactor)
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
    global _DIRECT
    _DIRECT = None
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
