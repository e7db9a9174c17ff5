"""The provider's rule checker on the real corpus: valid and repaired conversations pass (but
for the listed thinking-rule breakers), invalid ones fail, and the longest is checked quickly."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from proxy.fake_upstream import ProviderRuleError, check_messages_request
from tests.paths import CORPUS

from .conftest import corpus_bodies, load_body

# -- the real corpus ---------------------------------------------------------------------------

# Real Claude Code sessions where the user interrupted a turn after its thinking, or where the
# converter merged two responses so a text block leads: the provider's thinking rules reject
# them although the corpus' own (tool-protocol) check accepts them.
THINKING_RULE_BREAKERS = {
    "m-claude__de0891f0-8f37-4cb1-b2bc-04c278fd5ae2.json":
        "messages.5: The final block in an assistant message cannot be `thinking`.",
    "m-claude__ff59cfd2-09dc-4a18-8c9f-0d46c3d4e8cd.json":
        "messages.47: The final block in an assistant message cannot be `thinking`.",
    "m-claude__8914a511-2982-4b5b-886b-cb526da278b1.json":
        "messages.17: The final block in an assistant message cannot be `thinking`.",
    "repaired/m-claude__95f81cf4-2300-4739-9018-2d0ff510912a.json":
        "messages.57.content.0: If an assistant message contains any thinking blocks, the first "
        "block must be thinking or redacted_thinking. Found text.",
    "repaired/m-claude__3bd9cf18-3c9b-42f5-8fd1-47f5456c1fec.json":
        "messages.29: The final block in an assistant message cannot be `thinking`.",
}


def _corpus_key(path: Path) -> str:
    return str(path.relative_to(CORPUS))


@pytest.mark.parametrize(
    "path", corpus_bodies(CORPUS) + corpus_bodies(CORPUS / "repaired")
)
def test_valid_and_repaired_corpus_bodies_pass(path: Path) -> None:
    """Every valid and repaired real conversation passes, except the listed thinking-rule
    breakers, which fail with exactly their thinking error."""
    key = _corpus_key(path)
    if key in THINKING_RULE_BREAKERS:
        with pytest.raises(ProviderRuleError) as caught:
            check_messages_request(load_body(path))
        assert caught.value.message == THINKING_RULE_BREAKERS[key]
    else:
        check_messages_request(load_body(path))


@pytest.mark.parametrize("path", corpus_bodies(CORPUS / "invalid"))
def test_invalid_corpus_bodies_fail(path: Path) -> None:
    """Every conversation in invalid/ is rejected with a positioned provider error."""
    with pytest.raises(ProviderRuleError, match=r"^messages\.\d+"):
        check_messages_request(load_body(path))


def test_corpus_bodies_are_checked_quickly() -> None:
    """The longest real conversation (639 messages) is checked in well under a second."""
    name = "m-claude__c76e5be5-ffd2-4901-a935-885527c83a61.json"
    request_body = load_body(CORPUS / "repaired" / name)
    started = time.perf_counter()
    check_messages_request(request_body)
    assert time.perf_counter() - started < 0.5
