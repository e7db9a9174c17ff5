"""The provider's request rules as one pure function: no server, no I/O.

``check_messages_request`` raises :class:`ProviderRuleError` with the provider's own error text
(``/work/shared/reference/messages-api.md`` §5) and the ``messages.N`` / ``messages.N.content.M``
path of the first violation, or returns ``None``. The compactor's property tests use it as the
strict judge of what a forwarded view must satisfy; the fake upstream uses it to answer 400.
``tests/PROVIDER_RULES.md`` lists every §5 rule, its text and the test that shows it.

The modules, in the order a body meets them: :mod:`.request` (entry points, top-level fields,
the ``cache_control`` limit), :mod:`.messages` (the pass over ``messages``, tool pairing between
messages), :mod:`.blocks` (one message's blocks), :mod:`.thinking` (rules that depend on
``thinking`` and on a message's place); :mod:`.texts` holds the rules as data and the provider's
wording, :mod:`.oauth` the Claude Code subscription credential rules (reference §2.3).
Every public name of these modules is importable from here.
"""

from .oauth import (
    BILLING_HEADER_PREFIX,
    CLAUDE_CODE_IDENTITIES,
    MSG_CLAUDE_CODE_ONLY,
    MSG_OAUTH_NOT_SUPPORTED,
    OAUTH_BETA,
    OAUTH_TOKEN_PREFIX,
    check_claude_code_identity,
    check_oauth_beta,
    is_oauth_credential,
)
from .request import cache_control_count, check_count_tokens_request, check_messages_request
from .texts import (
    CLEAR_THINKING_EDIT,
    CLIENT_RESULT_TYPE,
    CLIENT_USE_TYPE,
    CUSTOM_TOOL_TYPES,
    EXTENDED_THINKING_DOCS,
    MAX_CACHE_CONTROL,
    MAX_MESSAGES,
    MSG_CACHE_CONTROL,
    MSG_CLEAR_THINKING,
    MSG_DUPLICATE_ID,
    MSG_DUPLICATE_RESULT,
    MSG_DUPLICATE_SERVER_RESULT,
    MSG_EMPTY_CONTENT,
    MSG_FIRST_USER,
    MSG_ID_PATTERN,
    MSG_MISSING_RESULTS,
    MSG_ORPHAN_SERVER_RESULT,
    MSG_RESULTS_NOT_FIRST,
    MSG_SIGNATURE,
    MSG_TEXT_EMPTY,
    MSG_TEXT_WHITESPACE,
    MSG_THINKING_DISABLED_FINAL,
    MSG_THINKING_FIRST,
    MSG_THINKING_LAST,
    MSG_THINKING_MODIFIED,
    MSG_TOOL_LOOP_THINKING,
    MSG_UNEXPECTED_RESULT,
    ROLES,
    SERVER_USE_FOR_RESULT,
    SERVER_USE_TYPES,
    THINKING_OFF_TYPES,
    THINKING_ON_TYPES,
    THINKING_TYPES,
    TOOL_ID_PATTERN,
    TOOL_ID_PATTERN_TEXT,
    ProviderRuleError,
    ThinkingMode,
)
from .thinking import thinking_mode

__all__ = [
    "BILLING_HEADER_PREFIX",
    "CLAUDE_CODE_IDENTITIES",
    "CLEAR_THINKING_EDIT",
    "CLIENT_RESULT_TYPE",
    "CLIENT_USE_TYPE",
    "CUSTOM_TOOL_TYPES",
    "EXTENDED_THINKING_DOCS",
    "MAX_CACHE_CONTROL",
    "MAX_MESSAGES",
    "MSG_CACHE_CONTROL",
    "MSG_CLAUDE_CODE_ONLY",
    "MSG_CLEAR_THINKING",
    "MSG_DUPLICATE_ID",
    "MSG_DUPLICATE_RESULT",
    "MSG_DUPLICATE_SERVER_RESULT",
    "MSG_EMPTY_CONTENT",
    "MSG_FIRST_USER",
    "MSG_ID_PATTERN",
    "MSG_MISSING_RESULTS",
    "MSG_OAUTH_NOT_SUPPORTED",
    "MSG_ORPHAN_SERVER_RESULT",
    "MSG_RESULTS_NOT_FIRST",
    "MSG_SIGNATURE",
    "MSG_TEXT_EMPTY",
    "MSG_TEXT_WHITESPACE",
    "MSG_THINKING_DISABLED_FINAL",
    "MSG_THINKING_FIRST",
    "MSG_THINKING_LAST",
    "MSG_THINKING_MODIFIED",
    "MSG_TOOL_LOOP_THINKING",
    "MSG_UNEXPECTED_RESULT",
    "OAUTH_BETA",
    "OAUTH_TOKEN_PREFIX",
    "ROLES",
    "SERVER_USE_FOR_RESULT",
    "SERVER_USE_TYPES",
    "THINKING_OFF_TYPES",
    "THINKING_ON_TYPES",
    "THINKING_TYPES",
    "TOOL_ID_PATTERN",
    "TOOL_ID_PATTERN_TEXT",
    "ProviderRuleError",
    "ThinkingMode",
    "cache_control_count",
    "check_claude_code_identity",
    "check_count_tokens_request",
    "check_messages_request",
    "check_oauth_beta",
    "is_oauth_credential",
    "thinking_mode",
]
