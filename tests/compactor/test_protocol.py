"""Tool-call protocol validation: what is accepted, and each kind of violation."""

from __future__ import annotations

import pytest

from compactor import MessageShapeError, ToolProtocolError, validate_tool_protocol

from .builders import (
    assistant,
    server_pair,
    system_message,
    text,
    thinking,
    tool_result,
    tool_use,
    user,
)


def test_parallel_calls_answered_in_any_order_are_accepted() -> None:
    """Two calls in one assistant message may be answered in either order."""
    messages = [user("go"), assistant(tool_use("a"), tool_use("b")),
                user(tool_result("b"), tool_result("a"))]
    interactions = validate_tool_protocol(messages)
    assert [i.tool_use_id for i in interactions.values()] == ["a", "b"]
    assert all(i.use_index == 1 and i.result_index == 2 for i in interactions.values())


def test_text_after_results_is_accepted() -> None:
    """A user message may carry text after its tool_result blocks."""
    messages = [user("go"), assistant(tool_use("a")), user(tool_result("a"), "and also lint")]
    assert validate_tool_protocol(messages)["a"].kind == "client"


def test_interaction_map_records_name_input_and_error_flag() -> None:
    """The map says which tool ran, with what input, and whether it failed."""
    messages = [user("go"), assistant(tool_use("a", "Read", file_path="/x")),
                user(tool_result("a", "boom", is_error=True))]
    interaction = validate_tool_protocol(messages)["a"]
    assert (interaction.name, interaction.tool_input, interaction.is_error) == (
        "Read", {"file_path": "/x"}, True)


def test_server_tool_pair_inside_one_assistant_message_is_accepted() -> None:
    """server_tool_use and its *_tool_result live in one assistant message."""
    messages = [user("search"), assistant(thinking(), *server_pair("srv1"), "found it")]
    interaction = validate_tool_protocol(messages)["srv1"]
    assert (interaction.kind, interaction.use_index, interaction.result_index) == ("server", 1, 1)


def test_mcp_pair_is_accepted() -> None:
    """mcp_tool_use / mcp_tool_result pair up like server tools."""
    messages = [user("q"), assistant(
        {"type": "mcp_tool_use", "id": "m1", "name": "lookup", "server_name": "s", "input": {}},
        {"type": "mcp_tool_result", "tool_use_id": "m1", "content": "r", "is_error": False})]
    assert validate_tool_protocol(messages)["m1"].kind == "server"


def test_server_use_without_result_stands_alone() -> None:
    """A paused server turn (use, no result yet) is not a violation."""
    messages = [user("q"), assistant({"type": "server_tool_use", "id": "s1", "name": "web_search",
                                      "input": {}}), user("continue")]
    assert validate_tool_protocol(messages)["s1"].result_index is None


def test_role_system_messages_are_transparent_between_use_and_result() -> None:
    """A role-system message between a call and its answer does not break adjacency."""
    messages = [user("go"), assistant(tool_use("a")), system_message("be brief"),
                user(tool_result("a"))]
    assert validate_tool_protocol(messages)["a"].result_index == 3


#: Each broken history, with the kind, id and message index it is named by.
VIOLATIONS = [
    ([user("go"), assistant(tool_use("a"))], "missing", "a", 1),
    ([user("go"), assistant(tool_use("a"), tool_use("b")), user(tool_result("a"))],
     "missing", "b", 1),
    ([user("go"), assistant(tool_use("a")), user("no result")], "missing", "a", 1),
    ([user(tool_result("zz"))], "unknown", "zz", 0),
    ([user("go"), assistant("hi"), user(tool_result("zz"))], "unknown", "zz", 2),
    ([user("go"), assistant(tool_use("a")), user(tool_result("a")), assistant(tool_use("a")),
      user(tool_result("a"))], "duplicate", "a", 3),
    ([user("go"), assistant(tool_use("a")), user(tool_result("a"), tool_result("a"))],
     "duplicate", "a", 2),
    ([user("go"), assistant(tool_use("a")), user(text("first"), tool_result("a"))],
     "out_of_order", "a", 2),
    ([user("go"), user(tool_result("a")), assistant(tool_use("a"))], "out_of_order", "a", 1),
    ([user("go"), assistant(tool_use("a")), user("wait"), assistant("ok"), user(tool_result("a"))],
     "not_adjacent", "a", 1),
    ([user("q"), assistant({"type": "web_search_tool_result", "tool_use_id": "s9", "content": []})],
     "unknown", "s9", 1),
    ([user("q"), assistant({"type": "web_search_tool_result", "tool_use_id": "s1", "content": []},
                           {"type": "server_tool_use", "id": "s1", "name": "web_search",
                            "input": {}})],
     "out_of_order", "s1", 1),
]


@pytest.mark.parametrize(("messages", "kind", "tool_use_id", "index"), VIOLATIONS)
def test_violations_raise_with_kind_id_and_index(messages: list, kind: str, tool_use_id: str,
                                                index: int) -> None:
    """Each broken history is named by kind, id and message index."""
    with pytest.raises(ToolProtocolError) as caught:
        validate_tool_protocol(messages)
    error = caught.value
    assert (error.kind, error.tool_use_id, error.message_index) == (kind, tool_use_id, index)
    assert tool_use_id in str(error)


@pytest.mark.parametrize("messages", [
    "not a list",
    [42],
    [{"role": "user", "content": [7]}],
    [{"role": "user", "content": None}],
    [{"role": "user", "content": [{"type": "tool_result"}]}],
])
def test_malformed_shapes_raise_value_error_naming_the_place(messages: object) -> None:
    """A message or block that is not an object is a ValueError, not a crash."""
    with pytest.raises(ValueError, match="messages"):
        validate_tool_protocol(messages)  # type: ignore[arg-type]


#: Each malformed input, with the place and problem it is named by.
SHAPES = [
    ("not a list", "messages", "must be a list"),
    ([42], "messages.0", "must be an object"),
    ([{"role": "user", "content": [{"type": "text", "text": "a"}, 7]}],
     "messages.0.content.1", "must be an object"),
    ([{"role": "user", "content": None}], "messages.0.content",
     "must be a string or a list of blocks"),
    ([{"role": "user", "content": "q"},
      {"role": "assistant", "content": [{"type": "tool_use", "name": "Read", "input": {}}]}],
     "messages.1", "tool_use block has no id"),
]


@pytest.mark.parametrize(("messages", "path", "problem"), SHAPES)
def test_malformed_shapes_raise_the_dedicated_shape_error(messages: object, path: str,
                                                          problem: str) -> None:
    """The client's own mistake is a MessageShapeError (still a ValueError) carrying where and
    what, so a caller can tell it from a bug that happens to raise ValueError."""
    with pytest.raises(MessageShapeError) as caught:
        validate_tool_protocol(messages)  # type: ignore[arg-type]
    assert (caught.value.path, caught.value.problem) == (path, problem)
    assert str(caught.value) == f"{path}: {problem}"
    assert isinstance(caught.value, ValueError)
