"""End to end: durable context as the provider receives it, verified, and never summarised."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import anthropic
import pytest

from tests.conftest import (
    PROMPT_MARKER,
    TEST_API_KEY,
    ProxyFactory,
    RunningProxy,
    UpstreamServer,
    user_text,
)
from tests.proxy.e2e.helpers import MODEL, SUMMARY_POLICY, admin_put, forwarded, summary_calls


def durable_setup(proxy: RunningProxy, session_id: str) -> dict[str, str]:
    """A transcript and an artifact for ``session_id``; returns their sha256 digests."""
    line = json.dumps({"sequence": 1, "session_id": session_id, "event_id": "ev-1",
                       "type": "user", "text": "deploy on fridays"})
    (proxy.transcript_root / f"{session_id}.jsonl").write_text(line + "\n", encoding="utf-8")
    artifact_dir = proxy.artifact_root / session_id
    artifact_dir.mkdir()
    report = b"all tests passed\n"
    (artifact_dir / "report.txt").write_bytes(report)
    return {"transcript": hashlib.sha256(line.encode()).hexdigest(),
            "artifact": hashlib.sha256(report).hexdigest()}


def test_durable_block_is_appended_last_to_system_with_verified_statuses(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """After an admin PUT the state is the last system block; each item shows its verified
    status; the block is byte-identical on the next request (prompt cache)."""
    proxy = proxy_factory(admin_token="admin-e2e-token-5b2d4e6f8a0c1e3b5d7f")
    digests = durable_setup(proxy, "sess-d")
    admin_put(proxy, "sess-d", {
        "facts": [{"fact_id": "f1", "content": f"{PROMPT_MARKER} deploys happen on fridays",
                   "source_pointer": "transcript:sess-d:1",
                   "last_confirmed_at": "2025-03-01T12:30:00Z"}],
        "pending_items": [{"item_id": "p1", "description": "publish the report",
                           "source_pointer": f"artifact:sess-d:report.txt:{digests['artifact']}",
                           "last_confirmed_at": "2025-03-01T12:31:00Z"}],
        "retrieval_evidence": [{"memory_id": "m1", "source_id": "transcript:sess-other:1",
                                "source_type": "transcript", "source_title": "elsewhere",
                                "captured_at": "2025-03-01T12:32:00Z", "score": 0.75,
                                "source_rank": 1, "conflict_key": None}],
    })
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    request: dict[str, Any] = {"model": MODEL, "max_tokens": 32, "system": "You are helpful.",
               "messages": [{"role": "user", "content": user_text("when do we deploy?")}],
               "extra_headers": {"x-compact-session-id": "sess-d"}}
    with client:
        client.messages.create(**request)
        client.messages.create(**request)
    first, second = forwarded(upstream_server)
    assert first["system"][0] == {"type": "text", "text": "You are helpful."}
    block = first["system"][-1]
    assert len(first["system"]) == 2 and block["type"] == "text"
    text = block["text"]
    fact_line = next(line for line in text.splitlines() if "fact_id=" in line)
    assert f"source_status=available evidence_sha256={digests['transcript']}" in fact_line
    item_line = next(line for line in text.splitlines() if "item_id=" in line)
    assert f"source_status=available evidence_sha256={digests['artifact']}" in item_line
    evidence_line = next(line for line in text.splitlines() if "memory_id=" in line)
    assert "source_status=denied evidence_unavailable=true" in evidence_line
    assert "conflict=none" in evidence_line
    assert "deploy on fridays" not in text  # source text is never injected
    assert second["system"] == first["system"]
    assert first["messages"] == request["messages"]


def test_each_request_shows_its_sources_as_they_are_then(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """Pointers are re-verified on every request, and the block follows: an artifact
    removed between two requests is missing in the second; a transcript line rewritten is
    corrupt for the pointers into it; both put back, the block is the first one again, byte
    for byte."""
    proxy = proxy_factory(admin_token="admin-e2e-token-5b2d4e6f8a0c1e3b5d7f")
    digests = durable_setup(proxy, "sess-r")
    admin_put(proxy, "sess-r", {
        "facts": [{"fact_id": f"f{n}", "content": f"fact {n}",
                   "source_pointer": "transcript:sess-r:1",
                   "last_confirmed_at": "2025-03-01T12:30:00Z"} for n in range(3)],
        "pending_items": [{"item_id": "p1", "description": "publish the report",
                           "source_pointer": f"artifact:sess-r:report.txt:{digests['artifact']}",
                           "last_confirmed_at": "2025-03-01T12:31:00Z"}],
    })
    transcript = proxy.transcript_root / "sess-r.jsonl"
    artifact = proxy.artifact_root / "sess-r" / "report.txt"
    kept_transcript, kept_artifact = transcript.read_bytes(), artifact.read_bytes()
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    request: dict[str, Any] = {"model": MODEL, "max_tokens": 32, "system": "You are helpful.",
               "messages": [{"role": "user", "content": user_text("what is left?")}],
               "extra_headers": {"x-compact-session-id": "sess-r"}}

    def statuses(body: dict[str, Any]) -> list[str]:
        return [line.split("source_status=")[1].split()[0]
                for line in body["system"][-1]["text"].splitlines() if "source_status=" in line]

    with client:
        client.messages.create(**request)
        artifact.unlink()
        client.messages.create(**request)
        transcript.write_text(json.dumps({"sequence": 1, "session_id": "sess-r"}) + "\n",
                              encoding="utf-8")  # no event_id: not a transcript event
        client.messages.create(**request)
        transcript.write_bytes(kept_transcript)
        artifact.write_bytes(kept_artifact)
        client.messages.create(**request)
    first, second, third, fourth = forwarded(upstream_server)
    assert statuses(first) == ["available"] * 4
    assert statuses(second) == ["available"] * 3 + ["missing"]
    assert statuses(third) == ["corrupt"] * 3 + ["missing"]
    assert fourth["system"] == first["system"]


@pytest.mark.parametrize("mode", ["separate", "fork"])
def test_durable_state_never_enters_a_summary_or_a_summary_merge(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, mode: str
) -> None:
    """Across several L4 crossings (each merging the previous summary with newly aged-out
    messages), no summary call carries the durable facts in what it summarises, while every
    forwarded request does. A separate call never carries them at all; a forked one has them
    only in ``system``, exactly as the request it forks was forwarded."""
    proxy = proxy_factory({"compaction": SUMMARY_POLICY, "summary": {"mode": mode}},
                          admin_token="admin-e2e-token-merge-9c1d3f5a7b9e2c4d")
    marker = "DURABLE-FACT-ONLY-IN-SYSTEM-41b7"
    admin_put(proxy, "merge-1", {"facts": [{
        "fact_id": "f1", "content": f"{marker}: the release branch is frozen",
        "source_pointer": "transcript:merge-1:1", "last_confirmed_at": "2026-01-01T00:00:00Z"}]})
    history: list[Any] = [{"role": "user", "content": user_text("fix the parser")}]
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        for index in range(40):
            tool_id = f"toolu_m{index:03d}"
            history += [
                {"role": "assistant", "content": [
                    {"type": "text", "text": f"Reading file {index}."},
                    {"type": "tool_use", "id": tool_id, "name": "Read",
                     "input": {"file_path": f"/src/mod{index}.py"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id,
                                              "content": f"# module {index}\n" + "code\n" * 120}]},
            ]
            client.messages.create(model=MODEL, max_tokens=16, messages=history,
                                   extra_headers={"x-compact-session-id": "merge-1"})
    calls = summary_calls(upstream_server)
    assert len(calls) >= 2  # at least one merge of a previous summary with new messages
    assert any("compact-proxy-summary" in json.dumps(c.body["messages"]) for c in calls[1:])
    assert all(marker not in json.dumps(c.body["messages"]) for c in calls)
    sent = forwarded(upstream_server)
    assert sent and all(marker in json.dumps(body["system"]) for body in sent)
    if mode == "separate":
        assert all(marker not in json.dumps(c.body) for c in calls)
    else:
        assert all(c.body["system"] == sent[0]["system"] for c in calls)
