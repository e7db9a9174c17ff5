"""The ``policies`` section: per-role thresholds, the rules that pick a role, the file-read
tools and source access; the values themselves are :mod:`policies`' own types."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from dataclasses import field
from typing import Annotated, Any, ClassVar, Union

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from policies._compaction import DEFAULT_READ_TOOLS, ReadToolSpec, Thresholds
from policies._roles import DEFAULT_ROLE_RULES, Role, RoleRule
from proxy.config._base import Bool, Section, SessionId, doc, section


def _each_optional(base: type[Any]) -> type[Any]:
    """A frozen dataclass with every field of the pydantic dataclass ``base``, each optional
    (default ``None``) and otherwise held to the same limits and described the same."""
    specs = [(name, Union[info.rebuild_annotation(), None], doc(None, info.description))  # noqa: UP007
             for name, info in base.__pydantic_fields__.items()]
    return dataclasses.make_dataclass(f"Optional{base.__name__}", specs, frozen=True)


@section("policies.roles")
class RoleOverride(_each_optional(Thresholds), Section):  # type: ignore[misc]
    """``policies.roles.<role>``: the thresholds one role changes, and ``summary_enabled``;
    a key left out (``None``) is inherited from the ``compaction`` and ``summary`` sections."""

    summary_enabled: Bool | None = doc(None, (
        "L4 for this role; true is refused while summary.enabled is false. Inherited: "
        "summary.enabled, false for summary_recovery."))

    #: Keys that belong elsewhere, and where.
    MISPLACED: ClassVar[Mapping[str, str]] = {
        "token_counter": "is global; set compaction.token_counter instead",
    }


@section("policies.source_access")
class SourceAccessConfig(Section):
    """Whose source pointers a session may resolve (by default only its own)."""

    allow_cross_session: Bool = doc(False, "true: any session may resolve any session's pointers.")
    shared_sessions: tuple[SessionId, ...] = doc((), (
        "Sessions whose pointers every session may resolve."))


def _drop_nulls(data: Any) -> Any:
    if isinstance(data, Mapping):
        return {key: value for key, value in data.items() if value is not None}
    return data


# A key given as null (`rules:`, `range_fields:` with nothing after) has its default.
_NULLS_ARE_DEFAULTS = BeforeValidator(_drop_nulls)


@section("policies")
class PoliciesConfig(Section):
    """Per-deployment decisions: the thresholds of each role (main, subagent,
    summary_recovery), the rules that pick a request's role, the tools L2 treats as file reads
    and whose source pointers a session may resolve."""

    roles: Annotated[Mapping[Role, RoleOverride], AfterValidator(types.MappingProxyType)] = Field(
        default_factory=lambda: types.MappingProxyType({}), description=(
            "Role -> the compaction keys it changes (any but token_counter) and summary_enabled; "
            "a role not listed inherits everything (summary_recovery: with L4 off)."))
    rules: tuple[Annotated[RoleRule, _NULLS_ARE_DEFAULTS], ...] = doc(DEFAULT_ROLE_RULES, (
        "Tried in order, the first match decides a request's role (none: main). Replaces the "
        "default rule: x-claude-code-agent-id (a Claude Code subagent) makes it subagent."))
    read_tools: tuple[Annotated[ReadToolSpec, _NULLS_ARE_DEFAULTS], ...] = doc(DEFAULT_READ_TOOLS, (
        "The tools L2 counts as file reads; replaces the default list (Claude Code's Read, the "
        "text-editor tool's view, read_file)."))
    source_access: SourceAccessConfig = field(default_factory=SourceAccessConfig)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        return _drop_nulls(data)
