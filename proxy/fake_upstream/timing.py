"""How long the fake provider takes to write a summary.

A real model writes tens of tokens a second, so a summary call is the wait a compaction adds
to the request that crosses the threshold; with these set, tests and benchmarks see that wait.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SummaryTiming"]


@dataclass(frozen=True)
class SummaryTiming:
    """The time a summary call takes: ``first_token_s``, then ``token_s`` per output token
    (the answer's; with ``writes_max_tokens``, the request's ``max_tokens``: a model that
    writes its whole budget). A real model writes tens of tokens a second, so a summary call
    is the wait a crossing adds; tests and benchmarks see it with these set."""

    first_token_s: float = 0.0
    token_s: float = 0.0
    writes_max_tokens: bool = False

    def __post_init__(self) -> None:
        if self.first_token_s < 0 or self.token_s < 0:
            raise ValueError("SummaryTiming times must be >= 0")

    def seconds(self, body: Mapping[str, Any], written: int) -> float:
        """How long answering ``body`` takes when the answer has ``written`` output tokens."""
        budget = body.get("max_tokens")
        tokens = budget if self.writes_max_tokens and isinstance(budget, int) else written
        return self.first_token_s + self.token_s * tokens
