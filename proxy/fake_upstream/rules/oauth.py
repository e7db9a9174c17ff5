"""Claude Code subscription credentials (reference §2.3): which ``Authorization`` is an OAuth
login, the beta it needs, and the system identity a request must carry to be served with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from .texts import ProviderRuleError, _fail

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

