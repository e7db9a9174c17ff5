"""L2 — drop file reads that a later read of the same file superseded.

A read is recognised from the ``tool_use`` itself, through the policy's read tools
(``ReadToolSpec``); only successful reads count, and a superseded one goes with its result.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from policies import CompactionPolicy, ReadToolSpec

from ._protocol import Interaction
from ._turns import protected_indices, removable_in_turn
from ._view import View, drop_pairs


def read_key(interaction: Interaction,
             read_tools: Iterable[ReadToolSpec]) -> tuple[str, ...] | None:
    """What file (and which part of it) a successful read reads, or None if it is no read."""
    if interaction.kind != "client" or interaction.is_error or interaction.result_index is None:
        return None
    tool_input: Any = interaction.tool_input
    if not isinstance(tool_input, dict):
        return None
    for spec in read_tools:
        if interaction.name != spec.name:
            continue
        if spec.command is not None and tool_input.get("command") != spec.command:
            continue
        path = tool_input.get(spec.path_field)
        if not isinstance(path, str) or not path:
            continue
        ranges = tuple(json.dumps(tool_input.get(f), sort_keys=True) for f in spec.range_fields)
        return (spec.name, path, *ranges)
    return None


def drop_superseded_reads(view: View, interactions: Mapping[str, Interaction],
                          policy: CompactionPolicy) -> tuple[View, int]:
    """L2: the view without reads superseded by one in a *later* assistant message (so the
    latest turn is never edited), and how many went. The turn in progress's opener keeps
    its reads (``_turns``)."""
    specs = policy.read_tools
    protected = protected_indices(view.messages)
    latest: dict[tuple[str, ...], int] = {}
    keyed: list[tuple[str, tuple[str, ...], int]] = []
    for interaction in interactions.values():
        key = read_key(interaction, specs)
        if key is None:
            continue
        keyed.append((interaction.tool_use_id, key, interaction.use_index))
        latest[key] = max(latest.get(key, -1), interaction.use_index)
    superseded = removable_in_turn(view.messages, {
        tid for tid, key, at in keyed if at < latest[key] and at not in protected})
    if not superseded:
        return view, 0
    return view.derive(drop_pairs(view.messages, superseded)), len(superseded)
