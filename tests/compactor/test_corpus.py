"""The real corpus through the pipeline, and the broken corpus through the validator.

Every conversation in ``../shared/corpus/real/*.json`` and ``repaired/*.json`` is compacted at
soft thresholds of 50 % and 20 % of its own token size (hard limit far away) with a deterministic
summariser, and every view must pass ``assert_valid_view``. Every file in ``invalid/`` must be
rejected by ``validate_tool_protocol`` with the kind, id and position its ``manifest.json`` entry
names first.

Five inputs already break the provider's thinking rules as they stand (an assistant message
ending on a thinking block, or one with text before its thinking); ``assert_valid_view`` then
demands only that compaction adds no new violation (see ``KNOWN_THINKING_VIOLATIONS``).
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest

from compactor import (
    Chars4Counter,
    CompactionResult,
    ToolProtocolError,
    compact_context,
    estimate_tokens,
    validate_tool_protocol,
)
from policies import CompactionPolicy
from proxy.fake_upstream.rules import ProviderRuleError, check_messages_request
from tests.paths import CORPUS

from .invariants import assert_valid_view

FRACTIONS = (0.5, 0.2)

pytestmark = pytest.mark.skipif(not CORPUS.is_dir(), reason=f"corpus not found at {CORPUS}")


def _bodies(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    return sorted(p.relative_to(CORPUS).as_posix() for p in folder.glob("*.json")
                  if p.name != "manifest.json")


VALID = _bodies(CORPUS) + _bodies(CORPUS / "repaired")
INVALID = _bodies(CORPUS / "invalid")

# The inputs that break a provider thinking rule before any compaction, and the rule each
# breaks first (checked below, so the list cannot silently drift from the data).
KNOWN_THINKING_VIOLATIONS = {
    "m-claude__8914a511-2982-4b5b-886b-cb526da278b1.json": "cannot be `thinking`",
    "m-claude__de0891f0-8f37-4cb1-b2bc-04c278fd5ae2.json": "cannot be `thinking`",
    "m-claude__ff59cfd2-09dc-4a18-8c9f-0d46c3d4e8cd.json": "cannot be `thinking`",
    "repaired/m-claude__3bd9cf18-3c9b-42f5-8fd1-47f5456c1fec.json": "cannot be `thinking`",
    "repaired/m-claude__95f81cf4-2300-4739-9018-2d0ff510912a.json":
        "the first block must be thinking",
}

# The manifest's error wording, mapped to ToolProtocolError fields:
# "missing tool_result for ID (tool_use at N)", "unknown tool_result ID at N (...)",
# "duplicate tool_use id ID at N (first at M)".
MANIFEST_ERROR = re.compile(
    r"^(?P<kind>missing|unknown|duplicate) (?:tool_result for |tool_result |tool_use id )"
    r"(?P<id>\S+) (?:\(tool_use at |at )(?P<index>\d+)")


def deterministic_summary(messages_json: str) -> str:
    """The same short summary for the same span, naming only its size."""
    return f"Earlier work: {len(json.loads(messages_json))} messages were summarised here."


@functools.cache
def load(name: str) -> dict[str, Any]:
    """A corpus body by its path under the corpus root (parsed once per run)."""
    body: dict[str, Any] = json.loads((CORPUS / name).read_text(encoding="utf-8"))
    return body


@functools.cache
def manifest() -> dict[str, dict[str, Any]]:
    """The manifest entries by their ``file``."""
    entries = json.loads((CORPUS / "manifest.json").read_text(encoding="utf-8"))
    return {e["file"]: e for e in entries if "file" in e}


@functools.cache
def compacted(name: str, fraction: float) -> CompactionResult:
    """``name`` compacted at ``fraction`` of its size (cached: two tests read each result)."""
    messages = load(name)["messages"]
    soft = max(1, int(estimate_tokens(messages, Chars4Counter()) * fraction))
    policy = CompactionPolicy(soft_threshold_tokens=soft, hard_limit_tokens=10**9,
                              max_tool_result_tokens=2_000)
    return compact_context(messages, None, policy=policy, summarizer=deterministic_summary)


def test_corpus_is_present() -> None:
    """The corpus holds the valid, repaired and invalid conversations the tests expect."""
    assert len(VALID) >= 200 and len(INVALID) >= 50
    assert any(name.startswith("repaired/") for name in VALID)


@pytest.mark.parametrize("name", sorted(KNOWN_THINKING_VIOLATIONS))
def test_known_thinking_violations_are_in_the_input(name: str) -> None:
    """The five inputs exempted from 'passes the checker' really break that rule on input."""
    with pytest.raises(ProviderRuleError) as caught:
        check_messages_request(load(name))
    assert KNOWN_THINKING_VIOLATIONS[name] in caught.value.message


@pytest.mark.parametrize("fraction", FRACTIONS)
@pytest.mark.parametrize("name", VALID)
def test_corpus_conversation_compacts_to_a_valid_view(name: str, fraction: float) -> None:
    """A real conversation compacted to a low soft threshold keeps every SPEC §5 invariant
    (for the five inputs already breaking a thinking rule: adds no new violation)."""
    body = load(name)
    result = compacted(name, fraction)
    assert_valid_view(body["messages"], result, original_body=body)
    if name not in KNOWN_THINKING_VIOLATIONS:
        check_messages_request(body)  # the input itself passes, so the view had to as well


def test_every_layer_ran_somewhere_across_the_corpus() -> None:
    """L1, L2, L3 and L4 each changed at least one corpus view, and each one's savings count."""
    applied: dict[str, int] = {layer: 0 for layer in ("L1", "L2", "L3", "L4")}
    for name in VALID:
        for fraction in FRACTIONS:
            result = compacted(name, fraction)
            for outcome in result.outcomes:
                if outcome.changed:
                    applied[outcome.layer] += 1
                    assert outcome.saved > 0, (name, fraction, outcome)
    assert all(applied.values()), applied


@pytest.mark.parametrize("name", INVALID)
def test_invalid_corpus_conversation_is_rejected_as_its_manifest_says(name: str) -> None:
    """validate_tool_protocol rejects a broken conversation with the manifest's first error:
    the same kind, tool_use id and message index."""
    entry = manifest()[name]
    match = MANIFEST_ERROR.match(entry["errors"][0])
    assert match, f"unrecognised manifest error {entry['errors'][0]!r}"
    with pytest.raises(ToolProtocolError) as caught:
        validate_tool_protocol(load(name)["messages"])
    error = caught.value
    assert (error.kind, error.tool_use_id, error.message_index) == (
        match["kind"], match["id"], int(match["index"]))


@pytest.mark.parametrize("name", [n for n in VALID if n.startswith("repaired/")])
def test_repaired_corpus_conversation_passes_the_validator(name: str) -> None:
    """The repaired copy of a broken conversation passes validate_tool_protocol."""
    interactions = validate_tool_protocol(load(name)["messages"])
    assert manifest()[name]["valid"] is True
    assert len(interactions) >= manifest()[name]["stats"]["tool_use"]
