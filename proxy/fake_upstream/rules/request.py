"""The entry points and the top-level fields: body, ``model``, ``max_tokens``, ``stream``,
``system``, ``tools``, then the thinking-dependent ``context_management`` check, the messages
(:mod:`.messages`) and last the ``cache_control`` limit, counted by :func:`cache_control_count`.

Checks run in this order, so the error reported is the first one the real API would report.
Unknown top-level fields pass untouched (forward compatibility).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .messages import _check_messages
from .texts import (
    CLIENT_RESULT_TYPE,
    CUSTOM_TOOL_TYPES,
    MAX_CACHE_CONTROL,
    MSG_CACHE_CONTROL,
    _fail,
)
from .thinking import _check_context_management, thinking_mode

# -- public entry points ----------------------------------------------------------------------


def check_messages_request(body: object) -> None:
    """Check a ``POST /v1/messages`` body against the provider's rules.

    Raises:
        ProviderRuleError: on the first violation, with the provider's error text.
    """
    obj = _require_object(body)
    _check_model(obj)
    _check_max_tokens(obj)
    if "stream" in obj and not isinstance(obj["stream"], bool):
        raise _fail("stream: Input should be a valid boolean")
    _check_common(obj)


def check_count_tokens_request(body: object) -> None:
    """Check a ``POST /v1/messages/count_tokens`` body: the message rules, no ``max_tokens``.

    Raises:
        ProviderRuleError: on the first violation, with the provider's error text.
    """
    obj = _require_object(body)
    _check_model(obj)
    _check_common(obj)


def cache_control_count(body: object) -> int:
    """How many ``cache_control`` markers a body carries.

    Counted as the provider counts them: every ``tools`` entry, every ``system`` block, every
    message block and every block nested in a ``tool_result``'s ``content`` whose
    ``cache_control`` is present and not null. The top-level ``cache_control`` (automatic
    caching) is not counted. Malformed parts are skipped, never raised on.
    """
    if not isinstance(body, Mapping):
        return 0
    count = 0
    tools = body.get("tools")
    if isinstance(tools, list):
        count += sum(1 for tool in tools if _has_cache_control(tool))
    system = body.get("system")
    if isinstance(system, list):
        count += sum(1 for block in system if _has_cache_control(block))
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            content = message.get("content") if isinstance(message, Mapping) else None
            if isinstance(content, list):
                count += _blocks_cache_control(content)
    return count


# -- top-level fields -----------------------------------------------------------------------


def _require_object(body: object) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise _fail(f"body: Input should be a valid dictionary (got {type(body).__name__})")
    return body


def _check_model(body: Mapping[str, Any]) -> None:
    if "model" not in body:
        raise _fail("model: Field required")
    model = body["model"]
    if not isinstance(model, str):
        raise _fail("model: Input should be a valid string")
    if not model:
        raise _fail("model: String should have at least 1 character")


def _check_max_tokens(body: Mapping[str, Any]) -> None:
    if "max_tokens" not in body:
        raise _fail("max_tokens: Field required")
    value = body["max_tokens"]
    # bool is an int subclass in Python, but not an integer to the provider.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail("max_tokens: Input should be a valid integer")
    if value < 0:
        raise _fail("max_tokens: Input should be greater than or equal to 0")


def _check_common(body: Mapping[str, Any]) -> None:
    _check_system(body)
    _check_tools(body)
    mode = thinking_mode(body)
    _check_context_management(body, mode)
    _check_messages(body, mode)
    found = cache_control_count(body)
    if found > MAX_CACHE_CONTROL:
        raise _fail(MSG_CACHE_CONTROL.format(found=found))


def _check_system(body: Mapping[str, Any]) -> None:
    if "system" not in body:
        return
    system = body["system"]
    if isinstance(system, str):
        return
    if not isinstance(system, list):
        raise _fail("system: Input should be a valid string or a list of text blocks")
    for k, block in enumerate(system):
        if not isinstance(block, Mapping):
            raise _fail(f"system.{k}: Input should be a valid dictionary")
        if block.get("type") != "text":
            raise _fail(f"system.{k}.type: Input should be 'text'")
        text = block.get("text")
        if not isinstance(text, str):
            raise _fail(f"system.{k}.text: Input should be a valid string")
        if not text:
            raise _fail("system: text content blocks must be non-empty")


def _check_tools(body: Mapping[str, Any]) -> None:
    if "tools" not in body:
        return
    tools = body["tools"]
    if not isinstance(tools, list):
        raise _fail("tools: Input should be a valid list")
    names: set[str] = set()
    for k, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise _fail(f"tools.{k}: Input should be a valid dictionary")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise _fail(f"tools.{k}.name: Field required (a non-empty string)")
        if tool.get("type") in CUSTOM_TOOL_TYPES and not isinstance(
            tool.get("input_schema"), Mapping
        ):
            raise _fail(f"tools.{k}.custom.input_schema: Field required")
        if name in names:
            raise _fail(f"tools: Tool names must be unique. Found {name!r} more than once.")
        names.add(name)



# -- helpers ----------------------------------------------------------------------------------


def _has_cache_control(block: object) -> bool:
    return isinstance(block, Mapping) and block.get("cache_control") is not None


def _blocks_cache_control(blocks: Sequence[object]) -> int:
    count = 0
    for block in blocks:
        if not isinstance(block, Mapping):
            continue
        if block.get("cache_control") is not None:
            count += 1
        if block.get("type") == CLIENT_RESULT_TYPE and isinstance(block.get("content"), list):
            count += sum(1 for inner in block["content"] if _has_cache_control(inner))
    return count
