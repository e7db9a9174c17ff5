"""What a caller may already know about each message of a request, so a warm request works
out only its new messages.

Everything in ``__all__`` gets re-exported.

An agent resends its whole history on every call. A caller that keeps each decoded message
across requests (the proxy keeps them by the hash of their bytes) keeps its
:class:`MessageFact` with it, made once by :func:`message_fact`, and hands the pipeline the
facts of the request's messages (:attr:`CompactionOptions.facts`): no message the pipeline was
told about is shape-checked, fingerprinted, counted or searched for markers again.

A caller that also keeps the request before (the proxy does, per conversation) hands them as
:class:`FactColumns`: the previous request's columns cut at the messages it repeats
(:meth:`FactColumns.prefix`, list slices) plus the new messages' facts. Then nothing runs per
message of the history in Python, neither in the caller nor in the pipeline.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ._blocks import Message
from ._errors import MessageShapeError
from ._fingerprint import fingerprint
from ._markers import has_markers
from ._protocol import check_shape
from ._tokens import CachingCounter

__all__ = ["FactColumns", "MessageFact", "message_fact", "message_facts"]


@dataclass(frozen=True, slots=True)
class MessageFact:
    """One message's facts, as :func:`message_fact` made them.

    Attributes:
        fingerprint: its content fingerprint (``cache_control`` markers ignored).
        tokens: its count by the counter it was made with (pass the pipeline that counter).
        marked: whether it carries a ``cache_control`` marker on a block.
    """

    fingerprint: int
    tokens: int
    marked: bool


class FactColumns:
    """The facts of a request's messages, a column each: ``fingerprints[i]`` and ``tokens[i]``
    of message ``i``, and ``marked``, the indexes of the messages that carry a marker (in
    order). Cut and extended with list operations, never a Python loop over the history.

    Args:
        facts: the facts to start with, in message order.
    """

    __slots__ = ("fingerprints", "marked", "tokens")

    def __init__(self, facts: Iterable[MessageFact] = ()) -> None:
        self.fingerprints: list[int] = []
        self.tokens: list[int] = []
        self.marked: list[int] = []
        self.extend(facts)

    def __len__(self) -> int:
        return len(self.fingerprints)

    def __repr__(self) -> str:
        return f"FactColumns(<{len(self)} messages, {len(self.marked)} marked>)"

    def extend(self, facts: Iterable[MessageFact]) -> None:
        """Add the facts of the messages that follow."""
        for fact in facts:
            if fact.marked:
                self.marked.append(len(self.fingerprints))
            self.fingerprints.append(fact.fingerprint)
            self.tokens.append(fact.tokens)

    def prefix(self, count: int) -> FactColumns:
        """The columns of the first ``count`` messages (new lists: this one is not changed)."""
        cut = FactColumns()
        cut.fingerprints = self.fingerprints[:count]
        cut.tokens = self.tokens[:count]
        cut.marked = self.marked[:bisect.bisect_left(self.marked, count)]
        return cut

    def facts(self) -> list[MessageFact]:
        """The columns as one :class:`MessageFact` per message."""
        marked = set(self.marked)
        return [MessageFact(p, t, i in marked)
                for i, (p, t) in enumerate(zip(self.fingerprints, self.tokens, strict=True))]


def message_fact(message: Message, counter: CachingCounter) -> MessageFact | None:
    """The facts of ``message`` counted by ``counter``; None when it is not a well-shaped
    message (the pipeline's own check then names the problem by its index)."""
    try:
        check_shape([message])
    except MessageShapeError:
        return None
    return _fact(message, fingerprint(message), counter)


def _fact(message: Message, print_: int, counter: CachingCounter) -> MessageFact:
    return MessageFact(print_, counter.count_message(message, print_), has_markers(message))


def message_facts(messages: Sequence[Message],
                  counter: CachingCounter) -> list[MessageFact | None]:
    """:func:`message_fact` of each of ``messages``, their long texts counted first in one
    parallel batch (:meth:`CachingCounter.prefetch`): a cold multi-megabyte history is mostly
    a few large tool results, which one by one would be counted on one core."""
    prints: list[int | None] = []
    for message in messages:
        try:
            check_shape([message])
        except MessageShapeError:
            prints.append(None)
            continue
        prints.append(fingerprint(message))
    shaped = [(m, p) for m, p in zip(messages, prints, strict=True) if p is not None]
    counter.prefetch([m for m, _ in shaped], [p for _, p in shaped])
    return [None if print_ is None else _fact(message, print_, counter)
            for message, print_ in zip(messages, prints, strict=True)]
