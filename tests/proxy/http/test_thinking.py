"""The thinking-binding opt-out decision and the ``anthropic-beta`` merge."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.http.thinking import (
    BINDING_BETA,
    apply_binding_opt_out,
    merge_beta_header,
    needs_binding_opt_out,
)

THINKING_TURN = {"role": "assistant", "content": [
    {"type": "thinking", "thinking": "hmm", "signature": "sig"}, {"type": "text", "text": "ok"}]}


def body(thinking: Any, messages: list[Any] | None = None) -> dict[str, Any]:
    """A request body with ``thinking`` and (by default) one thinking turn."""
    msgs = messages if messages is not None else [{"role": "user", "content": "q"}, THINKING_TURN]
    return {"thinking": thinking, "messages": msgs}


@pytest.mark.parametrize(("thinking", "messages", "changed", "expected"), [
    ({"type": "enabled", "budget_tokens": 1024}, None, True, True),
    ({"type": "adaptive"}, None, True, True),
    ({"type": "enabled", "budget_tokens": 1024}, None, False, False),
    ({"type": "disabled"}, None, True, False),
    (None, None, True, False),
    ({"type": "enabled", "budget_tokens": 1024,
      "block_binding": {"prefix_mismatch_behavior": "error"}}, None, True, False),
    ({"type": "enabled", "budget_tokens": 1024}, [{"role": "user", "content": "q"}], True, False),
])
def test_opt_out_only_when_thinking_blocks_survive_a_changed_prefix(
    thinking: Any, messages: list[Any] | None, changed: bool, expected: bool
) -> None:
    """Thinking on, blocks present, prefix changed by the proxy, no client choice: opt out."""
    assert needs_binding_opt_out(body(thinking, messages), prefix_changed=changed) is expected


def test_opt_out_replaces_thinking_without_touching_the_callers_object() -> None:
    """``block_binding`` is added on a new ``thinking`` object."""
    original = {"type": "enabled", "budget_tokens": 1024}
    request = body(original)
    apply_binding_opt_out(request)
    assert request["thinking"] == {**original,
                                   "block_binding": {"prefix_mismatch_behavior": "drop_block"}}
    assert "block_binding" not in original


@pytest.mark.parametrize(("values", "expected"), [
    ([], BINDING_BETA),
    (["a-1"], f"a-1,{BINDING_BETA}"),
    (["a-1, b-2"], f"a-1, b-2,{BINDING_BETA}"),
    (["a-1", "b-2"], f"a-1,b-2,{BINDING_BETA}"),
    ([f"a-1,{BINDING_BETA}"], f"a-1,{BINDING_BETA}"),
])
def test_beta_header_keeps_existing_values_and_adds_the_binding_beta_once(
    values: list[str], expected: str
) -> None:
    """Existing values are kept as sent; the binding beta is appended unless present."""
    assert merge_beta_header(values) == expected
