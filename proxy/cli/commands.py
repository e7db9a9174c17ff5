"""The ``compact-proxy`` command: its parser, the commands that are not the audit log's
(:mod:`proxy.cli.audit`) and the store helper they share.

Configuration problems are reported as one line on stderr with exit code 2, before anything
is started (SPEC §2). The heavy modules (the aiohttp app, the demo, the fake provider) are
imported only by the subcommand that needs them, so ``check-config`` stays light.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import yaml

from proxy.config import CONFIG_ENV_VAR, Config, ConfigError, load_config
from proxy.telemetry.masking import mask_config, mask_url

if TYPE_CHECKING:
    from proxy.store import StoreBackend

__all__ = ["main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2

_T = TypeVar("_T")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compact-proxy",
        description="A context-compacting reverse proxy for the Anthropic Messages API.",
    )
    parser.add_argument("--version", action="version", version=f"compact-proxy {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    config_help = f"the YAML config file (default: ${CONFIG_ENV_VAR})"

    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", metavar="PATH", help=config_help)
    serve.add_argument("--workers", type=_positive, metavar="N",
                       help="processes serving the port together (default: listen.workers)")

    commands.add_parser("demo", help="offline demo: fake provider + proxy + a scripted agent")

    fake = commands.add_parser("fake-upstream", help="run the strict offline fake provider")
    fake.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    fake.add_argument("--port", type=int, default=8788, help="port to bind (default 8788)")
    fake.add_argument("--provider", choices=("anthropic", "bedrock", "vertex"),
                      default="anthropic",
                      help="also speak Bedrock's or Vertex's wire (test credentials: "
                           "docs/bedrock.md, docs/vertex.md)")
    fake.add_argument("--script", choices=("default", "tool-loop"), default="default",
                      help="default: one short text; tool-loop: call the request's tools "
                      "--steps times, then a final text (offline rehearsal of an agent)")
    fake.add_argument("--steps", type=_count, default=3, metavar="N",
                      help="tool calls per task with --script tool-loop (default 3)")
    fake.add_argument("--dump", metavar="DIR",
                      help="write each request received to DIR (JSON, and the system text)")
    fake.add_argument("--summary-first-token-ms", type=float, default=0.0, metavar="MS",
                      help="a summary call's time to its first token (default 0)")
    fake.add_argument("--summary-token-ms", type=float, default=0.0, metavar="MS",
                      help="a summary call's time per output token (default 0)")
    fake.add_argument("--summary-writes-max-tokens", action="store_true",
                      help="a summary call takes as long as writing its whole max_tokens")

    check = commands.add_parser(
        "check-config", help="validate a config; one OK line (--show: every effective value)")
    check.add_argument("--config", metavar="PATH", help=config_help)
    check.add_argument("--show", action="store_true",
                       help="print every effective value (secrets masked) before the OK line")

    tenant = commands.add_parser(
        "tenant-id", help="print the tenant of the credential (or scope header value) on stdin")
    tenant.add_argument("--config", metavar="PATH", help=config_help)

    move = commands.add_parser(
        "move-session", help="move a session's durable state and sources to another tenant")
    move.add_argument("--config", metavar="PATH", help=config_help)
    move.add_argument("--session", required=True, metavar="SID", help="the session id")
    move.add_argument("--to-tenant", required=True, metavar="TENANT", help="the new tenant")
    move.add_argument("--from-tenant", default="none", metavar="TENANT",
                      help="the tenant it is under now (default: none)")

    migrate = commands.add_parser(
        "migrate-redis-keys",
        help="move the Redis store's durable states to the hash-tagged key layout")
    migrate.add_argument("--config", metavar="PATH", help=config_help)

    report = commands.add_parser(
        "report", help="tokens and cost per session, with and without the proxy")
    report.add_argument("--config", metavar="PATH", help=config_help)
    report.add_argument("--json", action="store_true", help="print one JSON object")
    report.add_argument("--session", metavar="SID",
                        help="only this session (its id, or its store key)")
    report.add_argument("--tenant", metavar="TENANT",
                        help="with --session: only that tenant's session (default: any)")

    sessions = commands.add_parser(
        "sessions", help="every session in the audit log, newest first, with its totals")
    sessions.add_argument("--config", metavar="PATH", help=config_help)
    sessions.add_argument("--json", action="store_true", help="print one JSON object")
    sessions.add_argument("--contains", metavar="TEXT",
                          help="only sessions whose id contains TEXT (any case)")
    sessions.add_argument("--order", choices=("last_seen", "blocked"), default="last_seen",
                          help="newest first (default), or most refusals first")
    sessions.add_argument("--offset", type=_count, default=0, metavar="N",
                          help="skip the first N sessions")
    sessions.add_argument("--limit", type=_positive, default=50, metavar="N",
                          help="show at most N sessions (default 50)")

    session = commands.add_parser(
        "session", help="one session: its requests, its durable state and the sources' status")
    session.add_argument("session_id", metavar="SID", help="the session id")
    session.add_argument("--tenant", default="none", metavar="TENANT",
                         help="its tenant (default: none)")
    session.add_argument("--config", metavar="PATH", help=config_help)
    session.add_argument("--json", action="store_true", help="print one JSON object")
    session.add_argument("--limit", type=_positive, default=20, metavar="N",
                         help="show its N newest requests (default 20)")

    blocked = commands.add_parser("blocked", help="the requests a limit refused since a time")
    blocked.add_argument("--since", default="24h", metavar="WHEN",
                         help="30m, 1h, 2d (back from now) or an ISO time (default 24h)")
    blocked.add_argument("--config", metavar="PATH", help=config_help)
    blocked.add_argument("--json", action="store_true", help="print one JSON object")
    blocked.add_argument("--limit", type=_positive, default=1000, metavar="N",
                         help="show at most N (default 1000)")
    return parser


def _version() -> str:
    """The installed package's version (``unknown`` when run from a tree never installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("compact-proxy")
    except PackageNotFoundError:
        return "unknown"


def _count(text: str) -> int:
    """An integer >= 0 (argparse type)."""
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"not an integer >= 0: {text!r}")
    return int(text)


def _positive(text: str) -> int:
    """An integer >= 1 (argparse type)."""
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"not an integer >= 1: {text!r}")
    return value


class CommandFailed(Exception):
    """A command stops with one line on stderr and this exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def read_store(config: Config, command: str,
               read: Callable[[StoreBackend], Awaitable[_T]]) -> _T | None:
    """``read`` on the configured store (opened, then closed); ``None`` when its SQLite file
    does not exist yet (a command that reads never creates it). ``CommandFailed`` (exit 1)
    when the store fails."""
    from proxy.store import StoreError

    if config.store.backend == "sqlite" and not Path(config.store.path).exists():
        return None
    try:
        return asyncio.run(_on_store(config, read))
    except StoreError as exc:
        raise CommandFailed(f"{command}: store failed: {exc}", EXIT_FAILED) from None


async def _on_store(config: Config, use: Callable[[StoreBackend], Awaitable[_T]]) -> _T:
    """``use`` on the configured store, opened for it and closed after."""
    from proxy.store import store_for

    store = await store_for(config).open()
    try:
        return await use(store)
    finally:
        await store.close()


def _serve(config: Config, args: argparse.Namespace) -> int:
    config.admin_token()  # a set but unusable token stops here
    if args.workers is not None:  # --workers overrides listen.workers
        try:
            config = dataclasses.replace(
                config, listen=dataclasses.replace(config.listen, workers=args.workers))
        except ConfigError as exc:
            raise CommandFailed(f"serve: --workers: {exc.problem}", EXIT_CONFIG) from None
    if config.listen.workers > 1:
        # The supervisor checks the address and the store before it imports the app.
        from proxy.server.workers import supervise as run_server
    else:
        from proxy.server.app import run_server  # aiohttp and the app only when serving
    try:
        return run_server(config)  # runs until SIGINT / SIGTERM
    except KeyboardInterrupt:
        return EXIT_OK


def _check_config(config: Config, args: argparse.Namespace) -> int:
    config.admin_token()  # a set but unusable token stops here
    if args.show:  # secrets a URL carries (store.url's Redis password) are shown as ***
        sys.stdout.write(yaml.safe_dump(mask_config(config.as_dict()), sort_keys=False,
                                        default_flow_style=False))
    _check_store(config)
    # The one OK line: where it listens, the upstream, the store and main's thresholds.
    main_policy = config.role_policies().policy_for("main")
    store = (f"sqlite {config.store.path}" if config.store.backend == "sqlite"
             else f"redis {mask_url(config.store.url or '')}")
    upstream = mask_url(str(config.upstream.base_url))
    print(f"OK: listen http://{config.listen.host}:{config.listen.port}, upstream {upstream}, "
          f"store {store}, main soft {main_policy.soft_threshold_tokens:,} / hard "
          f"{main_policy.hard_limit_tokens:,} tokens"
          + ("" if args.show else " (--show prints every value)"))
    return EXIT_OK


def _check_store(config: Config) -> None:
    """``ConfigError`` when ``serve`` could not open the store. Redis is connected to (and
    closed); SQLite is not created here: the nearest existing folder of ``store.path`` (the
    file itself, when it exists) must be writable."""
    if config.store.backend == "redis":
        from proxy.server.workers import check_store

        check_store(config)
        return
    path = Path(config.store.path).expanduser().absolute()
    existing = path if path.exists() else next(p for p in path.parents if p.exists())
    if existing == path and not path.is_file():
        raise ConfigError("store.path", f"{path} is not a file")
    if not os.access(existing, os.W_OK):
        raise ConfigError("store.path", f"cannot open the state store: {existing} is not "
                                        "writable")


def _tenant_id(config: Config, args: argparse.Namespace) -> int:
    from proxy.http.tenants import NO_TENANT, TenantScope

    scope = TenantScope.from_config(config.session)
    if scope.scope == "none":
        print(NO_TENANT)
        return EXIT_OK
    value = sys.stdin.readline().strip()
    header = scope.scope.partition(":")[2]
    what = f"{header} header value" if header else "credential"
    if not value:
        raise CommandFailed(f"tenant-id: no {what} on stdin (session.scope {scope.scope})",
                            EXIT_CONFIG)
    tenant = (scope.credential_tenant(value) if scope.scope == "credential"
              else scope.header_tenant(value))
    print(tenant)
    return EXIT_OK


def _migrate_redis_keys(config: Config, args: argparse.Namespace) -> int:
    if config.store.backend != "redis":
        raise CommandFailed("migrate-redis-keys: store.backend is not redis: nothing to migrate",
                            EXIT_CONFIG)
    from proxy.sources.migrate import LayoutMigration, migrate_redis_layout
    from proxy.store import RedisStateStore, StoreError

    async def migrate(store: StoreBackend) -> LayoutMigration:
        assert isinstance(store, RedisStateStore)
        return await migrate_redis_layout(store)

    try:
        done = asyncio.run(_on_store(config, migrate))
    except StoreError as exc:
        raise CommandFailed(f"migrate-redis-keys: {exc}", EXIT_FAILED) from None
    print(f"moved {done.moved} durable state(s) to the hash-tagged key layout")
    for session_key in done.kept:
        print(f"kept the old state of {session_key}: a state exists under its new key "
              "(delete one of the two)")
    return EXIT_OK


def _move_session(config: Config, args: argparse.Namespace) -> int:
    from proxy.sources.migrate import MoveRefused, SessionMoved, move_session_and_sources
    from proxy.store import StoreError

    roots = config.sources.transcript_root, config.sources.artifact_root
    session_id, from_tenant, to_tenant = args.session, args.from_tenant, args.to_tenant

    async def move(store: StoreBackend) -> SessionMoved:
        objects = None
        if any(root.startswith("s3://") for root in roots):
            from proxy.sources.s3_client import S3ObjectStore

            objects = S3ObjectStore(config.sources.s3_settings())
        try:
            return await move_session_and_sources(store, roots, session_id, from_tenant,
                                                  to_tenant, objects=objects)
        finally:
            if objects is not None:
                await objects.close()

    try:
        moved = asyncio.run(_on_store(config, move))
    except MoveRefused as exc:
        raise CommandFailed(f"move-session: {exc}", EXIT_CONFIG) from None
    except StoreError as exc:
        raise CommandFailed(f"move-session: store failed: {exc}", EXIT_FAILED) from None
    if moved.state is not None:
        print(f"moved the durable state of session {session_id} from tenant {from_tenant} to "
              f"tenant {to_tenant} (now version {moved.state.version}); its checkpoints were "
              "not moved and are rebuilt on its next request")
    for source, target in moved.sources:
        print(f"moved {source} -> {target}")
    return EXIT_OK


def _report(config: Config, args: argparse.Namespace) -> int:
    from proxy.accounting.report import build_report

    session, tenant = args.session, args.tenant
    rows = read_store(config, "report", lambda store: store.usage_rows()) or []
    if session is not None and tenant is not None:
        from proxy.http.tenants import scoped_key

        rows = [row for row in rows if row.session_key == scoped_key(tenant, session)]
    elif session is not None:
        rows = [row for row in rows
                if session in (row.session_key, row.session_key.rpartition("/")[2])]
    report = build_report(rows, config.price_for)
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    elif not rows:
        print("no usage recorded yet" if session is None
              else f"no usage recorded for session {session}")
    else:
        sys.stdout.write(report.as_text())
    return EXIT_OK


def _fake_upstream(args: argparse.Namespace) -> int:
    from proxy.fake_upstream import SummaryTiming, run_fake_upstream
    from proxy.fake_upstream.tool_loop import RequestDump, ToolLoopScript

    script = ToolLoopScript(args.steps) if args.script == "tool-loop" else None
    dump = RequestDump(Path(args.dump)) if args.dump else None
    try:
        timing = SummaryTiming(args.summary_first_token_ms / 1000, args.summary_token_ms / 1000,
                               args.summary_writes_max_tokens)
    except ValueError as exc:
        print(f"compact-proxy fake-upstream: {exc}", file=sys.stderr)
        return EXIT_FAILED
    with contextlib.suppress(KeyboardInterrupt):
        run_fake_upstream(host=args.host, port=args.port, provider=args.provider,
                          script=script, on_record=dump, summary_timing=timing)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``compact-proxy`` command line and return its exit code."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help (0) and on usage errors (2)
        return exc.code if isinstance(exc.code, int) else EXIT_CONFIG
    if args.command == "demo":
        from proxy.cli import demo

        return demo.main()
    if args.command == "fake-upstream":
        return _fake_upstream(args)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_CONFIG
    from proxy.cli import audit

    command = {"serve": _serve, "check-config": _check_config, "tenant-id": _tenant_id,
               "move-session": _move_session, "migrate-redis-keys": _migrate_redis_keys,
               "report": _report, "sessions": audit.sessions, "session": audit.session,
               "blocked": audit.blocked}[args.command]
    try:  # every other command reads the config first
        return command(load_config(args.config), args)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_CONFIG
    except CommandFailed as exc:
        print(exc, file=sys.stderr)
        return exc.code
