"""What a person typed: user-role text that is neither a tool result nor injected by the harness.

A harness's own text (reminders, command echoes, task notices, interruption markers) is told
by its wrappers, learnt from the corpus and Claude Code's recorded requests; every other user
``text`` block was typed by the person, which a compaction must not lose (``_record``).
"""

from __future__ import annotations

import re

from ._blocks import Message, blocks_of

#: Tags a harness wraps its own text in, when they open the text block.
HARNESS_TAGS = (
    "system-reminder", "command-name", "command-message", "command-args", "command-contents",
    "local-command-caveat", "local-command-stdout", "local-command-stderr",
    "task-notification", "user-prompt-submit-hook", "bash-input", "bash-stdout", "bash-stderr",
    "ide_opened_file", "ide_selection", "ide_diagnostics", "new-diagnostics",
    # The proxy's own wrappers: a summary or a record of dropped messages is no person's text.
    "compact-proxy-summary",
)
_OPENING = re.compile(r"\s*<(" + "|".join(re.escape(t) for t in HARNESS_TAGS) + r")[\s>]")
#: A reminder the harness appends to a person's text: removed before the text is judged.
_REMINDER = re.compile(r"\s*<system-reminder>.*?</system-reminder>\s*", re.DOTALL)
#: Claude Code's interruption markers and its "[Image #1]"-style placeholders alone.
_MARKER = re.compile(r"\s*\[(Request interrupted by user[^\]]*|Image #\d+)\]\s*")


def person_texts(message: Message) -> list[str]:
    """The texts a person typed in ``message`` (a user message), in order, each as it
    stands (a trailing harness reminder removed); empty for any other message."""
    if message.get("role") != "user":
        return []
    found: list[str] = []
    for block in blocks_of(message):
        text = block.get("text")
        if (block.get("type") != "text" or not isinstance(text, str) or not text.strip()
                or _OPENING.match(text) or _MARKER.fullmatch(text)):  # the harness's own text
            continue
        text = _REMINDER.sub("\n", text).strip()
        if text:
            found.append(text)
    return found
