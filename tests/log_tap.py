"""A tap on every log line the proxy renders during a pytest run, and the run-wide check of
those lines for secrets (the hooks that use it are in ``tests/conftest.py``).

Every line the proxy logs, through structlog or the standard ``logging`` module, is rendered
by a structlog ``JSONRenderer`` or ``ConsoleRenderer`` as the last step of the chain that
:func:`proxy.telemetry.logs.configure_logging` builds (after the redactor). :func:`install` wraps
both renderers' ``__call__`` so that each rendered line is also kept in :data:`LOG_TAP`, whichever
stream it goes to; the reliability fixtures add the stderr of every proxy subprocess they
start. At the end of the run the lines are scanned for the suite's secrets; the run fails on
any hit, or when the tap holds fewer lines than tests that ran a proxy (each request logs at
least ``request_completed``), so a tap that saw nothing cannot pass.

Under pytest-xdist each worker taps its own lines and sends its :class:`TapSummary` to the
controller (``workeroutput``), which adds them up and judges the whole run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import structlog

__all__ = ["LOG_TAP", "LogTap", "TapSummary", "install"]


class LogTap:
    """Every log line rendered in this process (and by our subprocesses), kept in order."""

    def __init__(self, secrets: tuple[str, ...] = ()) -> None:
        self._lock = threading.Lock()
        self.lines: list[str] = []
        #: What no line may contain (set by ``tests/conftest.py``).
        self.secrets = secrets

    def add(self, line: str) -> None:
        """Keep one rendered line."""
        with self._lock:
            self.lines.append(line)

    def hits(self) -> list[tuple[int, str]]:
        """``(line number, secret)`` for every secret found in a kept line."""
        with self._lock:
            lines = list(self.lines)
        return [(number, secret) for number, line in enumerate(lines)
                for secret in self.secrets if secret in line]

    def summary(self) -> TapSummary:
        """How many lines this process kept, and where secrets were found."""
        return TapSummary(len(self), [f"line {number} holds {secret[:6]}..."
                                      for number, secret in self.hits()])

    def __len__(self) -> int:
        with self._lock:
            return len(self.lines)


@dataclass
class TapSummary:
    """The tapped lines of one or more processes: how many, and each hit described."""

    lines: int = 0
    hits: list[str] = field(default_factory=list)

    def add(self, other: TapSummary | Mapping[str, Any]) -> None:
        """Count another process's lines (a summary, or one sent by an xdist worker)."""
        if not isinstance(other, TapSummary):
            other = TapSummary(int(other["lines"]), list(other["hits"]))
        self.lines += other.lines
        self.hits.extend(other.hits)

    def as_dict(self) -> dict[str, Any]:
        """Plain values, as an xdist worker sends them to the controller."""
        return asdict(self)

    def problems(self, proxy_tests: int) -> list[str]:
        """What fails the run: a secret in a line, or fewer lines than tests that ran a
        proxy."""
        found: list[str] = []
        if self.hits:
            found.append(f"{len(self.hits)} secret(s) found in proxy log lines: "
                         + ", ".join(self.hits[:5]))
        if self.lines < proxy_tests:
            found.append(f"only {self.lines} proxy log lines were scanned for {proxy_tests} "
                         "tests that ran a proxy: the log tap is broken")
        return found


LOG_TAP: Final = LogTap()
_ORIGINALS: dict[type, Callable[..., Any]] = {}


def _tapped(original: Callable[..., Any]) -> Callable[..., Any]:
    def render(self: Any, logger: Any, name: str, event_dict: Any) -> Any:
        out = original(self, logger, name, event_dict)
        LOG_TAP.add(out.decode("utf-8", "replace") if isinstance(out, bytes) else str(out))
        return out

    return render


def install() -> None:
    """Wrap both renderers (once per process)."""
    for renderer in (structlog.processors.JSONRenderer, structlog.dev.ConsoleRenderer):
        if renderer not in _ORIGINALS:
            _ORIGINALS[renderer] = renderer.__call__
            renderer.__call__ = _tapped(renderer.__call__)  # type: ignore[method-assign]
