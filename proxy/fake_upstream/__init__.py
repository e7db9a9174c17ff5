"""``compact-proxy fake-upstream``: a strict, offline, deterministic stand-in for the Anthropic
Messages API, used by the proxy's tests and ``compact-proxy demo``.

:func:`check_messages_request` is the provider's rule set as a pure function (no server), the
strict validator the compactor's property tests use. :class:`FakeUpstream` serves scripted
:class:`Reply` objects over aiohttp and records every :class:`RecordedRequest`.
"""

from .records import RecordedRequest
from .replies import (
    Fault,
    Reply,
    redacted_thinking_block,
    text_block,
    thinking_block,
    tool_use_block,
)
from .rules import (
    ProviderRuleError,
    cache_control_count,
    check_count_tokens_request,
    check_messages_request,
)
from .scripts import (
    SUMMARIZER_MARKER,
    Script,
    default_script,
    is_summarizer_request,
    summary_text,
)
from .server import FakeUpstream, run_fake_upstream, start_fake_upstream
from .signatures import sign_thinking
from .timing import SummaryTiming

__all__ = [
    "SUMMARIZER_MARKER",
    "FakeUpstream",
    "Fault",
    "ProviderRuleError",
    "RecordedRequest",
    "Reply",
    "Script",
    "SummaryTiming",
    "cache_control_count",
    "check_count_tokens_request",
    "check_messages_request",
    "default_script",
    "is_summarizer_request",
    "redacted_thinking_block",
    "run_fake_upstream",
    "sign_thinking",
    "start_fake_upstream",
    "summary_text",
    "text_block",
    "thinking_block",
    "tool_use_block",
]
