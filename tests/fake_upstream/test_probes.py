"""The fake's probe answers (proxy/fake_upstream/probes.py): correct exactly when the fact's
text is in what it received."""

from __future__ import annotations

from proxy.fake_upstream.probes import UNKNOWN, probe_answer, probe_key
from proxy.fake_upstream.scripts import default_script


def _body(*earlier: dict, probe: str = "PROBE: staging database is named\nWhat is it?") -> dict:
    return {"model": "m", "max_tokens": 8, "system": "You help.",
            "messages": [*earlier, {"role": "user", "content": probe}]}


FACT = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content":
        "Config loaded. The staging database is named pg-staging-7f3a. Pool size 4."}]}


def test_a_fact_in_the_view_is_answered_with_its_sentence() -> None:
    answer = probe_answer(_body({"role": "user", "content": "go"},
                                {"role": "assistant", "content": [
                                    {"type": "tool_use", "id": "t1", "name": "Read",
                                     "input": {"file_path": "/cfg.py"}}]}, FACT))
    assert answer == "The staging database is named pg-staging-7f3a"


def test_a_fact_missing_from_the_view_is_not_known() -> None:
    """The probe's own text names the key but not the fact: it does not count."""
    assert probe_answer(_body({"role": "user", "content": "go"},
                              {"role": "assistant", "content": "ok"})) == UNKNOWN


def test_a_fact_in_system_counts_and_other_requests_are_no_probes() -> None:
    body = _body(probe="PROBE: Pool size\nHow big?")
    body["system"] = [{"type": "text", "text": "Durable: Pool size 4 in staging."}]
    assert probe_answer(body) == "Durable: Pool size 4 in staging"
    assert probe_key({"messages": [{"role": "user", "content": "hello"}]}) is None
    assert probe_answer({"messages": []}) is None


def test_the_default_script_answers_probes() -> None:
    reply = default_script(_body(FACT), None)  # type: ignore[arg-type]
    assert "pg-staging-7f3a" in str(reply)
