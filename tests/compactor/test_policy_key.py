"""The checkpoint's policy key covers the whole frozen policy: a change of any field (present
or future) makes a stored checkpoint stale, and equal policies give equal keys everywhere."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compactor import (
    CachingCounter,
    Chars4Counter,
    CompactionCheckpoint,
    CompactionOptions,
    compact_context,
)
from compactor._sticky import policy_key
from policies import DEFAULT_READ_TOOLS, CompactionPolicy, ReadToolSpec

from .builders import exchange, user

REPO = Path(__file__).resolve().parents[2]
POLICY = CompactionPolicy(soft_threshold_tokens=3_000, hard_limit_tokens=50_000,
                          max_tool_result_tokens=400, keep_recent_messages=12,
                          summary_keep_recent=4)


def _other(value: Any) -> Any:
    """A different value of the same kind (one that the policy still accepts)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2
    if isinstance(value, str):
        return value + "x"
    if value is None:
        return "view"
    if isinstance(value, tuple) and value and all(isinstance(v, ReadToolSpec) for v in value):
        return value[:-1]
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return (*value, "extra")
    pytest.fail(f"no known change for {value!r}: teach _other about this field's type")


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(CompactionPolicy)])
def test_changing_any_policy_field_changes_the_key(field: str) -> None:
    """Every field of CompactionPolicy, including ones added later, is part of the key."""
    value = getattr(POLICY, field)
    other = 1 if value is None and field.endswith("_budget_tokens") else _other(value)
    changed = dataclasses.replace(POLICY, **{field: other})
    assert changed != POLICY
    assert policy_key(changed) != policy_key(POLICY)


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(ReadToolSpec)])
def test_changing_any_field_of_a_read_tool_changes_the_key(field: str) -> None:
    """The nested ReadToolSpec fields count too."""
    first, *rest = POLICY.read_tools
    edited = dataclasses.replace(first, **{field: _other(getattr(first, field))})
    changed = dataclasses.replace(POLICY, read_tools=(edited, *rest))
    assert policy_key(changed) != policy_key(POLICY)


def test_equal_policies_give_equal_keys() -> None:
    """Equality, not spelling: a list for a tuple, 1 for 1.0, a rebuilt default tool list."""
    rebuilt = [ReadToolSpec(s.name, s.path_field, list(s.range_fields), s.command)
               for s in DEFAULT_READ_TOOLS]
    same = CompactionPolicy(soft_threshold_tokens=3_000, hard_limit_tokens=50_000,
                            max_tool_result_tokens=400, keep_recent_messages=12,
                            summary_keep_recent=4, read_tools=rebuilt)  # type: ignore[arg-type]
    assert same == POLICY and policy_key(same) == policy_key(POLICY)
    one = dataclasses.replace(POLICY, compact_to_ratio=1)
    assert one == dataclasses.replace(POLICY, compact_to_ratio=1.0)
    assert policy_key(one) == policy_key(dataclasses.replace(POLICY, compact_to_ratio=1.0))


def test_the_key_is_short_versioned_hex() -> None:
    """A format prefix then a sha256 prefix: old-format keys ("3000,50000,...") never match."""
    key = policy_key(POLICY)
    prefix, digest = key.split("-")
    assert prefix == "p2" and len(digest) == 32 and int(digest, 16) >= 0
    assert "," not in key


def test_the_key_is_the_same_in_another_process() -> None:
    """No hash() and no salt: a restarted proxy (any PYTHONHASHSEED) computes the same key."""
    script = ("from compactor._sticky import policy_key\n"
              "from policies import CompactionPolicy\n"
              "print(policy_key(CompactionPolicy(soft_threshold_tokens=3_000,"
              " hard_limit_tokens=50_000, max_tool_result_tokens=400,"
              " keep_recent_messages=12, summary_keep_recent=4)))\n")
    keys = set()
    for seed in ("0", "1", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, check=True,
                             capture_output=True, text=True)
        keys.add(out.stdout.strip())
    assert keys == {policy_key(POLICY)}


# --- the pipeline -----------------------------------------------------------------------


def _turn(messages: list[Any], n: int) -> list[Any]:
    return [*messages, *exchange(f"toolu_{n:04d}", f"output {n}\n" * 200, command=f"step {n}")]


def _send(messages: list[Any], policy: CompactionPolicy,
          checkpoint: CompactionCheckpoint | None) -> Any:
    return compact_context(messages, None, policy=policy, counter=CachingCounter(Chars4Counter()),
                           summarizer=lambda payload: "a summary",
                           options=CompactionOptions(checkpoint=checkpoint, sticky=True))


def _compacted_session() -> tuple[list[Any], CompactionCheckpoint, int]:
    messages: list[Any] = [user("Original intent")]
    for n in range(200):
        messages = _turn(messages, n)
        result = _send(messages, POLICY, None)
        if result.changed:
            assert result.checkpoint is not None
            return messages, result.checkpoint, n + 1
    pytest.fail("the history never crossed the soft threshold")


@pytest.mark.parametrize("changes", [
    {"read_tools": ()},
    {"read_tools": (ReadToolSpec("Read", "file_path"),)},
    {"compact_to_ratio": 0.5},
    {"summary_enabled": False},
])
def test_a_checkpoint_is_not_reused_under_another_policy(changes: dict[str, Any]) -> None:
    """A checkpoint made under one read_tools / compact_to_ratio / summary_enabled is stale
    under another: the compaction starts afresh (and the same policy still reuses it)."""
    messages, checkpoint, n = _compacted_session()
    grown = _turn(messages, n)
    assert _send(grown, POLICY, checkpoint).reused_checkpoint
    other = dataclasses.replace(POLICY, **changes)
    assert not _send(grown, other, checkpoint).reused_checkpoint


def test_a_checkpoint_stored_under_an_old_format_key_is_not_reused() -> None:
    """A checkpoint read back from the store with an old-style key starts afresh."""
    messages, checkpoint, n = _compacted_session()
    old_key = ",".join(str(getattr(POLICY, f)) for f in (
        "soft_threshold_tokens", "hard_limit_tokens", "max_tool_result_tokens",
        "keep_recent_messages", "summary_keep_recent"))
    stored = dataclasses.replace(checkpoint, policy_key=old_key).to_bytes()
    restored = CompactionCheckpoint.from_bytes(stored)
    assert restored is not None and restored.policy_key == old_key
    assert not _send(_turn(messages, n), POLICY, restored).reused_checkpoint
