"""The rules as data and the provider's wording: limits, block types, the tool-id pattern, the
thinking modes, every error text (``MSG_*``, reference §5, ``{placeholders}`` filled per
violation) and :class:`ProviderRuleError`, which carries one of them to the caller.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, Literal

# -- rules as data --------------------------------------------------------------------------

MAX_MESSAGES: Final = 100_000
MAX_CACHE_CONTROL: Final = 4
ROLES: Final = ("user", "assistant", "system")
THINKING_TYPES: Final = ("thinking", "redacted_thinking")
# Blocks that define an id another block points at, and the role they belong to.
CLIENT_USE_TYPE: Final = "tool_use"
CLIENT_RESULT_TYPE: Final = "tool_result"
# A server result type (anything ending in ``_tool_result`` except ``tool_result``) is answered by
# the use type named here; every other server result is answered by ``server_tool_use``.
SERVER_USE_FOR_RESULT: Final[Mapping[str, str]] = {"mcp_tool_result": "mcp_tool_use"}
SERVER_USE_TYPES: Final = ("server_tool_use", "mcp_tool_use")
TOOL_ID_PATTERN: Final = re.compile(r"^[a-zA-Z0-9_-]+$")
TOOL_ID_PATTERN_TEXT: Final = "^[a-zA-Z0-9_-]+$"
CUSTOM_TOOL_TYPES: Final = (None, "custom")
# ``thinking.type`` values that turn thinking on, and off (absent or null is off as well).
THINKING_ON_TYPES: Final = ("enabled", "adaptive")
THINKING_OFF_TYPES: Final = ("disabled",)
# The context-management edit that only works with thinking on.
CLEAR_THINKING_EDIT: Final = "clear_thinking_20251015"
EXTENDED_THINKING_DOCS: Final = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"

ThinkingMode = Literal["on", "off", "unknown"]

# -- the provider's own wording (reference §5); {placeholders} are filled per violation -------

MSG_EMPTY_CONTENT: Final = (
    "messages.{n}: all messages must have non-empty content except for the optional final "
    "assistant message"
)
MSG_TEXT_EMPTY: Final = "messages: text content blocks must be non-empty"
MSG_TEXT_WHITESPACE: Final = "messages: text content blocks must contain non-whitespace text"
MSG_FIRST_USER: Final = 'messages: first message must use the "user" role'
MSG_MISSING_RESULTS: Final = (
    "messages.{n}: `tool_use` ids were found without `tool_result` blocks immediately after: "
    "{ids}. Each `tool_use` block must have a corresponding `tool_result` block in the next "
    "message."
)
MSG_UNEXPECTED_RESULT: Final = (
    "messages.{n}.content.{m}: unexpected `tool_use_id` found in `tool_result` blocks: {ids}. "
    "Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
)
MSG_RESULTS_NOT_FIRST: Final = (
    "messages.{n}: Did not find {k} tool_result block(s) at the beginning of this message. "
    "Messages following tool_use blocks must begin with a matching number of tool_result blocks."
)
MSG_DUPLICATE_RESULT: Final = (
    "messages.{n}.content.{m}: each `tool_use` id must be answered by exactly one `tool_result` "
    "block; found a second `tool_result` for {ids}."
)
MSG_DUPLICATE_ID: Final = "messages.{n}.content.{m}: `tool_use` ids must be unique"
MSG_ID_PATTERN: Final = (
    "messages.{n}.content.{m}.{kind}.id: String should match pattern '" + TOOL_ID_PATTERN_TEXT + "'"
)
MSG_ORPHAN_SERVER_RESULT: Final = (
    "messages.{n}.content.{m}: unexpected `tool_use_id` found in `{kind}` blocks: {ids}. "
    "Each `{kind}` block must have a corresponding `{use}` block before it."
)
MSG_DUPLICATE_SERVER_RESULT: Final = (
    "messages.{n}.content.{m}: `{use}` id {ids} is already answered by an earlier `{kind}` block."
)
MSG_THINKING_FIRST: Final = (
    "messages.{n}.content.0: If an assistant message contains any thinking blocks, the first "
    "block must be thinking or redacted_thinking. Found {found}."
)
MSG_THINKING_LAST: Final = (
    "messages.{n}: The final block in an assistant message cannot be `{kind}`."
)
MSG_SIGNATURE: Final = "messages.{n}.content.{m}: Invalid `signature` in `thinking` block."
# Kilo-Org/kilocode#5219 (2026-01-20), verbatim, the provider's typo "preceeding" included.
MSG_TOOL_LOOP_THINKING: Final = (
    "messages.{n}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
    "`{found}`. When `thinking` is enabled, a final `assistant` message must start with a "
    "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We "
    "recommend you include thinking blocks from previous turns. To avoid this requirement, "
    "disable `thinking`. Please consult our documentation at " + EXTENDED_THINKING_DOCS
)
MSG_THINKING_DISABLED_FINAL: Final = (
    "messages.{n}.content.{m}: When thinking is disabled, an `assistant` message in the final "
    "position cannot contain `thinking`. To use thinking blocks, enable `thinking` in your "
    "request."
)
MSG_THINKING_MODIFIED: Final = (
    "messages.{n}.content.{m}: `thinking` or `redacted_thinking` blocks in the latest assistant "
    "message cannot be modified. These blocks must remain as they were in the original response."
)
MSG_CLEAR_THINKING: Final = (
    "`" + CLEAR_THINKING_EDIT + "` strategy requires `thinking` to be enabled"
)
MSG_CACHE_CONTROL: Final = (
    "A maximum of " + str(MAX_CACHE_CONTROL) + " blocks with cache_control may be provided. "
    "Found {found}."
)


class ProviderRuleError(ValueError):
    """A request breaks one of the provider's rules.

    Attributes:
        message: the provider's error text, naming the position (``messages.N.content.M``).
        status: the HTTP status the provider answers with (400 for every rule here).
        error_type: the Anthropic ``error.type`` (``invalid_request_error``).
    """

    def __init__(
        self, message: str, status: int = 400, error_type: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.error_type = error_type

    def error_body(self, request_id: str | None = None) -> dict[str, Any]:
        """The Anthropic error shape for this violation, with ``request_id`` when given."""
        body: dict[str, Any] = {
            "type": "error",
            "error": {"type": self.error_type, "message": self.message},
        }
        if request_id is not None:
            body["request_id"] = request_id
        return body


def _fail(message: str) -> ProviderRuleError:
    return ProviderRuleError(message)
