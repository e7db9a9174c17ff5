"""Tests for policies._roles: role rules and per-role policy selection."""

from __future__ import annotations

import json

import pytest

from policies import ROLE_NAMES, CompactionPolicy, RolePolicies, RoleRule
from tests.paths import CORPUS

MAIN = CompactionPolicy()
SUBAGENT = CompactionPolicy(soft_threshold_tokens=40_000, hard_limit_tokens=60_000)
RECOVERY = CompactionPolicy(summary_enabled=False)


def test_role_names_are_the_three_spec_roles() -> None:
    """The roles are main, subagent and summary_recovery, in that order."""
    assert ROLE_NAMES == ("main", "subagent", "summary_recovery")


def test_default_rules_make_claude_code_agent_requests_subagents() -> None:
    """A request carrying x-claude-code-agent-id gets the subagent role and policy."""
    roles = RolePolicies({"main": MAIN, "subagent": SUBAGENT})
    assert roles.select({"x-claude-code-agent-id": "agent-1"}, "claude-sonnet-4-5") == (
        "subagent",
        SUBAGENT,
    )


def test_request_without_agent_header_gets_the_default_role() -> None:
    """A request no rule matches gets the default role, main."""
    roles = RolePolicies({"main": MAIN, "subagent": SUBAGENT})
    assert roles.select({"x-api-key": "k"}, "claude-sonnet-4-5") == ("main", MAIN)


def test_header_names_match_case_insensitively() -> None:
    """The header condition ignores the case of the header name the client sent."""
    roles = RolePolicies({"main": MAIN, "subagent": SUBAGENT})
    assert roles.select({"X-Claude-Code-Agent-Id": "a"}, None)[0] == "subagent"


def test_aiohttp_headers_are_accepted() -> None:
    """select works on aiohttp's case-insensitive multidict headers as they arrive."""
    from multidict import CIMultiDict, CIMultiDictProxy

    headers = CIMultiDictProxy(CIMultiDict([("X-Claude-Code-Agent-Id", "a"), ("Host", "h")]))
    roles = RolePolicies({"main": MAIN, "subagent": SUBAGENT})
    assert roles.select(headers, None) == ("subagent", SUBAGENT)


def test_role_without_policy_falls_back_to_main() -> None:
    """A rule naming a role that has no policy selects that role with the main policy."""
    roles = RolePolicies({"main": MAIN})
    assert roles.select({"x-claude-code-agent-id": "a"}, None) == ("subagent", MAIN)
    assert roles.policy_for("summary_recovery") is MAIN


def test_first_matching_rule_wins() -> None:
    """Rules are tried in order; the first that matches decides the role."""
    rules = (
        RoleRule("summary_recovery", header="x-role", header_pattern="recovery"),
        RoleRule("subagent", header="x-role"),
    )
    roles = RolePolicies(
        {"main": MAIN, "subagent": SUBAGENT, "summary_recovery": RECOVERY}, rules=rules
    )
    assert roles.select({"x-role": "recovery"}, None) == ("summary_recovery", RECOVERY)
    assert roles.select({"x-role": "other"}, None) == ("subagent", SUBAGENT)


@pytest.mark.parametrize(
    ("headers", "model", "matches"),
    [
        ({"x-role": "sub"}, "claude-haiku-4-5", True),
        ({"x-role": "sub"}, "claude-opus-4-5", False),  # model fails
        ({"x-role": "subagent"}, "claude-haiku-4-5", False),  # header value not a full match
        ({}, "claude-haiku-4-5", False),  # header absent
        ({"x-role": "sub"}, None, False),  # no model in the body
    ],
)
def test_rule_matches_only_when_every_condition_holds(
    headers: dict[str, str], model: str | None, matches: bool
) -> None:
    """A rule with header, header_pattern and model_pattern needs all three to hold."""
    rule = RoleRule(
        "subagent", header="X-Role", header_pattern="sub", model_pattern="claude-haiku-.*"
    )
    roles = RolePolicies({"main": MAIN, "subagent": SUBAGENT}, rules=(rule,))
    assert (roles.select(headers, model)[0] == "subagent") is matches


def test_model_pattern_selects_role_for_real_corpus_bodies() -> None:
    """A model_pattern rule picks the role from the model of real request bodies."""
    rule = RoleRule("subagent", model_pattern=r"claude-sonnet-4-5(-\d+)?")
    roles = RolePolicies({"main": MAIN, "subagent": SUBAGENT}, rules=(rule,))
    seen = set()
    for path in sorted(CORPUS.glob("m-claude__*.json"))[:10]:
        model = json.loads(path.read_text())["model"]
        role, _ = roles.select({}, model)
        assert role == ("subagent" if model.startswith("claude-sonnet-4-5") else "main")
        seen.add(role)
    assert seen == {"main", "subagent"}


def test_empty_rules_send_everything_to_the_default_role() -> None:
    """With no rules, even a Claude Code subagent request gets the default role."""
    roles = RolePolicies({"main": MAIN, "subagent": SUBAGENT}, rules=(), default_role="main")
    assert roles.select({"x-claude-code-agent-id": "a"}, None) == ("main", MAIN)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"role": "boss", "header": "x-a"}, "role must be one of"),
        ({"role": "main"}, "at least one condition"),
        ({"role": "main", "header_pattern": "x"}, "header_pattern needs header"),
        ({"role": "main", "header": "bad header"}, "HTTP header name"),
        ({"role": "main", "header": "x-a", "header_pattern": "("}, "header_pattern is not a valid"),
        ({"role": "main", "model_pattern": "[a-"}, "model_pattern is not a valid"),
    ],
)
def test_bad_rule_is_refused_naming_the_problem(kwargs: dict[str, str], fragment: str) -> None:
    """RoleRule raises ValueError naming the bad field at construction."""
    with pytest.raises(ValueError, match=fragment):
        RoleRule(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"policies": {"subagent": SUBAGENT}}, "'main'"),
        ({"policies": {"main": MAIN, "boss": MAIN}}, "unknown role 'boss'"),
        ({"policies": {"main": MAIN}, "default_role": "boss"}, "default_role"),
        ({"policies": {"main": {"soft": 1}}}, "must be a CompactionPolicy"),
    ],
)
def test_bad_role_policies_are_refused(kwargs: dict[str, object], fragment: str) -> None:
    """RolePolicies raises ValueError for a missing main policy or unknown roles."""
    with pytest.raises(ValueError, match=fragment):
        RolePolicies(**kwargs)  # type: ignore[arg-type]


def test_role_policies_are_frozen() -> None:
    """RolePolicies and RoleRule cannot be changed after construction."""
    roles = RolePolicies({"main": MAIN})
    with pytest.raises(AttributeError):
        roles.default_role = "subagent"  # type: ignore[misc]
    with pytest.raises(TypeError):
        roles.policies["subagent"] = SUBAGENT  # type: ignore[index]


@pytest.mark.parametrize("names", [("X-Claude-Code-Agent-Id", "x-claude-code-agent-id"),
                                   ("x-claude-code-agent-id",), ("X-Other",)])
def test_aiohttp_headers_select_as_a_plain_mapping_does(names: tuple[str, ...]) -> None:
    """aiohttp's case-insensitive headers are looked up by the rules' names, not lower-cased
    one by one: the same role as the same headers in a plain dict (the last value of a
    repeated header), for every spelling."""
    from multidict import CIMultiDict, CIMultiDictProxy

    policies = RolePolicies(
        {"main": CompactionPolicy(), "subagent": CompactionPolicy(soft_threshold_tokens=9_000)},
        rules=(RoleRule("subagent", header="x-claude-code-agent-id", header_pattern="agent-2"),))
    pairs = [(name, f"agent-{number}") for number, name in enumerate(names, start=1)]
    plain = {}
    for name, value in pairs:
        plain[name.lower()] = value
    multi = CIMultiDict(pairs)
    assert policies.select(CIMultiDictProxy(multi), None) == policies.select(plain, None)
    assert policies.select(multi, None) == policies.select(plain, None)
    expected = "subagent" if len(names) == 2 else "main"
    assert policies.select(CIMultiDictProxy(multi), None)[0] == expected
