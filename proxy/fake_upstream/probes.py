"""Probe questions: the fake answers one correctly exactly when the fact is in what it received.

A probe is a last user message whose text starts with ``PROBE: <key>`` (bench/probes.py asks
them after a long session). The fake looks for ``<key>`` in every text it was sent before that
message — ``system`` and the messages, tool inputs and results included — and answers with the
sentence around the first place it occurs, or ``I do not know.``; so a probe measures what the
view kept, not what a model could infer (the fake's own summaries carry no facts).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, Final

__all__ = ["PROBE_PREFIX", "UNKNOWN", "probe_answer", "probe_key"]

PROBE_PREFIX: Final = "PROBE: "
UNKNOWN: Final = "I do not know."


def _texts(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)


def _last_text(message: Any) -> str:
    if not isinstance(message, Mapping) or message.get("role") != "user":
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    texts = [str(b["text"]) for b in content or [] if isinstance(b, Mapping)
             and b.get("type") == "text" and isinstance(b.get("text"), str)]
    return texts[-1] if texts else ""


def probe_key(body: Mapping[str, Any]) -> str | None:
    """The key a probe request asks about, or None when ``body`` is no probe."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    text = _last_text(messages[-1])
    if not text.startswith(PROBE_PREFIX):
        return None
    return text[len(PROBE_PREFIX):].split("\n", 1)[0].strip() or None


def probe_answer(body: Mapping[str, Any]) -> str | None:
    """The fake's answer to a probe (None when ``body`` is no probe)."""
    key = probe_key(body)
    if key is None:
        return None
    sent = [body.get("system"), body["messages"][:-1]]
    for text in _texts(sent):
        at = text.find(key)
        if at < 0:
            continue
        # The sentence (or line) around it: from the last ". " or line break before the key
        # to the next one after it.
        stop = text.rfind(". ", 0, at)
        start = max(stop + 2 if stop >= 0 else 0, text.rfind("\n", 0, at) + 1)
        after = at + len(key)
        end = min((i for i in (text.find(". ", after), text.find("\n", after)) if i >= 0),
                  default=len(text))
        return text[start:end].strip().rstrip(".") or json.dumps(key)
    return UNKNOWN


