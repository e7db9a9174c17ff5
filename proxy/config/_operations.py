"""The sections an operator reads and guards with: the admin API and console, the audit log,
the logs."""

from __future__ import annotations

from typing import Annotated, Literal

from annotated_types import Ge
from pydantic import Strict, model_validator

from policies._compaction import Text, invalid
from proxy.config._base import Bool, EnvName, Port, Positive, Seconds, Section, doc, section


@section("admin.listen")
class AdminListenConfig(Section):
    """An address of its own for the admin API and the console."""

    port: Port = doc(..., "Its port; 0 picks a free one.")
    host: Text = doc("127.0.0.1", "Its address.")


@section("admin")
class AdminConfig(Section):
    """The admin API (``/admin/...``) and the audit console."""

    token_env: EnvName = doc("COMPACT_PROXY_ADMIN_TOKEN", (
        "The variable holding the admin bearer token; unset or empty: the admin API is off (404)."))
    min_token_length: Annotated[int, Strict(), Ge(16)] = doc(32, (
        "The shortest token accepted: a shorter one is a config error at startup (`check-config`, "
        "`serve`: exit 2). 32 characters hold 128 bits even as hex (openssl rand -hex 16)."))
    failed_auth_limit: Positive = doc(5, (
        "Wrong tokens (admin API or console login) one client address may present before it is "
        "locked out: 429 rate_limit_error with retry-after."))
    lockout_s: Seconds = doc(1.0, (
        "The first lockout; each lockout in a row doubles it, up to max_lockout_s."))
    max_lockout_s: Seconds = doc(300.0, "The longest lockout.")
    cookie_secure: Bool = doc(False, (
        "Mark the console's cookies Secure whatever scheme the proxy sees: set it when TLS ends in "
        "front of the proxy."))
    listen: AdminListenConfig | None = doc(None, (
        "An address of its own for /admin and the console, {host, port}: the main listener then "
        "answers them 404. null: served on the main "
        "listener."), example={"host": "127.0.0.1", "port": 8788})

    @model_validator(mode="after")
    def _lockouts_in_order(self) -> AdminConfig:
        if self.max_lockout_s < self.lockout_s:
            raise invalid("max_lockout_s", f"must be at least admin.lockout_s "
                                           f"({self.max_lockout_s:g} < {self.lockout_s:g})")
        return self


@section("audit")
class AuditConfig(Section):
    """The audit log the store keeps, read by the admin API and the sessions, session and
    blocked commands."""

    enabled: Bool = doc(True, (
        "Keep the audit log: a record per /v1/messages and count_tokens request (session, tenant, "
        "model, token counts, layers run and their savings, refusals, statuses, the provider's "
        "usage; never message text) and per durable-state change, written after the response."))
    max_requests_per_session: Positive = doc(1000, (
        "Request records a session keeps; the oldest go first."))
    retention_days: Positive = doc(14, "Records older than this many days are dropped.")


@section("logging")
class LoggingConfig(Section):
    """structlog's output."""

    format: Literal["json", "console"] = doc("json", (
        "json (one object per line) or console (human-readable)."))
    level: Literal["debug", "info", "warning", "error"] = doc("info", "The lowest level logged.")
