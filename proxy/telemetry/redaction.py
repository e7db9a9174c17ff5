"""The allow-list that backs "no message text, no credential" in the logs (:class:`Redactor`).

A field not in :data:`SAFE_KEYS` is dropped (and named under ``redacted``), as is a value
that is not a scalar or a list of scalars; a string that looks like a credential (or holds a
configured secret) is blanked, a long one cut. An ``exc_info`` becomes ``error_class`` and
``traceback`` (frames and classes), never the exception's message.
"""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Callable, Iterable
from typing import Final

from structlog.typing import EventDict, WrappedLogger

__all__ = ["SAFE_KEYS", "Redactor"]

_LEADING: Final = ("timestamp", "level", "event")

#: Fields a log line may carry. Every one holds an id, a count, a status or a code name.
SAFE_KEYS: Final = frozenset({
    # structlog / stdlib framing
    "event", "level", "timestamp", "logger",
    # the request (SPEC section 8)
    "request_id", "session_id", "tenant", "role", "route", "method", "status", "outcome",
    "tokens_before", "tokens_after", "layers", "upstream_status", "duration_ms",
    "reason", "hard_limit", "kind", "tool_use_id", "message_index", "path",
    "compacted_because", "upstream", "fixed_tokens", "messages_tokens", "soft_threshold", "model",
    # failures: class names and code locations only (``traceback``: frames, see Redactor)
    "error", "error_class", "error_location", "detail", "traceback",
    # summaries and durable state
    "layer", "saved", "cached", "summary_model", "durable_items", "mode", "pieces", "joined",
    "summary_served", "summary_wait_ms", "prepared_messages", "prepared_tokens",
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
    """Whether ``value`` holds a literal every :data:`_CREDENTIAL` match holds: a cheap test
    that spares most ids and names the search."""
    return ("sk-" in value or "eyJ" in value or "earer" in value or "asic" in value
            or "=" in value or ":" in value)


# Values that hold no text, kept as they are (a subclass of one goes through _clean).
_PLAIN: Final = frozenset({bool, int, float, type(None)})


class _CleanedStrings(dict[str, str]):
    """Each string's cleaned form (``cleaned[value]``), made by ``clean`` the first time and
    kept for short strings: a line's values are mostly the previous line's ids and names."""

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


class Redactor:
    """The allow-list processor; run it last before the renderer. ``secrets`` are blanked
    wherever they appear; ``trusted`` fields (set by an earlier step: the timestamp, the
    level) are kept as they are."""

    def __init__(self, secrets: Iterable[str] = (), safe_keys: frozenset[str] = SAFE_KEYS,
                 trusted: frozenset[str] = frozenset()) -> None:
        self._secrets = tuple(s for s in secrets if s)
        self._safe_keys = safe_keys
        self._trusted = trusted & safe_keys
        self._cleaned = _CleanedStrings(self._checked)

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
            return True, self._cleaned[value]
        if isinstance(value, (list, tuple)):
            items: list[object] = []
            for item in value:
                if item is None or isinstance(item, (bool, int, float)):
                    items.append(item)
                elif isinstance(item, str):
                    items.append(self._cleaned[item])
                else:
                    return False, None
            return True, items
        return False, None

    def __call__(self, logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
        """Return a new event dict holding only safe fields and safe values, the framing
        fields first, so a line reads "when, how bad, what" from the left."""
        out = dict.fromkeys(key for key in _LEADING if key in event_dict)
        out.update(event_dict)
        dropped: list[str] = []
        for key, value in event_dict.items():
            if key not in self._safe_keys:
                del out[key]
                if key != "exc_info" and not key.startswith("_"):
                    dropped.append(key)
            elif type(value) is str:  # the common cases first, without _clean's tests
                if key not in self._trusted:
                    out[key] = self._cleaned[value]
            elif type(value) not in _PLAIN and key not in self._trusted:
                keep, cleaned = self._clean(value)
                if keep:
                    out[key] = cleaned
                else:
                    del out[key]
                    dropped.append(key)
        if "exc_info" in event_dict:
            # A traceback's text can quote data (the exception's message, a repr): keep the
            # exception's class and where it was raised, frame by frame, and nothing it said.
            exc = _exception_of(event_dict["exc_info"])
            if exc is not None:
                out.setdefault("error_class", type(exc).__name__)
                out["traceback"] = [self._cleaned[line] for line in _frames(exc)]
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
    """``file:line in function`` for each frame (the file's last two parts), then the
    exception's class; a cause first, as Python prints it; the innermost :data:`_MAX_FRAMES`."""
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
