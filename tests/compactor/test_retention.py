"""Issue #34: what the user typed, and what the agent touched, survives L3 and L4 verbatim."""

from __future__ import annotations

import json
from typing import Any

from compactor import (
    CachingCounter,
    Chars4Counter,
    MessageViewLimitExceeded,
    compact_context,
    validate_tool_protocol,
)
from compactor._l3_prune import prune_old_messages
from compactor._record import parse_record
from compactor._trail import artifact_trail
from compactor._user_text import person_texts
from compactor._view import View
from policies import DEFAULT_READ_TOOLS, CompactionPolicy
from proxy.fake_upstream.rules import check_messages_request

from .builders import assistant, exchange, text, thinking, tool_result, tool_use, user

Message = dict[str, Any]


def _valid(messages: list[Message], *, thinking_on: bool = False) -> None:
    body: dict[str, Any] = {"model": "m", "max_tokens": 2048, "messages": messages}
    if thinking_on:
        body["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    check_messages_request(body)


def _all_text(messages: list[Message]) -> str:
    return json.dumps(messages, ensure_ascii=False)


def _strings(messages: list[Message]) -> str:
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(messages)
    return "\n".join(found)


def _session(requests: int, big: int = 3_000) -> list[Message]:
    """Person-typed requests, each followed by a read, an edit and a failing test run."""
    messages: list[Message] = [user("Fix the billing module.")]
    for n in range(requests):
        if n:
            messages.append(user(f"Request {n}: never rename the column invoice_{n}_id.\n\n"
                                 "<system-reminder>\nTodo list empty.\n</system-reminder>"))
        messages += exchange(f"r{n}", "x" * big, name="Read", file_path=f"/src/bill_{n}.py")
        messages += exchange(f"e{n}", "done", name="Edit", file_path=f"/src/bill_{n}.py",
                             old_string="a", new_string="b")
        messages += [assistant("Testing.", tool_use(f"b{n}", "Bash", command=f"pytest -k t{n}")),
                     user(tool_result(f"b{n}", f"Exit code 1\nFAILED t{n}\n" + "y" * big,
                                      is_error=True))]
        messages.append(assistant(f"Request {n} handled."))
    messages.append(user("What is left?"))
    return messages


# -- person text ------------------------------------------------------------------------------

def test_person_texts_leave_out_what_the_harness_injected() -> None:
    """Claude Code's wrappers (command echoes, local command output, reminders, interruption
    markers, task notices) are not a person's words; a reminder appended to typed text is
    removed from it."""
    message = user(text("<command-name>/clear</command-name>\n<command-message>clear"
                        "</command-message>"),
                   text("<local-command-stdout></local-command-stdout>"),
                   text("[Request interrupted by user for tool use]"),
                   text("<task-notification>\n<task-id>b1</task-id>\n</task-notification>"),
                   text("Use port 8443.\n\n<system-reminder>\nx\n</system-reminder>"))
    assert person_texts(message) == ["Use port 8443."]
    assert person_texts(user(tool_result("t", "a tool's output"))) == []
    assert person_texts(assistant("the model's words")) == []


# -- artifact trail ---------------------------------------------------------------------------

def test_the_trail_lists_reads_edits_and_runs_with_their_status_newest_last() -> None:
    """Paths and commands come from the calls themselves; a repeated one moves to its latest
    place; the exit status is read from the result."""
    messages = [
        *exchange("a", "text", name="Read", file_path="/a.py"),
        *exchange("b", "ok", name="Edit", file_path="/a.py", old_string="x", new_string="y"),
        assistant(tool_use("c", "Bash", command="make test")),
        user(tool_result("c", "Exit code 2\nboom", is_error=True)),
        *exchange("d", "text", name="Read", file_path="/b.py"),
        *exchange("e", "text", name="Read", file_path="/a.py"),
        *exchange("f", "ok", name="Write", file_path="/c.py", content="..."),
    ]
    assert artifact_trail(messages, DEFAULT_READ_TOOLS) == [
        "edited /a.py", "ran make test (exit 2)", "read /b.py", "read /a.py", "wrote /c.py"]


# -- L3 ---------------------------------------------------------------------------------------

def _l3(messages: list[Message], **policy: Any) -> tuple[View, int]:
    view = View(messages, CachingCounter(Chars4Counter()))
    return prune_old_messages(view, validate_tool_protocol(messages),
                              CompactionPolicy(keep_recent_messages=3, **policy))


def test_l3_keeps_what_the_user_typed_where_it_cut() -> None:
    """The person's texts of the dropped span stay verbatim, in order, in one record right
    after the original intent; the view is one the strict provider accepts."""
    messages = _session(5)
    view, dropped = _l3(messages)
    assert dropped > 0
    record = view.messages[1]
    assert view.messages[0] is messages[0] and record["role"] == "user"
    kept = parse_record(record["content"][0]["text"])
    assert kept.user_texts == tuple(
        f"Request {n}: never rename the column invoice_{n}_id." for n in range(1, 5))
    assert "system-reminder" not in record["content"][0]["text"]
    _valid(view.messages)


def test_l3_keeps_the_artifact_trail_of_what_it_dropped() -> None:
    """Every file and command of the dropped calls is in the record, with the exit status."""
    view, _ = _l3(_session(5))
    trail = parse_record(view.messages[1]["content"][0]["text"]).trail
    assert trail[:3] == ("read /src/bill_0.py", "edited /src/bill_0.py",
                         "ran pytest -k t0 (exit 1)")
    assert "ran pytest -k t3 (exit 1)" in trail


def test_over_the_budget_the_oldest_user_texts_go() -> None:
    """With room for about two texts, the two newest stay."""
    view, _ = _l3(_session(5), user_text_budget_tokens=30, artifact_trail_budget_tokens=0)
    kept = parse_record(view.messages[1]["content"][0]["text"])
    assert kept.user_texts == (
        "Request 3: never rename the column invoice_3_id.",
        "Request 4: never rename the column invoice_4_id.")
    assert kept.trail == ()


def _heredoc(path: str, lines: int) -> str:
    """A command writing ``path`` with a heredoc of ``lines`` lines (ending in ``EOF``)."""
    body = "".join(f"    value_{i} = compute({i})  # for {path}\n" for i in range(lines))
    return f"cat > {path} <<'EOF'\ndef main():\n{body}EOF"


def _chars4_within(entries: list[str], budget: int) -> list[str]:
    """The newest of ``entries`` that fit ``budget`` at 4 chars a token, each with its line
    break (and, spanning lines, its ``<trail-entry>`` lines): the rule the trail promises."""
    kept: list[str] = []
    used = 0
    for entry in reversed(entries):
        rendered = f"<trail-entry>\n{entry}\n</trail-entry>" if "\n" in entry else entry
        used += (len(rendered) + 1 + 3) // 4
        if used > budget:
            break
        kept.append(entry)
    return kept[::-1]


def test_over_the_trail_budget_the_newest_entries_stay() -> None:
    """A long run of commands after an edit: the budget is filled newest first, by what each
    entry costs as written, so the trail is exactly the newest entries that fit; the older
    edit is the first to go."""
    messages: list[Message] = [user("go")]
    messages += exchange("e0", "ok", name="Edit", file_path="/src/old_edit.py", old_string="a",
                         new_string="b")
    for n in range(30):
        messages += exchange(f"b{n}", "z" * 2_000, command=f"pytest -k case{n}")
    every = artifact_trail(messages[:-4], DEFAULT_READ_TOOLS)
    view, _ = _l3(messages, artifact_trail_budget_tokens=60)
    trail = parse_record(view.messages[1]["content"][0]["text"]).trail
    assert trail == tuple(_chars4_within(every, 60))
    assert "edited /src/old_edit.py" not in trail and len(trail) > 2
    _valid(view.messages)


def test_a_long_command_within_the_budget_is_kept_whole() -> None:
    """A heredoc of thousands of characters is one entry, kept verbatim with its exit status
    when it fits the budget."""
    command = _heredoc("/src/gen.py", 80)
    assert len(command) > 3_000
    messages: list[Message] = [user("go"), *exchange("r0", "x", name="Read", file_path="/a.py")]
    messages += [assistant(tool_use("h0", "Bash", command=command)),
                 user(tool_result("h0", "Exit code 0"))]
    for n in range(8):
        messages += exchange(f"b{n}", "z" * 2_000, command=f"make step{n}")
    view, _ = _l3(messages, artifact_trail_budget_tokens=2_000)
    trail = parse_record(view.messages[1]["content"][0]["text"]).trail
    assert trail[:2] == ("read /a.py", f"ran {command} (exit 0)")
    assert f"ran {command} (exit 0)" in _strings(view.messages)
    _valid(view.messages)


def test_a_command_longer_than_the_whole_budget_is_cut_and_the_older_entries_stay() -> None:
    """Only a command that alone costs more than the whole budget is cut (the start of its
    first line, its status kept); it costs what its cut form costs, so older entries fit."""
    command = _heredoc("/src/huge.py", 200)
    messages: list[Message] = [user("go"), *exchange("r0", "x", name="Read", file_path="/a.py")]
    messages += [assistant(tool_use("h0", "Bash", command=command)),
                 user(tool_result("h0", "Exit code 3", is_error=True))]
    for n in range(8):
        messages += exchange(f"b{n}", "z" * 2_000, command=f"make step{n}")
    view, _ = _l3(messages, artifact_trail_budget_tokens=100)
    trail = parse_record(view.messages[1]["content"][0]["text"]).trail
    cut = f"ran cat > /src/huge.py <<'EOF' …[cut: {len(command) - 26} more chars] (exit 3)"
    assert trail[:2] == ("read /a.py", cut)
    assert "value_1 = compute" not in _strings(view.messages)


def test_a_merge_keeps_commands_of_several_lines_whole() -> None:
    """A second L3 reads the first record's trail back entry by entry: two heredocs that both
    end in ``EOF`` stay whole and in order, not split into lines and deduplicated."""
    first_cmd, second_cmd = _heredoc("/src/one.py", 3), _heredoc("/src/two.py", 3)
    messages: list[Message] = [user("go")]
    for n, command in enumerate((first_cmd, second_cmd)):
        messages += [assistant(tool_use(f"h{n}", "Bash", command=command)),
                     user(tool_result(f"h{n}", "Exit code 0"))]
    for n in range(8):
        messages += exchange(f"b{n}", "z" * 2_000, command=f"make step{n}")
    first, _ = _l3(messages, artifact_trail_budget_tokens=2_000)
    grown = [*first.messages]
    for n in range(8, 16):
        grown += exchange(f"b{n}", "z" * 2_000, command=f"make step{n}")
    view, _ = _l3(grown, artifact_trail_budget_tokens=2_000)
    records = [m for m in view.messages if "compact-proxy-summary" in _all_text([m])]
    assert len(records) == 1
    trail = parse_record(records[0]["content"][0]["text"]).trail
    assert trail[:3] == (f"ran {first_cmd} (exit 0)", f"ran {second_cmd} (exit 0)",
                         "ran make step0")
    _valid(view.messages)


def test_budgets_of_zero_keep_nothing_and_add_no_message() -> None:
    """Both budgets at 0: L3 drops as it did before issue #34."""
    messages = _session(5)
    view, dropped = _l3(messages, user_text_budget_tokens=0, artifact_trail_budget_tokens=0)
    assert dropped > 0 and len(view.messages) == len(messages) - dropped
    assert "compact-proxy-summary" not in _all_text(view.messages)


def test_a_second_l3_folds_the_first_record_into_its_own() -> None:
    """The record of an earlier cut is dropped with the next span and carried forward
    verbatim, so records never pile up."""
    first, _ = _l3(_session(5))
    grown = [*first.messages]
    grown[-1] = {**grown[-1]}
    for n in range(5, 8):
        grown += [assistant(f"Answer {n}."), user(f"Later request {n}.")]
    view, _ = _l3(grown)
    records = [m for m in view.messages if "compact-proxy-summary" in _all_text([m])]
    assert len(records) == 1
    kept = parse_record(records[0]["content"][0]["text"])
    assert kept.user_texts[0] == "Request 1: never rename the column invoice_1_id."
    assert kept.user_texts[-1] == "Later request 5."  # 6 is in the kept recent turns
    _valid(view.messages)


def test_l3_puts_its_record_before_the_protected_opener_of_a_tool_loop() -> None:
    """In a tool loop whose opener holds the only thinking block, the record goes before the
    opener: a user text inside the turn would end it, and the provider would refuse."""
    messages: list[Message] = [user("Start."), assistant("Sure."), user("Do the migration.")]
    messages += [assistant(thinking(), tool_use("t0", "Bash", command="ls")),
                 user(tool_result("t0", "a"), text("Also keep the logs."))]
    for n in range(1, 8):
        messages += exchange(f"t{n}", "z" * 500, command=f"step {n}")
    view, dropped = _l3(messages)
    assert dropped > 0
    _valid(view.messages, thinking_on=True)
    opener = next(i for i, m in enumerate(view.messages) if m is messages[3])
    assert "compact-proxy-summary" in _all_text([view.messages[opener - 1]])
    assert "Do the migration." in _strings(view.messages)


# -- L4 ---------------------------------------------------------------------------------------

def _compact(messages: list[Message], **policy: Any) -> list[Message]:
    """Compacted so low that L3 (keeping 14 messages) is not enough and L4 runs."""
    size = len(json.dumps(messages)) // 4
    budgets = {"user_text_budget_tokens": 10_000, "artifact_trail_budget_tokens": 10_000}
    rules = CompactionPolicy(soft_threshold_tokens=size // 8, hard_limit_tokens=size * 4,
                             keep_recent_messages=14, summary_keep_recent=3,
                             **(budgets | policy))
    return compact_context(messages, None, policy=rules, counter=Chars4Counter(),
                           summarizer=lambda span: "Work went on.").messages


def test_l4_keeps_user_texts_and_trail_with_the_summary() -> None:
    """The summary block carries the span's user texts verbatim and its artifact trail."""
    view = _compact(_session(6))
    haystack = _strings(view)
    assert "Work went on." in haystack
    for n in range(1, 6):
        assert f"Request {n}: never rename the column invoice_{n}_id." in haystack
        assert f"/src/bill_{n - 1}.py" in haystack
    _valid(view)


def test_a_merged_summary_keeps_the_earlier_texts_and_trail_verbatim() -> None:
    """A second L4 over a span holding the first summary keeps what the first kept, not a
    model's re-telling of it."""
    first = _compact(_session(6))
    grown = [*first]
    for n in range(6, 12):
        grown += [assistant(f"Answer {n}.", tool_use(f"g{n}", "Bash", command=f"deploy {n}")),
                  user(tool_result(f"g{n}", "q" * 3_000), text(f"Then step {n}."))]
    grown += [assistant("Done."), user("And now?")]
    view = _compact(grown)
    haystack = _strings(view)
    assert haystack.count("compact-proxy-summary messages") == 1
    assert "Request 1: never rename the column invoice_1_id." in haystack
    assert "Then step 9." in haystack and "ran deploy 8" in haystack
    assert "edited /src/bill_0.py" in haystack
    _valid(view)


# -- never pay for a summary that cannot help -------------------------------------------------

def test_a_paste_over_the_hard_limit_is_refused_without_a_summary_call() -> None:
    """A 110k-token paste under a 40k hard limit: what is always kept (the last message) is
    over the limit, so the view is refused at once and no summary is asked for."""
    messages: list[Message] = [user("Fix the build.")]
    for n in range(20):
        messages += exchange(f"t{n}", "log line\n" * 400, command=f"make step{n}")
    messages[-1] = user(tool_result("t19", "ok"), text("x" * 440_000))
    calls: list[str] = []
    policy = CompactionPolicy(soft_threshold_tokens=30_000, hard_limit_tokens=40_000)

    def summarise(span: str) -> str:
        calls.append(span)
        return "a summary"

    try:
        compact_context(messages, None, policy=policy, counter=Chars4Counter(),
                        summarizer=summarise)
    except MessageViewLimitExceeded as refused:
        assert refused.tokens_after >= 40_000
    else:
        raise AssertionError("a view over the hard limit was not refused")
    assert calls == []


def test_a_summary_is_still_made_when_it_can_help() -> None:
    """The same history without the paste: L4 runs and the view fits."""
    messages: list[Message] = [user("Fix the build.")]
    for n in range(40):
        messages += exchange(f"t{n}", "log line\n" * 400, command=f"make step{n}")
    calls: list[str] = []
    policy = CompactionPolicy(soft_threshold_tokens=3_000, hard_limit_tokens=4_000,
                              keep_recent_messages=30)
    result = compact_context(messages, None, policy=policy, counter=Chars4Counter(),
                             summarizer=lambda span: calls.append(span) or "a summary")
    assert calls and "L4" in result.layers_applied
