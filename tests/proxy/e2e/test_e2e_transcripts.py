"""End to end (issue #34): with ``sources.record_transcripts`` the proxy writes each session's
messages to its transcript, in the format the resolver verifies, once, within a bound."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import anthropic

import compactor
from proxy.sources.transcripts import TranscriptRecorder
from tests.conftest import TEST_API_KEY, ProxyFactory

MODEL = "claude-sonnet-4-5"


def _events(path: Path, count: int) -> list[dict[str, Any]]:
    """The transcript's events once it holds ``count`` (written after the response)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if path.exists():
            lines = path.read_text(encoding="utf-8").splitlines()
            if len(lines) >= count:
                return [json.loads(line) for line in lines]
        time.sleep(0.05)
    raise AssertionError(f"{path} never held {count} events")


def test_messages_are_recorded_once_and_resolve_as_available(
        proxy_factory: ProxyFactory) -> None:
    """Three requests (the second sent twice): every message once, in order, sequence from 1;
    a pointer to message 3 resolves as available."""
    proxy = proxy_factory({"sources": {"record_transcripts": True}})
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the parser."}]
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0,
                                 default_headers={"x-compact-session-id": "rec-1"})
    with client:
        for n in range(3):
            reply = client.messages.create(model=MODEL, max_tokens=16, messages=messages)
            if n == 1:  # a resent history writes nothing twice
                client.messages.create(model=MODEL, max_tokens=16, messages=messages)
            messages += [{"role": "assistant", "content": reply.content[0].text},
                         {"role": "user", "content": f"Step {n + 2}."}]
        client.messages.create(model=MODEL, max_tokens=16, messages=messages)
    path = proxy.transcript_root / "rec-1.jsonl"
    events = _events(path, len(messages))
    time.sleep(0.2)  # (nothing more may come)
    events = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [e["sequence"] for e in events] == list(range(1, len(messages) + 1))
    assert [{"role": e["role"], "content": e["content"]} for e in events] == messages
    assert all(e["session_id"] == "rec-1" and e["event_id"] for e in events)
    resolver = compactor.SourcePointerResolver(proxy.transcript_root, proxy.artifact_root,
                                               lambda pointer: True)
    resolution = resolver.resolve("transcript:rec-1:3")
    assert resolution.status == "available", resolution


def test_recording_is_off_by_default(proxy_factory: ProxyFactory) -> None:
    proxy = proxy_factory()
    with anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0,
                             default_headers={"x-compact-session-id": "rec-2"}) as client:
        client.messages.create(model=MODEL, max_tokens=16,
                               messages=[{"role": "user", "content": "hi"}])
    time.sleep(0.3)
    assert not (proxy.transcript_root / "rec-2.jsonl").exists()


def test_a_transcript_stops_at_its_bound_and_tenants_have_their_own(tmp_path: Path) -> None:
    """Past transcript_max_bytes nothing more is written (the file stays valid); a tenant's
    transcript is under its own directory."""
    recorder = TranscriptRecorder(str(tmp_path), max_bytes=400)
    messages = [{"role": "user" if n % 2 == 0 else "assistant", "content": "x" * 100}
                for n in range(9)]
    asyncio.run(recorder.record("none", "s-1", messages))
    lines = (tmp_path / "s-1.jsonl").read_bytes().splitlines()
    assert 1 <= len(lines) < 9 and sum(len(line) + 1 for line in lines) <= 400
    asyncio.run(recorder.record("tenant_a", "s-1", messages[:1]))
    assert (tmp_path / "tenant_a" / "s-1.jsonl").exists()
    again = TranscriptRecorder(str(tmp_path), max_bytes=10**6)  # another process
    asyncio.run(again.record("none", "s-1", messages))
    events = [json.loads(line) for line in (tmp_path / "s-1.jsonl").read_bytes().splitlines()]
    assert [e["sequence"] for e in events] == list(range(1, 10))


def test_recording_needs_a_local_transcript_root() -> None:
    import pytest

    from proxy.config import Config

    with pytest.raises(Exception, match="record_transcripts"):
        Config.from_mapping({"upstream": {"base_url": "http://127.0.0.1:9"},
                             "sources": {"record_transcripts": True,
                                         "transcript_root": "s3://bucket/transcripts"}})
