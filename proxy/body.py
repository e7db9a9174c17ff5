"""Reading, checking and re-serialising the JSON body of ``/v1/messages`` and ``count_tokens``.

The size limit is enforced twice: a declared ``Content-Length`` over the limit is refused
before a byte is read, and a body without one (chunked) is refused as soon as what has
arrived passes the limit, so a large body is never held in memory whole.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from proxy.errors import RequestRejected

__all__ = ["dump_body", "parse_body", "read_body"]


def _too_large(limit: int) -> RequestRejected:
    return RequestRejected(
        413, "request_too_large",
        f"request body is larger than the proxy's limit of {limit} bytes",
        reason="body_too_large",
    )


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole request body, at most ``limit`` bytes.

    Raises:
        RequestRejected: 413 ``request_too_large`` when the body is, or declares to be, larger.
    """
    declared = request.content_length
    if declared is not None and declared > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


class _NotJSONConstant(ValueError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(name)


def _reject_constant(name: str) -> Any:
    raise _NotJSONConstant(name)


def _invalid(message: str, reason: str) -> RequestRejected:
    return RequestRejected(400, "invalid_request_error", message, reason=reason)


def parse_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object whose ``messages`` is a list of objects.

    Raises:
        RequestRejected: 400 ``invalid_request_error`` naming the problem: not UTF-8, not
            JSON, not an object, ``messages`` missing or not a list, a message not an object,
            ``system`` neither a string nor a list.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(f"request body is not valid UTF-8 (byte {exc.start})", "bad_json") from None
    try:
        # NaN / Infinity are not JSON (RFC 8259); Python would accept them and dump_body would
        # write them back out, so the provider would get a body that is not JSON.
        body = json.loads(text, parse_constant=_reject_constant)
    except _NotJSONConstant as exc:
        raise _invalid(f"request body is not valid JSON: {exc.name} is not a JSON value",
                       "bad_json") from None
    except json.JSONDecodeError as exc:
        raise _invalid(
            f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            "bad_json",
        ) from None
    except RecursionError:
        raise _invalid("request body is not valid JSON: nested too deeply", "bad_json") from None
    if not isinstance(body, dict):
        raise _invalid(
            f"request body must be a JSON object, got {_json_type(body)}", "body_not_object"
        )
    messages = body.get("messages")
    if not isinstance(messages, list):
        problem = "is missing" if "messages" not in body else f"must be a list, got {_json_type(messages)}"
        raise _invalid(f"messages: {problem}", "messages_not_list")
    system = body.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise _invalid(
            f"system: must be a string or an array of text blocks, got {_json_type(system)}",
            "system_invalid",
        )
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _invalid(
                f"messages.{index}: must be an object, got {_json_type(message)}",
                "message_not_object",
            )
    return body


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def dump_body(body: dict[str, Any]) -> bytes:
    """The body as compact UTF-8 JSON (serialised once, as forwarded)."""
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate arrived as a \uXXXX escape; only an escape can carry it back out.
        return json.dumps(body, ensure_ascii=True, separators=(",", ":")).encode("ascii")
