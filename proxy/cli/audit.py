"""The audit log's commands of ``compact-proxy``: ``sessions`` (every session's totals),
``session`` (one session's requests, durable state and changes) and ``blocked`` (the refused
requests since a time)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING

from proxy.cli.commands import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, CommandFailed, read_store
from proxy.config import Config

if TYPE_CHECKING:
    from proxy.audit.log import RequestEntry, StateChange
    from proxy.store import StoreBackend, StoredState

__all__ = ["blocked", "session", "sessions"]


def sessions(config: Config, args: argparse.Namespace) -> int:
    from proxy.audit.report import sessions_table

    summaries, total = read_store(config, "sessions", lambda store: store.sessions(
        offset=args.offset, limit=args.limit, contains=args.contains, order=args.order)) or ([], 0)
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


def session(config: Config, args: argparse.Namespace) -> int:
    from compactor import SourceResolution, session_id_problem
    from proxy.audit.report import session_json, session_text
    from proxy.http.tenants import is_tenant, scoped_key
    from proxy.sources.resolvers import ResolverPool

    sid, tenant = args.session_id, args.tenant
    problem = session_id_problem(sid)
    if problem is not None:
        raise CommandFailed(f"session: session id: {problem}", EXIT_CONFIG)
    if not is_tenant(tenant):
        raise CommandFailed("session: --tenant: not a tenant; a tenant is none, t<16 hex> or "
                            "h<16 hex>", EXIT_CONFIG)

    async def read(store: StoreBackend
                   ) -> tuple[list[RequestEntry], int, StoredState | None, list[StateChange]]:
        entries, total = await store.session_requests(tenant, sid, limit=args.limit)
        changes = await store.state_changes(tenant, sid, limit=args.limit)
        return entries, total, await store.get_state(scoped_key(tenant, sid)), changes

    entries, total, stored, changes = read_store(config, "session", read) or ([], 0, None, [])
    if not total and stored is None and not changes:
        raise CommandFailed(f"session: no session {sid} under tenant {tenant}: no request, "
                            "durable state or change (`compact-proxy sessions` lists the "
                            "sessions and their tenants)", EXIT_FAILED)
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


def blocked(config: Config, args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from proxy.audit.report import blocked_table, parse_since

    try:
        since = parse_since(args.since, datetime.now(UTC))
    except ValueError as exc:
        raise CommandFailed(f"blocked: {exc}", EXIT_CONFIG) from None

    entries = read_store(config, "blocked",
                         lambda store: store.blocked_since(since, limit=args.limit)) or []
    if args.json:
        print(json.dumps({"since": since.isoformat(),
                          "blocked": [entry.as_json() for entry in entries]}, indent=2))
    elif not entries:
        print(f"no blocked requests since {since.isoformat(timespec='seconds')}")
    else:
        sys.stdout.write(blocked_table(entries))
    return EXIT_OK

