"""The ``compact-proxy`` command: ``serve``, ``demo``, ``fake-upstream``, ``check-config``.

Configuration problems are reported as one line on stderr with exit code 2, before anything
is started (SPEC §2). The heavy modules (the aiohttp app, the demo, the fake provider) are
imported only by the subcommand that needs them, so ``check-config`` stays light.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import yaml

from .config import CONFIG_ENV_VAR, Config, ConfigError, load_config

__all__ = ["main"]

EXIT_OK = 0
EXIT_CONFIG = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compact-proxy",
        description="A context-compacting reverse proxy for the Anthropic Messages API.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    config_help = f"the YAML config file (default: ${CONFIG_ENV_VAR})"

    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", metavar="PATH", help=config_help)

    commands.add_parser(
        "demo", help="offline demo: fake provider + proxy + a scripted agent"
    )

    fake = commands.add_parser("fake-upstream", help="run the strict offline fake provider")
    fake.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    fake.add_argument("--port", type=int, default=8788, help="port to bind (default 8788)")

    check = commands.add_parser(
        "check-config", help="validate a config and print the effective values"
    )
    check.add_argument("--config", metavar="PATH", help=config_help)
    return parser


def _load(path: str | None) -> Config | None:
    """The config, or ``None`` after printing the one-line error to stderr."""
    try:
        return load_config(path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return None


def _serve(path: str | None) -> int:
    config = _load(path)
    if config is None:
        return EXIT_CONFIG
    from .app import run_server  # imported here: aiohttp and the app only when serving

    try:
        run_server(config)  # runs until SIGINT / SIGTERM
    except ConfigError as exc:  # a problem only found at startup (e.g. an unusable store)
        print(exc, file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def _check_config(path: str | None) -> int:
    config = _load(path)
    if config is None:
        return EXIT_CONFIG
    sys.stdout.write(yaml.safe_dump(config.as_dict(), sort_keys=False, default_flow_style=False))
    return EXIT_OK


def _demo() -> int:
    from . import demo

    return int(demo.main())


def _fake_upstream(host: str, port: int) -> int:
    from .fake_upstream import run_fake_upstream

    try:
        run_fake_upstream(host=host, port=port)
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``compact-proxy`` command line and return its exit code."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help (0) and on usage errors (2)
        return exc.code if isinstance(exc.code, int) else EXIT_CONFIG
    if args.command == "serve":
        return _serve(args.config)
    if args.command == "check-config":
        return _check_config(args.config)
    if args.command == "demo":
        return _demo()
    if args.command == "fake-upstream":
        return _fake_upstream(args.host, args.port)
    parser.print_help(sys.stderr)
    return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
