"""Each layer on its own: what it removes, what it must never touch."""

from __future__ import annotations

import copy
import json

import pytest

from compactor import CachingCounter, Chars4Counter, compact_context, validate_tool_protocol
from compactor._l1_truncate import truncate_tool_results
from compactor._l2_reads import drop_superseded_reads
from compactor._l3_prune import prune_old_messages
from compactor._l4_summary import is_summary_message
from compactor._view import View
from policies import DEFAULT_READ_TOOLS, CompactionPolicy
from proxy.fake_upstream.rules import check_messages_request

from .builders import (
    assistant,
    exchange,
    read_call,
    server_pair,
    system_message,
    text,
    thinking,
    tool_result,
    tool_use,
    user,
)


def _view(messages: list) -> View:
    return View(messages, CachingCounter(Chars4Counter()))


def _valid(messages: list, *, thinking_on: bool = False) -> None:
    body = {"model": "m", "max_tokens": 2048, "messages": messages}
    if thinking_on:
        body["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    check_messages_request(body)


# -- L1 ---------------------------------------------------------------------------------------

def _l1(view: View, max_tool_result_tokens: int) -> tuple[View, int]:
    return truncate_tool_results(view, {}, CompactionPolicy(
        max_tool_result_tokens=max_tool_result_tokens))


def test_l1_keeps_a_head_and_a_larger_tail_and_states_the_original_size() -> None:
    """An oversized result keeps its start and end, with a marker giving the original size."""
    log = "".join(f"line {n:05d}\n" for n in range(5_000))  # 55,000 characters
    messages = [user("go"), *exchange("t1", log)]
    view, changed = _l1(_view(messages), 500)
    result = view.messages[2]["content"][0]["content"]
    assert changed == 1
    assert result.startswith("line 00000\n") and result.endswith("line 04999\n")
    assert "of 55,000 characters" in result
    head, tail = result.split("[... compact-proxy truncated", 1)
    assert len(tail) > len(head)
    assert view.tokens[2] <= 500 + 10


def test_l1_leaves_results_within_the_budget_untouched() -> None:
    """A result under max_tool_result_tokens is the very same object afterwards."""
    messages = [user("go"), *exchange("t1", "short output")]
    view, changed = _l1(_view(messages), 500)
    assert changed == 0 and view.messages[2] is messages[2]


def test_l1_never_cuts_inside_images_or_documents() -> None:
    """Only text parts of a result are cut; image and document blocks stay whole."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                          "data": "iVBORw0KGgo" + "A" * 40_000}}
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                                "data": "d" * 40_000}}
    content = [text("x" * 40_000), image, document]
    messages = [user("go"), assistant(tool_use("t1")), user(tool_result("t1", content))]
    view, _ = _l1(_view(messages), 500)
    new_content = view.messages[2]["content"][0]["content"]
    assert new_content[1] == image and new_content[2] == document
    assert len(new_content[0]["text"]) < 5_000


def test_l1_is_deterministic_and_idempotent() -> None:
    """The same block truncates to the same bytes, and truncating again changes nothing."""
    messages = [user("go"), *exchange("t1", "z" * 30_000 + "\n" + "y" * 30_000)]
    once, _ = _l1(_view(messages), 400)
    again, _ = _l1(_view(copy.deepcopy(messages)), 400)
    assert once.messages == again.messages
    twice, changed = _l1(once, 400)
    assert changed == 0 and twice.messages == once.messages


# -- L2 ---------------------------------------------------------------------------------------

def _reads(*calls: tuple[str, dict, str, bool]) -> list:
    messages: list = [user("Refactor app.py")]
    for tool_id, use, result, is_error in calls:
        messages.append(assistant(use))
        messages.append(user(tool_result(tool_id, result, is_error=is_error), "next"))
    return messages


def _l2(messages: list) -> tuple[View, int]:
    return drop_superseded_reads(_view(messages), validate_tool_protocol(messages),
                                 CompactionPolicy(read_tools=DEFAULT_READ_TOOLS))


def test_l2_drops_an_earlier_read_of_the_same_file_as_a_whole_interaction() -> None:
    """The older Read's tool_use and tool_result both go; the newer one stays."""
    messages = _reads(("r1", read_call("r1", "/src/app.py"), "v1 " * 500, False),
                      ("r2", read_call("r2", "/src/app.py"), "v2 " * 500, False))
    view, dropped = _l2(messages)
    assert dropped == 1
    ids = json.dumps(view.messages)
    assert '"r1"' not in ids and '"r2"' in ids
    _valid(view.messages)


@pytest.mark.parametrize(("first", "second"), [
    (read_call("r1", "/a.py", offset=1, limit=50), read_call("r2", "/a.py", offset=51, limit=50)),
    (read_call("r1", "/a.py"), read_call("r2", "/b.py")),
    (tool_use("r1", "Bash", command="cat /a.py"), read_call("r2", "/a.py")),
])
def test_l2_keeps_reads_of_different_files_or_ranges(first: dict, second: dict) -> None:
    """Different ranges, files or non-read tools are not superseded."""
    messages = _reads(("r1", first, "one", False), ("r2", second, "two", False))
    assert _l2(messages)[1] == 0


def test_l2_ignores_failed_reads() -> None:
    """A failed read neither supersedes nor is superseded."""
    messages = _reads(("r1", read_call("r1", "/a.py"), "v1", False),
                      ("r2", read_call("r2", "/a.py"), "File does not exist.", True))
    assert _l2(messages)[1] == 0


@pytest.mark.parametrize("make_use", [
    lambda i: tool_use(i, "str_replace_based_edit_tool", command="view", path="/a.py"),
    lambda i: tool_use(i, "read_file", path="/a.py"),
])
def test_l2_recognises_the_text_editor_view_and_generic_read_file(make_use) -> None:
    """The text-editor tool's view command and read_file(path) are reads too."""
    messages = _reads(("r1", make_use("r1"), "v1", False), ("r2", make_use("r2"), "v2", False))
    assert _l2(messages)[1] == 1


def test_l2_leaves_parallel_reads_in_the_latest_message_alone() -> None:
    """Two reads of one file in the same assistant message are not superseded."""
    messages = [user("go"), assistant(read_call("r1", "/a.py"), read_call("r2", "/a.py")),
                user(tool_result("r1", "x"), tool_result("r2", "x"))]
    assert _l2(messages)[1] == 0


def test_l2_drops_an_exchange_whose_calls_all_went_whole() -> None:
    """A user turn emptied between two assistant turns goes with the rest of the assistant
    turn it answered: no made-up user text stands in for it (it would end the turn)."""
    messages = [user("go"),
                assistant("Reading.", read_call("r1", "/a.py")), user(tool_result("r1", "old")),
                assistant("Again.", read_call("r2", "/a.py")), user(tool_result("r2", "new"))]
    view, _ = _l2(messages)
    assert [m["role"] for m in view.messages] == ["user", "assistant", "user"]
    assert view.messages[1]["content"][0]["text"] == "Again."
    _valid(view.messages)


def test_l2_drops_an_earlier_turn_left_with_only_thinking() -> None:
    """In a finished turn, a message of thinking plus the superseded call goes entirely, with
    its results turn."""
    messages = [user("go"),
                assistant(thinking(), read_call("r1", "/a.py")), user(tool_result("r1", "old")),
                assistant("Done."), user("now check again"),
                assistant(thinking("again", "sig2"), read_call("r2", "/a.py")),
                user(tool_result("r2", "new"))]
    view, _ = _l2(messages)
    assert len(view.messages) == 5 and view.messages[3]["content"][0]["signature"] == "sig2"
    _valid(view.messages)


def test_l2_keeps_the_read_in_the_opener_of_the_turn_in_progress() -> None:
    """A tool loop is one turn: its opener holds the only thinking block, and the provider
    wants the turn in progress to start with it. L2 leaves that opener's read alone."""
    messages = [user("go"),
                assistant(thinking(), read_call("r1", "/a.py")), user(tool_result("r1", "old")),
                assistant("Again.", read_call("r2", "/a.py")), user(tool_result("r2", "new"))]
    view, changed = _l2(messages)
    assert changed == 0 and view.messages == messages
    _valid(view.messages, thinking_on=True)


# -- L3 ---------------------------------------------------------------------------------------

def _l3(messages: list, keep: int) -> tuple[View, int]:
    # Without the record of what was dropped (tests/compactor/test_retention.py has that).
    return prune_old_messages(_view(messages), validate_tool_protocol(messages),
                              CompactionPolicy(keep_recent_messages=keep,
                                               user_text_budget_tokens=0,
                                               artifact_trail_budget_tokens=0))


def test_l3_keeps_the_first_user_message_and_the_recent_window() -> None:
    """The original intent and the last messages survive; the middle goes."""
    messages = [user("the original intent")]
    for n in range(6):
        messages += [assistant(f"answer {n}"), user(f"question {n}")]
    view, dropped = _l3(messages, 3)
    assert view.messages[0] is messages[0]
    assert view.messages[1:] == messages[-3:]
    assert dropped == len(messages) - 4
    _valid(view.messages)


def test_l3_moves_the_cut_back_to_a_whole_exchange() -> None:
    """A window that would start at a result starts at its call instead: the exchange stays
    whole, and the kept turns never start with a stray answer."""
    messages = [user("go"), *exchange("t1"), *exchange("t2"), *exchange("t3")]
    view, _ = _l3(messages, 3)  # window starts at the t2 result
    assert "t1" not in json.dumps(view.messages)
    assert view.messages[1:] == messages[3:]
    _valid(view.messages)


def test_l3_keeps_only_the_last_exchange_when_asked_for_one_message() -> None:
    """keep_recent=1 keeps the last message and the call it answers, nothing else."""
    messages = [user("go"), *exchange("t1"), *exchange("t2"), *exchange("t3")]
    view, dropped = _l3(messages, 1)
    assert view.messages == [messages[0], *messages[-2:]] and dropped == 4
    _valid(view.messages)


def test_l3_never_drops_role_system_messages() -> None:
    """Messages whose role is neither user nor assistant stay, in order."""
    messages = [user("go"), *exchange("t1"), system_message("mid-conversation rule"),
                *exchange("t2"), *exchange("t3"), *exchange("t4")]
    view, _ = _l3(messages, 2)
    assert [m for m in view.messages if m["role"] == "system"] == [messages[3]]


def test_l3_keeps_server_tool_pairs_together() -> None:
    """A server tool pair lives or dies with its assistant message."""
    messages = [user("go"), assistant(*server_pair("s1"), "found"), user("thanks"),
                assistant(*server_pair("s2"), "again"), user("more")]
    view, _ = _l3(messages, 2)
    dumped = json.dumps(view.messages)
    assert "s1" not in dumped and dumped.count('"s2"') == 2
    _valid(view.messages)


# -- L4 ---------------------------------------------------------------------------------------

POLICY = CompactionPolicy(soft_threshold_tokens=300, hard_limit_tokens=100_000,
                          max_tool_result_tokens=5_000, keep_recent_messages=6,
                          summary_keep_recent=2)


def _session() -> list:
    messages = [user("Original intent: make the build green")]
    for n in range(10):
        messages += exchange(f"t{n}", f"result {n} " * 40, command=f"make step{n}")
    return messages


def test_l4_replaces_the_old_middle_by_a_summary_after_the_first_message() -> None:
    """Head verbatim, one summary message, then the recent messages."""
    messages = _session()
    seen: list[str] = []

    def summarise(payload: str) -> str:
        seen.append(payload)
        return "Intent: green build. Decisions: none."

    result = compact_context(messages, None, policy=POLICY, summarizer=summarise)
    assert result.layers_applied[-1] == "L4"
    assert result.messages[0] == messages[0]
    assert is_summary_message(result.messages[1])
    assert "green build" in result.messages[1]["content"][0]["text"]
    assert result.messages[2:] == messages[-2:]
    assert "make step0" in seen[0] and "Original intent" not in seen[0]
    _valid(result.messages)


def test_l4_moves_the_recent_boundary_back_so_no_interaction_is_split() -> None:
    """With summary_keep_recent=1 the kept turn still starts with the call, not its result."""
    policy = CompactionPolicy(soft_threshold_tokens=300, hard_limit_tokens=100_000,
                              keep_recent_messages=6, summary_keep_recent=1)
    messages = _session()
    result = compact_context(messages, None, policy=policy, summarizer=lambda s: "summary")
    assert result.messages[2:] == messages[-2:]
    _valid(result.messages)


@pytest.mark.parametrize("summariser", [lambda s: "", lambda s: "   ", lambda s: None,
                                        lambda s: 1 / 0])
def test_a_failed_or_empty_summary_never_replaces_history(summariser) -> None:
    """An exception or an empty answer leaves the view as the cheaper layers made it."""
    messages = _session()
    with_failure = compact_context(messages, None, policy=POLICY, summarizer=summariser)
    without_l4 = compact_context(messages, None, policy=POLICY)
    assert with_failure.messages == without_l4.messages
    assert "L4" not in with_failure.layers_applied
    assert with_failure.outcomes[-1].layer == "L4" and with_failure.outcomes[-1].saved == 0


def test_l4_input_leaves_out_thinking_and_binary_data() -> None:
    """The summariser sees no signatures, thinking text or image bytes."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                          "data": "SECRETBYTES" * 100}}
    messages = [user("go"), assistant(thinking("private chain", "SIGNATURE"), tool_use("shot")),
                user(tool_result("shot", [text("shot"), image])), *_session()[1:]]
    seen: list[str] = []
    compact_context(messages, None, policy=POLICY, summarizer=lambda s: seen.append(s) or "sum")
    assert seen and all(x not in seen[0] for x in ("SECRETBYTES", "SIGNATURE", "private chain"))


def test_l4_summarises_what_l3_would_have_dropped() -> None:
    """Messages L3 alone would drop are part of the summariser's input."""
    messages = _session()
    seen: list[str] = []
    compact_context(messages, None, policy=POLICY, summarizer=lambda s: seen.append(s) or "sum")
    assert "make step1" in seen[0]  # outside L3's window of 6, inside L4's middle


def test_l3_keeps_a_first_user_message_even_when_its_content_is_empty() -> None:
    """The original intent is kept as it is, even when it is (invalidly) empty."""
    messages = [{"role": "user", "content": ""}]
    for n in range(6):
        messages += [assistant(f"answer {n}"), user(f"question {n}")]
    view, _ = _l3(messages, 3)
    assert view.messages[0] is messages[0]
