"""What the CLI tests share: the compact-proxy command run as a process, configs, store helpers."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import redis.asyncio as aioredis
import yaml

from compactor import DurableContextState
from proxy.store import SQLiteStateStore

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "config.example.yaml"
_SCRIPT = shutil.which("compact-proxy") or (
    str(Path(sys.executable).with_name("compact-proxy"))
    if Path(sys.executable).with_name("compact-proxy").exists()
    else None
)
COMMAND = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "proxy.cli"]
BAD_KEY_LINE = (
    "config error: compaction.soft_treshold_tokens: unknown key "
    "(did you mean 'soft_threshold_tokens'?)"
)


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        # No key and no base URL from the developer's shell: the commands must work without.
        if k not in ("COMPACT_PROXY_CONFIG", "COMPACT_PROXY_ADMIN_TOKEN")
        and not k.startswith("ANTHROPIC_")
    }
    env.update(extra)
    return env


def run(
    args: list[str], cwd: Path, timeout: float = 60, *, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *args],
        cwd=cwd,
        env=clean_env(**env),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def bad_config(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "upstream: {base_url: 'https://api.anthropic.com'}\n"
        f"store: {{path: '{tmp_path / 'state' / 'state.db'}'}}\n"
        "compaction:\n  soft_treshold_tokens: 1000\n",
        encoding="utf-8",
    )
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ------------------------------------------------------------------------------ check-config


def shown_values(stdout: str) -> object:
    """The effective values ``check-config --show`` prints as YAML before its OK line."""
    *values, last = stdout.splitlines()
    assert last.startswith("OK: "), stdout[-300:]
    return yaml.safe_load("\n".join(values))


# ------------------------------------------------------------------------------ tenant-id

SECRET = "s3cret-for-tenants"
CREDENTIAL = "sk-ant-api03-example-credential"


def scoped_config(tmp_path: Path, scope: str | None) -> Path:
    path = tmp_path / "scoped.yaml"
    session = f"session: {{scope: '{scope}'}}\n" if scope else ""
    path.write_text(
        "upstream: {base_url: 'https://api.anthropic.com'}\n"
        f"store: {{path: '{tmp_path / 'state' / 'state.db'}'}}\n" + session,
        encoding="utf-8",
    )
    return path


# ------------------------------------------------------------------------------ move-session

TENANT = "t0123456789abcdef"


def _state(content: str) -> DurableContextState:
    return DurableContextState.from_dict({
        "facts": [{"fact_id": "f1", "content": content, "source_pointer": "transcript:s:1",
                   "last_confirmed_at": "2025-03-01T12:30:00+00:00"}],
        "pending_items": [], "retrieval_evidence": []})


def _put(db: Path, key: str, content: str, checkpoint: bytes | None = None) -> None:
    async def go() -> None:
        store = await SQLiteStateStore(db).open()
        try:
            await store.put_state(key, _state(content), None)
            if checkpoint is not None:
                await store.put_record(key, "checkpoint:main:abc", checkpoint)
        finally:
            await store.close()

    asyncio.run(go())


def _read(db: Path, key: str) -> tuple[str | None, bytes | None]:
    async def go() -> tuple[str | None, bytes | None]:
        store = await SQLiteStateStore(db).open()
        try:
            stored = await store.get_state(key)
            record = await store.get_record(key, "checkpoint:main:abc")
        finally:
            await store.close()
        return (stored.state.facts[0].content if stored else None), record

    return asyncio.run(go())


async def _flush(url: str) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        await client.flushdb()
    finally:
        await client.aclose()
