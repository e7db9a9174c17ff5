"""The audit log's commands of ``compact-proxy``: ``sessions`` (every session's totals),
``session`` (one session's requests, durable state and changes) and ``blocked`` (the refused
requests since a time), each reading the store of an already-loaded config."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeVar

from proxy.cli.commands import EXIT_CONFIG, EXIT_FAILED, EXIT_OK
from proxy.config import Config, ConfigError

if TYPE_CHECKING:
    from proxy.audit.log import RequestEntry, SessionSummary, StateChange
    from proxy.store import StoreBackend, StoredState

__all__ = ["AUDIT_COMMANDS"]

_T = TypeVar("_T")


class _CommandFailed(Exception):
    """A command stops with one line on stderr and this exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _read_store(config: Config, command: str, read: Callable[[StoreBackend], Awaitable[_T]],
                empty: _T) -> _T:
    """``read`` on the configured store (opened, then closed); ``empty`` when its SQLite file
    does not exist yet (a command that reads never creates it).

    Raises:
        _CommandFailed: the store failed (exit 1) or cannot be configured (exit 2).
    """
    from proxy.store import StoreError, store_for

    async def run() -> _T:
        store = await store_for(config).open()
        try:
            return await read(store)
        finally:
            await store.close()

    if config.store.backend == "sqlite" and not Path(config.store.path).exists():
        return empty
    try:
        return asyncio.run(run())
    except ConfigError as exc:
        raise _CommandFailed(str(exc), EXIT_CONFIG) from None
    except StoreError as exc:
        raise _CommandFailed(f"{command}: store failed: {exc}", EXIT_FAILED) from None


def _sessions(config: Config, args: argparse.Namespace) -> int:
    from proxy.audit.report import sessions_table

    async def read(store: StoreBackend) -> tuple[list[SessionSummary], int]:
        return await store.sessions(offset=args.offset, limit=args.limit,
                                    contains=args.contains, order=args.order)

    empty: tuple[list[SessionSummary], int] = ([], 0)
    try:
        summaries, total = _read_store(config, "sessions", read, empty)
    except _CommandFailed as exc:
        print(exc, file=sys.stderr)
        return exc.code
    if args.json:
        print(json.dumps({"sessions": [summary.as_json() for summary in summaries],
                          "total": total, "offset": args.offset, "limit": args.limit},
                         indent=2))
    elif not total:
        print("no sessions in the audit log" if not args.contains
              else f"no session id contains {args.contains!r}")
    else:
        sys.stdout.write(sessions_table(summaries, total))
    return EXIT_OK


def _session(config: Config, args: argparse.Namespace) -> int:
    from compactor import SourceResolution, session_id_problem
    from proxy.audit.report import session_json, session_text
    from proxy.http.tenants import is_tenant, scoped_key
    from proxy.sources.resolvers import ResolverPool

    sid, tenant = args.session_id, args.tenant
    problem = session_id_problem(sid)
    if problem is not None:
        print(f"session: session id: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    if not is_tenant(tenant):
        print("session: --tenant: not a tenant; a tenant is none, t<16 hex> or h<16 hex>",
              file=sys.stderr)
        return EXIT_CONFIG

    async def read(store: StoreBackend
                   ) -> tuple[list[RequestEntry], int, StoredState | None, list[StateChange]]:
        entries, total = await store.session_requests(tenant, sid, limit=args.limit)
        changes = await store.state_changes(tenant, sid, limit=args.limit)
        return entries, total, await store.get_state(scoped_key(tenant, sid)), changes

    empty: tuple[list[RequestEntry], int, StoredState | None, list[StateChange]] = (
        [], 0, None, [])
    try:
        entries, total, stored, changes = _read_store(config, "session", read, empty)
    except _CommandFailed as exc:
        print(exc, file=sys.stderr)
        return exc.code
    if not total and stored is None and not changes:
        print(f"session: no session {sid} under tenant {tenant}: no request, durable state or "
              "change (`compact-proxy sessions` lists the sessions and their tenants)",
              file=sys.stderr)
        return EXIT_FAILED
    statuses: tuple[SourceResolution, ...] = ()
    if stored is not None:
        # The session's own resolver, as on the request path (statuses only: no text).
        resolvers = ResolverPool(config.sources.transcript_root, config.sources.artifact_root,
                                 config.source_access(), s3=config.sources.s3_settings())
        state = stored.state

        async def resolve() -> tuple[SourceResolution, ...]:
            try:
                return await resolvers.resolve(sid, state, tenant=tenant)
            finally:
                await resolvers.close()

        statuses = asyncio.run(resolve())
    if args.json:
        print(json.dumps(session_json(sid, tenant, entries, total, stored, statuses, changes),
                         indent=2))
    else:
        sys.stdout.write(session_text(sid, tenant, entries, total, stored, statuses, changes))
    return EXIT_OK


def _blocked(config: Config, args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from proxy.audit.report import blocked_table, parse_since

    try:
        since = parse_since(args.since, datetime.now(UTC))
    except ValueError as exc:
        print(f"blocked: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    async def read(store: StoreBackend) -> list[RequestEntry]:
        return await store.blocked_since(since, limit=args.limit)

    try:
        none: list[RequestEntry] = []
        entries = _read_store(config, "blocked", read, none)
    except _CommandFailed as exc:
        print(exc, file=sys.stderr)
        return exc.code
    if args.json:
        print(json.dumps({"since": since.isoformat(),
                          "blocked": [entry.as_json() for entry in entries]}, indent=2))
    elif not entries:
        print(f"no blocked requests since {since.isoformat(timespec='seconds')}")
    else:
        sys.stdout.write(blocked_table(entries))
    return EXIT_OK


#: Each command's function, by its name.
AUDIT_COMMANDS: Final[dict[str, Callable[[Config, argparse.Namespace], int]]] = {
    "sessions": _sessions, "session": _session, "blocked": _blocked}
