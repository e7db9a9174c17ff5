"""What a caller may already know about each message of a request, so a warm request works out
only its new messages: a caller that keeps decoded messages across requests keeps each one's
:class:`MessageFact` (:func:`message_fact`) and passes them as ``CompactionOptions.facts``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ._blocks import Message
from ._errors import MessageShapeError
from ._fingerprint import fingerprint
from ._markers import has_markers
from ._protocol import check_shape
from ._tokens import CachingCounter

__all__ = ["MessageFact", "message_fact", "message_facts"]


@dataclass(frozen=True, slots=True)
class MessageFact:
    """One message's fingerprint, its ``tokens`` by the counter it was made with (pass the
    pipeline that counter) and whether it is ``marked`` with ``cache_control``."""

    fingerprint: int
    tokens: int
    marked: bool


def message_fact(message: Message, counter: CachingCounter) -> MessageFact | None:
    """The facts of ``message`` counted by ``counter``; None when it is not a well-shaped
    message (the pipeline's own check then names the problem by its index)."""
    print_ = _shaped_print(message)
    return None if print_ is None else _fact(message, print_, counter)


def _shaped_print(message: Message) -> int | None:
    try:
        check_shape([message])
    except MessageShapeError:
        return None
    return fingerprint(message)


def _fact(message: Message, print_: int, counter: CachingCounter) -> MessageFact:
    return MessageFact(print_, counter.count_message(message, print_), has_markers(message))


def message_facts(messages: Sequence[Message],
                  counter: CachingCounter) -> list[MessageFact | None]:
    """:func:`message_fact` of each of ``messages``, their long texts counted first in one
    parallel batch (:meth:`CachingCounter.prefetch`)."""
    prints = [_shaped_print(message) for message in messages]
    shaped = [(m, p) for m, p in zip(messages, prints, strict=True) if p is not None]
    counter.prefetch([m for m, _ in shaped], [p for _, p in shaped])
    return [None if print_ is None else _fact(message, print_, counter)
            for message, print_ in zip(messages, prints, strict=True)]
