"""The provider's request rules as one pure function: no server, no I/O.

``check_messages_request`` raises :class:`ProviderRuleError` with the provider's own error text
(``/work/shared/reference/messages-api.md`` §5) and the ``messages.N`` / ``messages.N.content.M``
path of the first violation, or returns ``None``. The compactor's property tests use it as the
strict judge of what a forwarded view must satisfy; the fake upstream uses it to answer 400.
``tests/PROVIDER_RULES.md`` lists every §5 rule, its text and the test that shows it.

Theory of operation. Top-level fields are checked first (``model``, ``max_tokens``, ``stream``,
``system``, ``tools``, ``context_management`` against ``thinking``), then ``messages`` in one
pass in order, so the error reported is the one at the lowest position, as the real API does;
the ``cache_control`` count comes last. Before the pass, three positions are located (a cheap
scan that never raises; malformed messages are left to the pass): the final non-``system``
message, the latest ``assistant`` message, and, with thinking on, the *opener* of the turn in
progress (below). Two things are carried between messages:

* the set of every id-carrying block seen so far (``tool_use`` ids are unique per request);
* the ``tool_use`` ids of the previous non-system message, which the next non-system message must
  answer. Role ``system`` messages (2026 "mid-conversation system") are transparent for this
  adjacency: the message "right after" an assistant turn is the next one whose role is not
  ``system``. The real API merges consecutive same-role turns, but pairing is decided on the
  messages as sent, so merging never rescues a result that sits one message too late.

Server-side tool pairs never cross a message: a ``*_tool_result`` must find its
``server_tool_use`` / ``mcp_tool_use`` earlier in the same assistant message.

Thinking. *On* means ``thinking.type`` is ``enabled`` or ``adaptive``; *off* means ``thinking``
is absent, null or ``{"type": "disabled"}``; any other value is unknown and neither rule that
depends on it applies (forward compatibility). Every assistant message that holds thinking must
start with it and none may end with it (not even a final prefill). The rest, on messages as sent
(never merged), role ``system`` messages skipped:

* *tool loop* (thinking on): a tool loop is in progress when the final message is a ``user``
  message holding at least one ``tool_result``. The turn in progress begins after the last
  ``user`` message holding no ``tool_result`` (the first ``user`` message if there is no other);
  its opener is the first ``assistant`` message after that point, and the opener's
  ``content[0]`` must be ``thinking`` or ``redacted_thinking`` (a string content counts as
  ``text``). Later assistant messages of the same loop are not bound.
* *disabled prefill* (thinking off): a final ``assistant`` message may hold no thinking at all.
* *cannot be modified*: in the latest ``assistant`` message, a block carrying the fake's own
  signature format (:mod:`.signatures`) must verify; any other signature is opaque and accepted.
* ``clear_thinking_20251015`` in ``context_management.edits`` needs thinking on.

Unknown top-level fields and unknown block types pass untouched (forward compatibility).

Everything in ``__all__`` gets re-exported.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from .signatures import block_intact

__all__ = [
    "ProviderRuleError",
    "cache_control_count",
    "check_claude_code_identity",
    "check_count_tokens_request",
    "check_messages_request",
    "check_oauth_beta",
    "is_oauth_credential",
]

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


# Claude Code subscription credentials (reference §2.3): a bearer token with this prefix needs
# the OAuth beta and Claude Code's own system identity, after an optional billing block.
OAUTH_TOKEN_PREFIX: Final = "sk-ant-oat"
OAUTH_BETA: Final = "oauth-2025-04-20"
BILLING_HEADER_PREFIX: Final = "x-anthropic-billing-header:"
CLAUDE_CODE_IDENTITIES: Final = (
    "You are Claude Code, Anthropic's official CLI for Claude.",
    "You are a Claude agent, built on Anthropic's Claude Agent SDK.",
)
MSG_OAUTH_NOT_SUPPORTED: Final = "OAuth authentication is currently not supported."
MSG_CLAUDE_CODE_ONLY: Final = (
    "This credential is only authorized for use with Claude Code and cannot be used for other "
    "API requests."
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


def is_oauth_credential(authorization: str) -> bool:
    """Whether an ``Authorization`` value is a Claude Code subscription login
    (``Bearer sk-ant-oat…``; the scheme is case-insensitive)."""
    scheme, _, token = authorization.strip().partition(" ")
    return scheme.lower() == "bearer" and token.strip().startswith(OAUTH_TOKEN_PREFIX)


def check_oauth_beta(authorization: str, anthropic_beta: str) -> None:
    """An OAuth credential needs ``oauth-2025-04-20`` in the comma-joined ``anthropic-beta``
    list (repeated headers joined with commas); any other credential passes.

    Raises:
        ProviderRuleError: 401 ``authentication_error`` with the provider's text.
    """
    if not is_oauth_credential(authorization):
        return
    if OAUTH_BETA not in (beta.strip() for beta in anthropic_beta.split(",")):
        raise ProviderRuleError(MSG_OAUTH_NOT_SUPPORTED, 401, "authentication_error")


def check_claude_code_identity(authorization: str, body: object) -> None:
    """An OAuth credential is only served for a request that looks like Claude Code's own:
    ``system`` is a list of text blocks whose first block, after an optional one starting
    ``x-anthropic-billing-header:``, starts with one of :data:`CLAUDE_CODE_IDENTITIES`. Strict
    on purpose: a plain-string ``system`` is refused too (Claude Code always sends a list).

    Raises:
        ProviderRuleError: 400 ``invalid_request_error`` with the provider's text.
    """
    if not is_oauth_credential(authorization):
        return
    system = body.get("system") if isinstance(body, Mapping) else None
    texts = [block.get("text") if isinstance(block, Mapping) and block.get("type") == "text"
             else None for block in system] if isinstance(system, list) else []
    if texts and isinstance(texts[0], str) and texts[0].startswith(BILLING_HEADER_PREFIX):
        texts = texts[1:]
    first = texts[0] if texts else None
    if not isinstance(first, str) or not first.startswith(CLAUDE_CODE_IDENTITIES):
        raise _fail(MSG_CLAUDE_CODE_ONLY)


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


def thinking_mode(body: Mapping[str, Any]) -> ThinkingMode:
    """``on`` (``enabled`` / ``adaptive``), ``off`` (absent, null, ``disabled``) or ``unknown``."""
    thinking = body.get("thinking")
    if thinking is None:
        return "off"
    kind = thinking.get("type") if isinstance(thinking, Mapping) else None
    if kind in THINKING_ON_TYPES:
        return "on"
    if kind in THINKING_OFF_TYPES:
        return "off"
    return "unknown"


def _check_context_management(body: Mapping[str, Any], mode: ThinkingMode) -> None:
    management = body.get("context_management")
    edits = management.get("edits") if isinstance(management, Mapping) else None
    if mode != "off" or not isinstance(edits, list):
        return
    if any(isinstance(edit, Mapping) and edit.get("type") == CLEAR_THINKING_EDIT
           for edit in edits):
        raise _fail(MSG_CLEAR_THINKING)


# -- messages -------------------------------------------------------------------------------


def _check_messages(body: Mapping[str, Any], mode: ThinkingMode) -> None:
    if "messages" not in body:
        raise _fail("messages: Field required")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise _fail("messages: Input should be a valid list")
    if not messages:
        raise _fail("messages: at least one message is required")
    if len(messages) > MAX_MESSAGES:
        raise _fail(
            f"messages: List should have at most {MAX_MESSAGES} items after validation, "
            f"not {len(messages)}"
        )

    last = len(messages) - 1
    roles = [_role_of(message) for message in messages]
    final = _last_index(roles, ("user", "assistant"))
    latest_assistant = _last_index(roles, ("assistant",))
    opener = _tool_loop_opener(messages, roles) if mode == "on" else None
    seen_ids: set[str] = set()
    # Tool-use ids of the previous non-system message, and where it sits.
    pending_uses: list[str] = []
    pending_index = -1
    first_non_system_seen = False

    for n, message in enumerate(messages):
        role, content = _message_shape(n, message)
        if n == 0 and role == "system":
            raise _fail('messages.0: a "system" message cannot be the first message')
        if role == "system":
            # Content rules apply; tool adjacency looks straight through it.
            _check_content_present(n, content, final_assistant=False)
            _check_plain_blocks(n, content, role)
            continue
        if not first_non_system_seen:
            first_non_system_seen = True
            if role != "user":
                raise _fail(MSG_FIRST_USER)

        _check_content_present(n, content, final_assistant=(n == last and role == "assistant"))
        blocks = content if isinstance(content, list) else []
        if n == final and role == "assistant" and mode == "off":
            _check_no_thinking(n, blocks)
        uses = _check_blocks(n, blocks, role, seen_ids)
        if n == latest_assistant:
            _check_unmodified(n, blocks)
        if n == opener:
            _check_opener(n, content)

        if pending_uses:
            answered = _results_of(blocks) if role == "user" else set()
            missing = [tool_id for tool_id in pending_uses if tool_id not in answered]
            if missing:
                raise _fail(MSG_MISSING_RESULTS.format(n=pending_index, ids=", ".join(missing)))
        if role == "user":
            _check_results(n, blocks, pending_uses)
        pending_uses = uses
        pending_index = n

    if pending_uses:
        raise _fail(MSG_MISSING_RESULTS.format(n=pending_index, ids=", ".join(pending_uses)))


def _message_shape(n: int, message: object) -> tuple[str, object]:
    if not isinstance(message, Mapping):
        raise _fail(f"messages.{n}: Input should be a valid dictionary")
    if "role" not in message:
        raise _fail(f"messages.{n}.role: Field required")
    role = message["role"]
    if role not in ROLES:
        raise _fail(f"messages.{n}.role: Input should be 'user', 'assistant' or 'system'")
    if "content" not in message:
        raise _fail(f"messages.{n}.content: Field required")
    content = message["content"]
    if not isinstance(content, (str, list)):
        raise _fail(f"messages.{n}.content: Input should be a valid string or list")
    return role, content


def _check_content_present(n: int, content: object, *, final_assistant: bool) -> None:
    if isinstance(content, str):
        if not content:
            if final_assistant:
                return
            raise _fail(MSG_EMPTY_CONTENT.format(n=n))
        if not content.strip():
            raise _fail(MSG_TEXT_WHITESPACE)
        return
    if isinstance(content, list) and not content and not final_assistant:
        raise _fail(MSG_EMPTY_CONTENT.format(n=n))


def _block_type(n: int, m: int, block: object) -> str:
    if not isinstance(block, Mapping):
        raise _fail(f"messages.{n}.content.{m}: Input should be a valid dictionary")
    block_type = block.get("type")
    if not isinstance(block_type, str) or not block_type:
        raise _fail(f"messages.{n}.content.{m}.type: Field required")
    return block_type


def _check_text(n: int, m: int, block: Mapping[str, Any], path: str = "") -> None:
    text = block.get("text")
    if not isinstance(text, str):
        raise _fail(f"messages.{n}.content.{m}{path}.text: Input should be a valid string")
    if not text:
        raise _fail(MSG_TEXT_EMPTY)
    if not text.strip():
        raise _fail(MSG_TEXT_WHITESPACE)


def _check_plain_blocks(n: int, content: object, role: str) -> None:
    """Blocks of a role-``system`` message: shape and text rules, no tool blocks at all."""
    if not isinstance(content, list):
        return
    for m, block in enumerate(content):
        block_type = _block_type(n, m, block)
        assert isinstance(block, Mapping)
        if block_type == "text":
            _check_text(n, m, block)
        elif block_type in (CLIENT_USE_TYPE, CLIENT_RESULT_TYPE, *SERVER_USE_TYPES):
            raise _fail(
                f"messages.{n}.content.{m}: `{block_type}` blocks are not allowed in a "
                f"`{role}` message"
            )


def _check_blocks(
    n: int, blocks: Sequence[object], role: str, seen_ids: set[str]
) -> list[str]:
    """Per-block rules of a user/assistant message; returns its ``tool_use`` ids in order."""
    uses: list[str] = []
    # Server/MCP use ids met so far in this message, mapped to "already answered".
    server_uses: dict[str, bool] = {}
    thinking_at: list[int] = []

    for m, block in enumerate(blocks):
        block_type = _block_type(n, m, block)
        assert isinstance(block, Mapping)
        if block_type == "text":
            _check_text(n, m, block)
        elif block_type == CLIENT_USE_TYPE or block_type in SERVER_USE_TYPES:
            if role != "assistant":
                raise _fail(
                    f"messages.{n}.content.{m}: `{block_type}` blocks can only be in "
                    f"`assistant` messages"
                )
            tool_id = _check_use(n, m, block, block_type, seen_ids)
            if block_type == CLIENT_USE_TYPE:
                uses.append(tool_id)
            else:
                server_uses[tool_id] = False
        elif block_type == CLIENT_RESULT_TYPE:
            if role != "user":
                raise _fail(
                    f"messages.{n}.content.{m}: `tool_result` blocks can only be in `user` "
                    f"messages"
                )
            _check_result_shape(n, m, block)
        elif block_type.endswith("_tool_result"):
            _check_server_result(n, m, block, block_type, server_uses)
        elif block_type in THINKING_TYPES:
            _check_thinking_shape(n, m, block, block_type)
            thinking_at.append(m)

    if role == "assistant" and thinking_at:
        first_type = _block_type(n, 0, blocks[0])
        if first_type not in THINKING_TYPES:
            raise _fail(MSG_THINKING_FIRST.format(n=n, found=first_type))
        last_type = _block_type(n, len(blocks) - 1, blocks[-1])
        # Not even a final assistant message (a prefill) may stop on its thinking.
        if last_type in THINKING_TYPES:
            raise _fail(MSG_THINKING_LAST.format(n=n, kind=last_type))
    return uses


# -- thinking rules that depend on the message's place in the request ----------------------


def _role_of(message: object) -> str | None:
    role = message.get("role") if isinstance(message, Mapping) else None
    return role if isinstance(role, str) else None


def _last_index(roles: Sequence[str | None], wanted: Sequence[str]) -> int | None:
    for n in range(len(roles) - 1, -1, -1):
        if roles[n] in wanted:
            return n
    return None


def _holds_result(message: object) -> bool:
    content = message.get("content") if isinstance(message, Mapping) else None
    return isinstance(content, list) and any(
        isinstance(block, Mapping) and block.get("type") == CLIENT_RESULT_TYPE
        for block in content
    )


def _tool_loop_opener(messages: Sequence[object], roles: Sequence[str | None]) -> int | None:
    """The index of the assistant message that opens the turn in progress, when the request is
    in the middle of a tool loop (its final non-system message is a user message holding a
    ``tool_result``); ``None`` otherwise. See the module docstring."""
    turns = [n for n, role in enumerate(roles) if role in ("user", "assistant")]
    if not turns or roles[turns[-1]] != "user" or not _holds_result(messages[turns[-1]]):
        return None
    users = [n for n in turns if roles[n] == "user"]
    real_turns = [n for n in users if not _holds_result(messages[n])]
    start = real_turns[-1] if real_turns else users[0]
    return next((n for n in turns if n > start and roles[n] == "assistant"), None)


def _check_opener(n: int, content: object) -> None:
    if isinstance(content, str):
        found = "text"
    elif isinstance(content, list) and content:
        found = _block_type(n, 0, content[0])
    else:
        return
    if found not in THINKING_TYPES:
        raise _fail(MSG_TOOL_LOOP_THINKING.format(n=n, found=found))


def _check_no_thinking(n: int, blocks: Sequence[object]) -> None:
    for m, block in enumerate(blocks):
        if isinstance(block, Mapping) and block.get("type") in THINKING_TYPES:
            raise _fail(MSG_THINKING_DISABLED_FINAL.format(n=n, m=m))


def _check_unmodified(n: int, blocks: Sequence[object]) -> None:
    for m, block in enumerate(blocks):
        assert isinstance(block, Mapping)
        if block.get("type") in THINKING_TYPES and not block_intact(block):
            raise _fail(MSG_THINKING_MODIFIED.format(n=n, m=m))


def _check_use(
    n: int, m: int, block: Mapping[str, Any], block_type: str, seen_ids: set[str]
) -> str:
    tool_id = block.get("id")
    if not isinstance(tool_id, str):
        raise _fail(f"messages.{n}.content.{m}.{block_type}.id: Field required")
    if not TOOL_ID_PATTERN.match(tool_id):
        raise _fail(MSG_ID_PATTERN.format(n=n, m=m, kind=block_type))
    if tool_id in seen_ids:
        raise _fail(MSG_DUPLICATE_ID.format(n=n, m=m))
    seen_ids.add(tool_id)
    if not isinstance(block.get("name"), str) or not block.get("name"):
        raise _fail(f"messages.{n}.content.{m}.{block_type}.name: Field required")
    if "input" in block and not isinstance(block["input"], Mapping):
        raise _fail(
            f"messages.{n}.content.{m}.{block_type}.input: Input should be a valid dictionary"
        )
    return tool_id


def _check_result_shape(n: int, m: int, block: Mapping[str, Any]) -> None:
    if not isinstance(block.get("tool_use_id"), str):
        raise _fail(f"messages.{n}.content.{m}.tool_result.tool_use_id: Field required")
    content = block.get("content")
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _fail(
            f"messages.{n}.content.{m}.tool_result.content: Input should be a valid string or list"
        )
    for k, inner in enumerate(content):
        if not isinstance(inner, Mapping) or not isinstance(inner.get("type"), str):
            raise _fail(f"messages.{n}.content.{m}.tool_result.content.{k}.type: Field required")
        if inner["type"] == "text":
            _check_text(n, m, inner, path=f".tool_result.content.{k}")


def _check_server_result(
    n: int, m: int, block: Mapping[str, Any], block_type: str, server_uses: dict[str, bool]
) -> None:
    use_type = SERVER_USE_FOR_RESULT.get(block_type, "server_tool_use")
    tool_id = block.get("tool_use_id")
    if not isinstance(tool_id, str):
        raise _fail(f"messages.{n}.content.{m}.{block_type}.tool_use_id: Field required")
    if tool_id not in server_uses:
        raise _fail(MSG_ORPHAN_SERVER_RESULT.format(n=n, m=m, kind=block_type, ids=tool_id,
                                                    use=use_type))
    if server_uses[tool_id]:
        raise _fail(MSG_DUPLICATE_SERVER_RESULT.format(n=n, m=m, kind=block_type, ids=tool_id,
                                                       use=use_type))
    server_uses[tool_id] = True


def _check_thinking_shape(n: int, m: int, block: Mapping[str, Any], block_type: str) -> None:
    if block_type == "thinking":
        if not isinstance(block.get("thinking"), str):
            raise _fail(f"messages.{n}.content.{m}.thinking.thinking: Field required")
        if "signature" not in block:
            raise _fail(f"messages.{n}.content.{m}.thinking.signature: Field required")
        signature = block["signature"]
        if not isinstance(signature, str) or not signature:
            raise _fail(MSG_SIGNATURE.format(n=n, m=m))
    elif not isinstance(block.get("data"), str) or not block.get("data"):
        raise _fail(f"messages.{n}.content.{m}.redacted_thinking.data: Field required")


def _results_of(blocks: Sequence[object]) -> set[str]:
    return {
        block["tool_use_id"]
        for block in blocks
        if isinstance(block, Mapping)
        and block.get("type") == CLIENT_RESULT_TYPE
        and isinstance(block.get("tool_use_id"), str)
    }


def _check_results(n: int, blocks: Sequence[object], expected: Sequence[str]) -> None:
    """A user message's results: known ids, each once, all before any other block."""
    wanted = set(expected)
    answered: set[str] = set()
    other_seen = False
    for m, block in enumerate(blocks):
        assert isinstance(block, Mapping)
        if block.get("type") != CLIENT_RESULT_TYPE:
            other_seen = True
            continue
        tool_id = block["tool_use_id"]
        if tool_id not in wanted:
            raise _fail(MSG_UNEXPECTED_RESULT.format(n=n, m=m, ids=tool_id))
        if tool_id in answered:
            raise _fail(MSG_DUPLICATE_RESULT.format(n=n, m=m, ids=tool_id))
        if other_seen:
            raise _fail(MSG_RESULTS_NOT_FIRST.format(n=n, k=len(wanted)))
        answered.add(tool_id)


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
