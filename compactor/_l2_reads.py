"""L2 — drop file reads that a later read of the same file superseded.

The proxy never sees an agent's private bookkeeping, so a read is recognised from the
``tool_use`` itself, through the policy's list of read tools (``ReadToolSpec``: Claude Code's
``Read``, the text-editor tool's ``view`` command, a generic ``read_file``). Only successful
reads count: a failed read neither supersedes nor is superseded. A superseded read goes as a
whole interaction — its use and its result together.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from policies import CompactionPolicy, ReadToolSpec

from ._protocol import Interaction
from ._turns import protected_indices, removable_in_turn
from ._view import View, drop_pairs

__all__: list[str] = []


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
    """L2: the view without superseded reads, and how many interactions were dropped.

    A read is superseded when a read with the same key sits in a *later* assistant message;
    parallel reads in one message are left alone, so the latest assistant turn is never
    edited. A read in the opener of the turn in progress stays (see ``_turns``): dropping it
    could leave that message only its thinking, and then remove it.
    """
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
