"""ProtocolMemo: a history that extends one validated before is checked from where that one
ended, with exactly the result (or the error) of checking it whole."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compactor import (
    MessageShapeError,
    ProtocolMemo,
    ToolProtocolError,
    validate_tool_protocol,
)
from compactor._fingerprint import fingerprint

from .builders import assistant, long_session, text, tool_result, tool_use, user
from .strategies import History, histories
from .test_properties import PROPERTY
from .test_protocol import SHAPES, VIOLATIONS


def _prints(messages: list[dict[str, Any]]) -> list[int]:
    return [fingerprint(m) for m in messages]


def _outcome(check: Any) -> tuple[str, Any]:
    """What a check gives: its map, or its error's class and naming."""
    try:
        return "map", check()
    except ToolProtocolError as error:
        return "protocol", (error.kind, error.tool_use_id, error.message_index, str(error))
    except MessageShapeError as error:
        return "shape", (error.path, error.problem)


@PROPERTY
@given(histories(min_turns=1, max_turns=14), st.data())
def test_a_valid_history_validated_from_any_earlier_cut_gives_the_whole_map(
        history: History, data: st.DataObject) -> None:
    """Every request of a session through one memo: the same map as checking each whole."""
    messages = history.messages
    cuts = sorted(data.draw(st.sets(st.integers(1, len(messages)), max_size=5)))
    memo = ProtocolMemo()
    for cut in [*cuts, len(messages)]:
        request = messages[:cut]
        assert _outcome(lambda r=request: memo.validate(r, _prints(r))) \
            == _outcome(lambda r=request: validate_tool_protocol(r))


@pytest.mark.parametrize(("messages", "kind", "tool_use_id", "index"), VIOLATIONS)
def test_a_violation_after_any_cut_is_named_as_the_whole_check_names_it(
        messages: list, kind: str, tool_use_id: str, index: int) -> None:
    """Whatever prefix the memo walked before, the broken history raises the same error."""
    for cut in range(len(messages) + 1):
        memo = ProtocolMemo()
        _outcome(lambda c=cut, m=memo: m.validate(messages[:c], _prints(messages[:c])))
        with pytest.raises(ToolProtocolError) as caught:
            memo.validate(messages, _prints(messages))
        error = caught.value
        assert (error.kind, error.tool_use_id, error.message_index) \
            == (kind, tool_use_id, index), cut


@pytest.mark.parametrize(("messages", "path", "problem"),
                         [case for case in SHAPES if isinstance(case[0], list)])
def test_a_malformed_message_after_a_walked_prefix_is_named_the_same(
        messages: list, path: str, problem: str) -> None:
    """A valid session, then the malformed messages: the shape error names their place in
    the whole list."""
    session = [user("go"), assistant(text("ok"))]
    whole = [*session, *messages]
    memo = ProtocolMemo()
    memo.validate(session, _prints(session))
    shifted = path.replace("messages.0", "messages.2").replace("messages.1", "messages.3")
    with pytest.raises(MessageShapeError) as caught:
        memo.validate(whole, _prints(whole))
    assert (caught.value.path, caught.value.problem) == (shifted, problem)


def test_the_walked_prefix_is_not_walked_again() -> None:
    """The memo trusts the fingerprints it was given for the prefix it walked: only the new
    messages are looked at (which is what makes a warm request cost what is new in it)."""
    session = long_session(20)
    grown = [*session, assistant(tool_use("new1")), user(tool_result("new1"))]
    memo = ProtocolMemo()
    memo.validate(session, _prints(session))
    # The prefix's objects replaced by ones that would not pass, under the same fingerprints:
    # still the whole map of the real history, so they were not read.
    blind = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "zz"}]}
             for _ in session] + grown[len(session):]
    assert memo.validate(blind, _prints(grown)) == validate_tool_protocol(grown)
    # Without the memo, the same list is refused.
    with pytest.raises(ToolProtocolError):
        validate_tool_protocol(blind)


def test_a_refused_request_is_not_kept_and_its_answered_retry_passes() -> None:
    """A history ending with an unanswered call is refused (and its walk not kept: a kept
    walk has every call answered); the request with the answers passes as checked whole."""
    asked = [user("go"), assistant(tool_use("a"), tool_use("b"))]
    memo = ProtocolMemo()
    with pytest.raises(ToolProtocolError):
        memo.validate(asked, _prints(asked))
    answered = [*asked, user(tool_result("b"), tool_result("a"))]
    assert memo.validate(answered, _prints(answered)) == validate_tool_protocol(answered)


def test_the_memo_holds_at_most_its_bound_and_stays_right_beyond_it() -> None:
    """Walks of other sessions push the oldest out (by messages held); a dropped session is
    checked whole again, with the same answer."""
    memo = ProtocolMemo(max_messages=100, per_start=2)
    sessions = [[user(f"task {n}"), *long_session(10)[1:]] for n in range(12)]
    for session in sessions:
        assert memo.validate(session, _prints(session)) == validate_tool_protocol(session)
        assert len(memo) <= 100
    first = sessions[0]
    assert memo.validate(first, _prints(first)) == validate_tool_protocol(first)


def test_a_retried_request_from_an_earlier_point_is_still_resumed() -> None:
    """The walk before the latest is kept too (a client that retries or branches)."""
    session = long_session(6)
    memo = ProtocolMemo()
    memo.validate(session[:5], _prints(session[:5]))
    memo.validate(session, _prints(session))
    branch = [*session[:5], assistant(text("another answer"))]
    assert memo.validate(branch, _prints(branch)) == validate_tool_protocol(branch)


def test_fingerprints_must_be_one_per_message() -> None:
    with pytest.raises(ValueError, match="fingerprints"):
        ProtocolMemo().validate([user("go")], [])
    with pytest.raises(ValueError):
        ProtocolMemo(max_messages=0)


def test_the_same_history_again_is_its_kept_walk_in_the_same_order() -> None:
    """A request sent again (a retry; count_tokens, then the request) is answered from its
    kept walk without looking at the messages: the same map, in use order."""
    session = [user("go"), assistant(tool_use("a"), tool_use("b")),
               user(tool_result("b"), tool_result("a")), assistant(tool_use("c")),
               user(tool_result("c"))]
    memo = ProtocolMemo()
    first = memo.validate(session, _prints(session))
    blind = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "zz"}]}
             for _ in session]
    again = memo.validate(blind, _prints(session))
    assert list(again.items()) == list(first.items()) \
        == list(validate_tool_protocol(session).items())
    assert [i.use_index for i in again.values()] == [1, 1, 3]
    assert again is not first  # (the caller's own map)


def test_a_staged_memo_reads_the_kept_walks_and_keeps_its_own_only_when_committed() -> None:
    """A request's staged memo (a large body's, in the proxy) resumes from what the shared
    memo kept, and adds its walk to it only when the request is committed."""
    session = long_session(20)
    grown = [*session, assistant(tool_use("new1")), user(tool_result("new1"))]
    shared = ProtocolMemo()
    shared.validate(session, _prints(session))
    held = len(shared)
    staged = shared.staged()
    blind = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "zz"}]}
             for _ in session] + grown[len(session):]
    # Resumed from the shared walk: the prefix is not read.
    assert staged.validate(blind, _prints(grown)) == validate_tool_protocol(grown)
    assert len(shared) == held  # nothing kept yet (a refused request stops here)
    staged.commit()
    assert len(shared) == len(grown)  # the longer walk replaced the one it went on from
    assert shared.validate(blind, _prints(grown)) == validate_tool_protocol(grown)
    staged.commit()  # idempotent
    assert len(shared) == len(grown)
