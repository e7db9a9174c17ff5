"""The rendered durable block of each session, rendered again only when its state or a
source's resolution changed."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import compactor
from proxy.http.durable import DurableBlocks

T0 = datetime(2025, 3, 1, tzinfo=UTC)
SHA = "ab" * 32


def state(content: str = "deploys happen on fridays") -> compactor.DurableContextState:
    return compactor.DurableContextState(facts=(
        compactor.DurableFact("f1", content, "transcript:s1:1", T0),))


def resolved(status: str = "available") -> tuple[compactor.SourceResolution, ...]:
    return (compactor.SourceResolution("transcript:s1:1", status,  # type: ignore[arg-type]
                                       SHA if status == "available" else None, "x"),)


def test_the_same_state_and_resolutions_give_the_block_already_rendered() -> None:
    blocks = DurableBlocks()
    pinned = state()
    first = blocks.text("s", pinned, resolved())
    assert first == compactor.render_durable_context(pinned, source_resolutions=resolved())
    assert blocks.text("s", pinned, resolved()) is first  # equal resolutions: not rendered


def test_a_changed_resolution_or_state_is_rendered_again() -> None:
    blocks = DurableBlocks()
    pinned = state()
    available = blocks.text("s", pinned, resolved())
    missing = blocks.text("s", pinned, resolved("missing"))
    assert "source_status=missing" in missing and missing != available
    edited = dataclasses.replace(pinned.facts[0], content="deploys happen on mondays")
    changed = compactor.DurableContextState(facts=(edited,))
    assert "mondays" in blocks.text("s", changed, resolved())
    assert blocks.text("other", pinned, resolved()) == available  # per session


def test_the_least_recently_used_session_goes() -> None:
    blocks = DurableBlocks(max_sessions=1)
    pinned = state()
    first = blocks.text("a", pinned, resolved())
    blocks.text("b", pinned, resolved())
    again = blocks.text("a", pinned, resolved())
    assert again == first and again is not first  # rendered anew, the same text
