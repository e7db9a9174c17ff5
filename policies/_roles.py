"""Which compaction policy a request gets: the roles (``main``, ``subagent``,
``summary_recovery``), the rules that pick one, the lookup.

Rules are data: :class:`RoleRule` values tried in order, first match wins, else the default
role. :meth:`RolePolicies.select` runs on every request, so every regex is compiled and every
role's policy resolved once, at construction.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Final, Literal, get_args

from pydantic import AfterValidator, Field, Strict, ValidationInfo, model_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from ._compaction import STRICT, CompactionPolicy, invalid

__all__ = ["ROLE_NAMES", "RoleRule", "RolePolicies"]

#: A role's name.
Role = Literal["main", "subagent", "summary_recovery"]
ROLE_NAMES: tuple[Role, ...] = get_args(Role)

#: An HTTP header name: an RFC 9110 "token".
HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def _role_name(value: str, info: ValidationInfo) -> str:
    if value not in ROLE_NAMES:
        raise invalid(info.field_name, f"must be one of {', '.join(ROLE_NAMES)}, got {value!r}")
    return value


def _header_name(value: str, info: ValidationInfo) -> str:
    if HEADER_NAME.fullmatch(value) is None:
        raise invalid(info.field_name, f"must be an HTTP header name, got {value!r}")
    # Header names are case-insensitive; keep the lower-case form once.
    return value.lower()


def _regex(value: str, info: ValidationInfo) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise invalid(info.field_name,
                      f"is not a valid regular expression ({exc}): {value!r}") from None
    return value


RoleName = Annotated[str, Strict(), AfterValidator(_role_name)]
#: An HTTP header name, stored lower-case.
HeaderName = Annotated[str, Strict(), AfterValidator(_header_name)]
#: A regular expression (a string that compiles).
Regex = Annotated[str, Strict(), AfterValidator(_regex)]


@pydantic_dataclass(frozen=True, config=STRICT)
class RoleRule:
    """One rule mapping a request to a role; it matches when every given condition holds
    (``header_pattern`` needs ``header``; a rule needs ``header`` or ``model_pattern``)."""

    role: Annotated[RoleName, Field(description="The role a matching request gets.")]
    header: Annotated[HeaderName | None, Field(
        description="The request must carry this header (any case).")] = None
    header_pattern: Annotated[Regex | None, Field(
        description="And the header's value must fully match this regex.")] = None
    model_pattern: Annotated[Regex | None, Field(
        description="The body's model must fully match this regex.")] = None
    _header_re: re.Pattern[str] | None = field(init=False, repr=False, compare=False)
    _model_re: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    @model_validator(mode="after")
    def _conditions(self) -> RoleRule:
        if self.header_pattern is not None and self.header is None:
            raise invalid(None, "header_pattern needs header")
        if self.header is None and self.model_pattern is None:
            raise invalid(None, "a rule needs at least one condition: header or model_pattern")
        return self

    def __post_init__(self) -> None:
        for name, pattern in (("_header_re", self.header_pattern),
                              ("_model_re", self.model_pattern)):
            object.__setattr__(self, name, None if pattern is None else re.compile(pattern))

    def matches(self, lowered_headers: Mapping[str, str], model: str | None) -> bool:
        """Whether a request with these headers (keys already lower-cased) and model matches."""
        if self.header is not None:
            value = lowered_headers.get(self.header)
            if value is None:
                return False
            if self._header_re is not None and self._header_re.fullmatch(value) is None:
                return False
        return self._model_re is None or (
            isinstance(model, str) and self._model_re.fullmatch(model) is not None)


#: multidict's case-insensitive mappings (aiohttp's request headers), known by name: the
#: policies do not depend on multidict.
_CASE_INSENSITIVE: Final = frozenset({"CIMultiDict", "CIMultiDictProxy"})

DEFAULT_ROLE_RULES: tuple[RoleRule, ...] = (
    # Claude Code sends this header on every request a subagent (Task tool) makes.
    RoleRule("subagent", header="x-claude-code-agent-id"),
)


@dataclass(frozen=True)
class RolePolicies:
    """The compaction policy of every role (``main`` required; a role left out uses it), and
    the rules that choose the role of a request (``default_role`` when none matches)."""

    policies: Mapping[str, CompactionPolicy]
    rules: tuple[RoleRule, ...] = DEFAULT_ROLE_RULES
    default_role: str = "main"
    _resolved: Mapping[str, CompactionPolicy] = field(init=False, repr=False, compare=False)
    _header_names: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.policies) - set(ROLE_NAMES))
        if unknown:
            raise ValueError(f"unknown role {unknown[0]!r} in policies; roles are "
                             f"{', '.join(ROLE_NAMES)}")
        if "main" not in self.policies:
            raise ValueError("policies must include the 'main' role")
        for role, policy in self.policies.items():
            if not isinstance(policy, CompactionPolicy):
                raise ValueError(f"policy for role {role!r} must be a CompactionPolicy")
        if self.default_role not in ROLE_NAMES:
            raise ValueError(f"default_role must be one of {', '.join(ROLE_NAMES)}, got "
                             f"{self.default_role!r}")
        rules = tuple(self.rules)
        main = self.policies["main"]
        resolved = {role: self.policies.get(role, main) for role in ROLE_NAMES}
        object.__setattr__(self, "policies", MappingProxyType(dict(self.policies)))
        object.__setattr__(self, "rules", rules)
        object.__setattr__(self, "_resolved", MappingProxyType(resolved))
        object.__setattr__(self, "_header_names",
                           tuple(dict.fromkeys(r.header for r in rules if r.header is not None)))

    def policy_for(self, role: str) -> CompactionPolicy:
        """The policy of ``role`` (``main``'s for a role given none); ``KeyError`` for no role."""
        return self._resolved[role]

    def select(self, headers: Mapping[str, str], model: str | None) -> tuple[str, CompactionPolicy]:
        """The role of a request and its policy: the first matching rule's role, else the default.
        ``headers``: any mapping (a dict, aiohttp's headers); names compared in any case."""
        lowered = self._lowered(headers) if self._header_names else {}
        for rule in self.rules:
            if rule.matches(lowered, model):
                return rule.role, self._resolved[rule.role]
        return self.default_role, self._resolved[self.default_role]

    def _lowered(self, headers: Mapping[str, str]) -> Mapping[str, str]:
        """The headers the rules test, by lower-case name (the last value of a repeated one)."""
        getall = getattr(headers, "getall", None)
        if getall is not None and type(headers).__name__ in _CASE_INSENSITIVE:
            # aiohttp's headers: looked up by name, not lower-cased one by one.
            return {name: values[-1] for name in self._header_names
                    if (values := getall(name, None))}
        return {name.lower(): value for name, value in headers.items()}
