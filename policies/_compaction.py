"""Compaction thresholds and the file-read tool list, per deployment.

The five thresholds are declared once, with their limits, in :class:`Thresholds`; the policy,
the ``compaction`` config section and the per-role overrides of ``proxy.config`` derive from
it. Every value is a frozen pydantic dataclass: a bad value is a ``ValueError`` naming its field.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

from annotated_types import Ge, Gt, Le
from pydantic import AfterValidator, ConfigDict, Field, Strict, ValidationInfo, model_validator
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError

__all__ = ["CompactionPolicy", "ReadToolSpec", "DEFAULT_READ_TOOLS"]

#: How every policy value is validated: an unknown field is an error.
STRICT = ConfigDict(extra="forbid")

#: A number of tokens: an integer of at least 1 (``true`` and ``1.0`` are not integers).
TokenCount = Annotated[int, Strict(), Ge(1)]
#: A number of messages: an integer of at least 0.
MessageCount = Annotated[int, Strict(), Ge(0)]
#: A fraction in (0, 1].
Ratio = Annotated[float, Strict(), Gt(0), Le(1)]


def invalid(field: str | None, problem: str) -> PydanticCustomError:
    """The error for a bad ``field`` (``None``: the value as a whole); the message starts with
    the field's name, ``ctx["field"]`` names it for a reader that reports the location itself."""
    message = f"{field} {problem}" if field else problem
    return PydanticCustomError("invalid", "{message}", {"field": field or "", "message": message})


def _not_blank(value: str, info: ValidationInfo) -> str:
    if not value.strip():
        raise invalid(info.field_name, "must not be empty")
    return value


#: A string with something in it.
Text = Annotated[str, Strict(), AfterValidator(_not_blank)]


@dataclass(frozen=True, config=STRICT)
class ReadToolSpec:
    """How to recognise a file read from a ``tool_use`` block: two reads supersede each other
    only when path and range are equal."""

    name: Annotated[Text, Field(description="The tool_use name.")]
    path_field: Annotated[Text, Field(description="The input field holding the path.")]
    range_fields: Annotated[tuple[Text, ...], Field(
        description="Input fields of the range read: reads with a different range are "
                    "different reads.")] = ()
    command: Annotated[Text | None, Field(
        description="Only when input.command equals this.")] = None


DEFAULT_READ_TOOLS: tuple[ReadToolSpec, ...] = (
    # Claude Code's Read tool.
    ReadToolSpec("Read", "file_path", ("offset", "limit")),
    # Anthropic's text-editor tool (text_editor_2025xxxx), whose name is fixed by the API.
    ReadToolSpec("str_replace_based_edit_tool", "path", ("view_range",), command="view"),
    ReadToolSpec("str_replace_editor", "path", ("view_range",), command="view"),
    # Generic agents.
    ReadToolSpec("read_file", "path", ("offset", "limit", "start_line", "end_line")),
)


@dataclass(frozen=True, config=STRICT)
class Thresholds:
    """The five compaction thresholds, their limits and defaults (SPEC §3 ``compaction``)."""

    soft_threshold_tokens: Annotated[TokenCount, Field(
        description="Compaction starts when the view is at or above this many tokens, and "
                    "stops as soon as it is below it; below hard_limit_tokens.")] = 80_000
    hard_limit_tokens: Annotated[TokenCount, Field(
        description="A view still at or above this after L4 is rejected "
                    "(MessageViewLimitExceeded).")] = 120_000
    max_tool_result_tokens: Annotated[TokenCount, Field(
        description="L1 truncates tool results larger than this.")] = 5_000
    keep_recent_messages: Annotated[MessageCount, Field(
        description="L3 never prunes this many most recent messages.")] = 6
    summary_keep_recent: Annotated[MessageCount, Field(
        description="L4 keeps this many most recent messages verbatim after the "
                    "summary.")] = 4

    @model_validator(mode="after")
    def _soft_below_hard(self) -> Thresholds:
        soft, hard = self.soft_threshold_tokens, self.hard_limit_tokens
        if soft >= hard:
            raise PydanticCustomError(
                "soft_not_below_hard",
                "{soft_field} must be below {hard_field} ({soft} >= {hard})",
                {"soft_field": "soft_threshold_tokens", "hard_field": "hard_limit_tokens",
                 "soft": soft, "hard": hard},
            )
        return self


#: The names of the five thresholds, in declaration order.
THRESHOLD_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Thresholds))


@dataclass(frozen=True, config=STRICT)
class CompactionPolicy(Thresholds):
    """The thresholds one role compacts with, the tools L2 recognises as file reads, whether
    L4 may run, and the sticky and kept-text settings (docs/configuration.md, ``compaction``)."""

    read_tools: tuple[ReadToolSpec, ...] = DEFAULT_READ_TOOLS
    summary_enabled: Annotated[bool, Strict()] = True
    compact_to_ratio: Ratio = 0.7
    user_text_budget_tokens: Annotated[int, Strict(), Ge(0)] | None = None
    artifact_trail_budget_tokens: Annotated[int, Strict(), Ge(0)] | None = None
