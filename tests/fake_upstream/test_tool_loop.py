"""``--script tool-loop``: the fake provider plays an agent's model for N tool steps, in the
shape of the SDKs' tool loop, and ``--dump`` writes what it received."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import pytest

from proxy.fake_upstream import FakeUpstream, start_fake_upstream
from proxy.fake_upstream.tool_loop import RequestDump, ToolLoopScript

WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "required": ["city", "days"],
                            "properties": {"city": {"type": "string"},
                                           "days": {"type": "integer"},
                                           "unit": {"enum": ["c", "f"]}}}}


async def _agent(client: anthropic.AsyncAnthropic, tools: list[dict[str, Any]],
                 **options: Any) -> tuple[list[Any], Any]:
    """The SDKs' tool loop: run each tool call, send its result, until the model stops."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather?"}]
    calls: list[Any] = []
    for _ in range(20):
        reply = await client.messages.create(model="claude-sonnet-4-5", max_tokens=2048,
                                             messages=messages, tools=tools, **options)
        messages.append({"role": "assistant", "content": [
            b.model_dump(exclude_none=True) for b in reply.content]})
        uses = [b for b in reply.content if b.type == "tool_use"]
        if reply.stop_reason != "tool_use":
            return calls, reply
        calls.extend(uses)
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": u.id, "content": f"sunny ({u.input})"}
            for u in uses]})
    raise AssertionError("the loop did not stop")


@pytest.mark.parametrize("thinking", [None, {"type": "enabled", "budget_tokens": 1024}])
async def test_tool_loop_calls_the_offered_tool_n_times_then_answers(
        thinking: dict[str, Any] | None) -> None:
    upstream = FakeUpstream(ToolLoopScript(4))
    runner, url = await start_fake_upstream(upstream)
    client = anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0)
    try:
        options = {"thinking": thinking} if thinking else {}
        calls, final = await _agent(client, [WEATHER], **options)
    finally:
        await client.close()
        await runner.cleanup()
    assert [c.name for c in calls] == ["get_weather"] * 4
    assert all(set(c.input) == {"city", "days"} and isinstance(c.input["days"], int)
               for c in calls)
    assert final.content[-1].text.startswith("Tool loop finished: 4 tool steps")
    assert len(upstream.message_requests) == 5  # every view passed the provider's rules


async def test_tool_loop_cycles_claude_codes_tools_and_reads_a_path_it_found() -> None:
    script = ToolLoopScript(3)
    tools = [{"name": n, "input_schema": {"type": "object"}} for n in ("Bash", "Glob", "Read")]
    body: dict[str, Any] = {"model": "m", "tools": tools,
                            "messages": [{"role": "user", "content": "go"}]}
    first = script(body, None)  # type: ignore[arg-type]
    call = first.content[-1]
    assert (call["name"], call["input"]) == ("Glob", {"pattern": "*"})
    body["messages"] += [{"role": "assistant", "content": list(first.content)},
                         {"role": "user", "content": [{
                             "type": "tool_result", "tool_use_id": call["id"],
                             "content": "/work/a.py\n/work/b.py"}]}]
    second = script(body, None)  # type: ignore[arg-type]
    assert second.content[-1]["name"] == "Read"
    assert second.content[-1]["input"] == {"file_path": "/work/a.py"}


async def test_tool_loop_without_tools_or_with_tool_choice_none_answers_text() -> None:
    script = ToolLoopScript(3)
    plain = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert script(plain, None).stop_reason == "end_turn"  # type: ignore[arg-type]
    refused = {**plain, "tools": [WEATHER], "tool_choice": {"type": "none"}}
    assert script(refused, None).stop_reason == "end_turn"  # type: ignore[arg-type]


async def test_dump_writes_each_request_and_its_system_without_credentials(
        tmp_path: Path) -> None:
    upstream = FakeUpstream(ToolLoopScript(1))
    upstream.on_record = RequestDump(tmp_path / "dump")
    runner, url = await start_fake_upstream(upstream)
    client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-secret-key", max_retries=0)
    try:
        await client.messages.create(model="claude-sonnet-4-5", max_tokens=64, tools=[WEATHER],
                                     system="You are a forecaster.",
                                     messages=[{"role": "user", "content": "weather?"}])
    finally:
        await client.close()
        await runner.cleanup()
    files = sorted(p.name for p in (tmp_path / "dump").iterdir())
    assert files == ["0001-messages-system.txt", "0001-messages.json"]
    dumped = json.loads((tmp_path / "dump" / "0001-messages.json").read_text())
    assert dumped["path"] == "/v1/messages" and dumped["body"]["tools"] == [WEATHER]
    assert "x-api-key" not in dumped["headers"]
    assert "sk-secret-key" not in (tmp_path / "dump" / "0001-messages.json").read_text()
    assert (tmp_path / "dump" / "0001-messages-system.txt").read_text() == "You are a forecaster."
