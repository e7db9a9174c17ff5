"""What a compacted span leaves behind verbatim: the user's own texts and the artifact trail,
in the summary's block (or L3's block of the same kind), within their budgets. A later
compaction parses them back and carries them forward (docs/how-it-works.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from policies import CompactionPolicy

from ._blocks import Message, blocks_of
from ._l4_summary import is_summary_block
from ._trail import ENTRY_CLOSE, ENTRY_OPEN, STATUS, artifact_trail, entries_within, render_entry
from ._user_text import person_texts

_TEXT_HEAD = "What the user wrote in this part, verbatim, oldest first:"
_TRAIL_HEAD = "Files and commands of this part, exact, newest last:"
_TEXTS = re.compile(r"<user-text>\n(.*?)\n</user-text>", re.DOTALL)
_TRAIL = re.compile(r"<artifact-trail>\n(.*?)\n</artifact-trail>", re.DOTALL)
#: One trail entry: a command of several lines between entry lines, or one line.
_ENTRY = re.compile(rf"^{ENTRY_OPEN}\n(.*?)\n{ENTRY_CLOSE}$|^([^\n]+)$", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True)
class SpanRecord:
    """The user texts (oldest first) and trail lines (newest last) kept for a span."""

    user_texts: tuple[str, ...] = ()
    trail: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.user_texts or self.trail)

    def render(self) -> str:
        """The two sections as they stand in a summary block ("" when both are empty)."""
        parts: list[str] = []
        if self.user_texts:
            parts.append(_TEXT_HEAD + "\n" + "\n".join(
                f"<user-text>\n{text}\n</user-text>" for text in self.user_texts))
        if self.trail:
            parts.append(_TRAIL_HEAD + "\n<artifact-trail>\n"
                         + "\n".join(map(render_entry, self.trail)) + "\n</artifact-trail>")
        return "\n\n".join(parts)


def parse_record(text: str) -> SpanRecord:
    """The sections a summary block's ``text`` carries (see :meth:`SpanRecord.render`)."""
    texts = tuple(_TEXTS.findall(text))
    trail = tuple(whole or line for found in _TRAIL.findall(text)
                  for whole, line in _ENTRY.findall(found))
    return SpanRecord(texts, trail)


def _newest_within(items: list[str], budget: int, count: Callable[[str], int]) -> list[str]:
    kept: list[str] = []
    used = 0
    for item in reversed(items):
        used += count(item)
        if used > budget:
            break
        kept.append(item)
    return kept[::-1]


def budgets(policy: CompactionPolicy) -> tuple[int, int]:
    """The user-text and trail budgets of ``policy`` in tokens (defaults: a tenth and a
    twentieth of the soft threshold)."""
    soft = policy.soft_threshold_tokens
    texts = policy.user_text_budget_tokens
    trail = policy.artifact_trail_budget_tokens
    return (soft // 10 if texts is None else texts, soft // 20 if trail is None else trail)


def span_record(span: Iterable[Message], policy: CompactionPolicy,
                count: Callable[[str], int]) -> SpanRecord:
    """What ``span`` (the messages dropped or summarised) keeps verbatim: the records of
    earlier compactions inside it first, then its own; over a budget, the oldest go."""
    texts: list[str] = []
    earlier_trail: list[str] = []
    messages = list(span)
    for message in messages:
        for block in filter(is_summary_block, blocks_of(message)):
            found = parse_record(block["text"])
            texts += found.user_texts
            earlier_trail += found.trail
        texts += person_texts(message)
    trail: dict[str, str] = {}
    for line in [*earlier_trail, *artifact_trail(messages, policy.read_tools)]:
        key = STATUS.sub("", line)
        trail.pop(key, None)
        trail[key] = line
    text_budget, trail_budget = budgets(policy)
    # A text typed again ("continue") is kept once, at its latest place.
    unique = list(dict.fromkeys(texts[::-1]))[::-1]
    return SpanRecord(tuple(_newest_within(unique, text_budget, count)),
                      tuple(entries_within(list(trail.values()), trail_budget, count)))

