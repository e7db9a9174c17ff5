"""CompactionPolicy and ReadToolSpec: validated at construction."""

from __future__ import annotations

import pytest

from policies import DEFAULT_READ_TOOLS, CompactionPolicy, ReadToolSpec
from policies._compaction import THRESHOLD_NAMES, Thresholds


def test_defaults_are_the_config_defaults() -> None:
    """The policy's defaults are SPEC section 3's compaction defaults."""
    policy = CompactionPolicy()
    assert (policy.soft_threshold_tokens, policy.hard_limit_tokens, policy.max_tool_result_tokens,
            policy.keep_recent_messages, policy.summary_keep_recent
            ) == (80_000, 120_000, 5_000, 6, 4)
    assert policy.read_tools == DEFAULT_READ_TOOLS


def test_the_thresholds_are_one_declaration() -> None:
    """The five thresholds (names, limits, defaults) are Thresholds' fields; the policy adds
    the rest."""
    assert THRESHOLD_NAMES == ("soft_threshold_tokens", "hard_limit_tokens",
                               "max_tool_result_tokens", "keep_recent_messages",
                               "summary_keep_recent")
    assert issubclass(CompactionPolicy, Thresholds)
    policy = CompactionPolicy()
    assert all(getattr(policy, name) == getattr(Thresholds(), name) for name in THRESHOLD_NAMES)


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"soft_threshold_tokens": 0}, "soft_threshold_tokens"),
    ({"hard_limit_tokens": -1}, "hard_limit_tokens"),
    ({"max_tool_result_tokens": True}, "max_tool_result_tokens"),
    ({"keep_recent_messages": -1}, "keep_recent_messages"),
    ({"summary_keep_recent": 1.5}, "summary_keep_recent"),
    ({"soft_threshold_tokens": 100, "hard_limit_tokens": 100}, "below hard_limit_tokens"),
])
def test_invalid_values_are_rejected_naming_the_field(kwargs: dict, fragment: str) -> None:
    """A bad threshold is a ValueError that names it."""
    with pytest.raises(ValueError, match=fragment):
        CompactionPolicy(**kwargs)


def test_default_read_tools_cover_claude_code_the_text_editor_and_read_file() -> None:
    """L2 recognises Read(file_path), the editor's view(path) and read_file(path) by default."""
    names = {(spec.name, spec.path_field, spec.command) for spec in DEFAULT_READ_TOOLS}
    assert {("Read", "file_path", None), ("str_replace_based_edit_tool", "path", "view"),
            ("read_file", "path", None)} <= names


def test_read_tool_spec_needs_a_name_and_a_path_field() -> None:
    """An empty name or path field cannot describe a read."""
    with pytest.raises(ValueError):
        ReadToolSpec("", "path")
    with pytest.raises(ValueError):
        ReadToolSpec("Read", "")
