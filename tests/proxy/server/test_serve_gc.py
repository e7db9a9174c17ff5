"""``serve`` leaves what startup made out of later garbage collections (``gc.freeze``)."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

from proxy.config import Config
from proxy.server.app import serve
from tests.redis_server import free_port


async def test_startup_objects_are_left_out_of_later_collections(tmp_path: Path) -> None:
    """Once serving, the modules, the app and the config (~200k objects) are frozen: a full
    collection walks only what was made since, not all of them every time."""
    config = Config.from_mapping({
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "upstream": {"base_url": "http://127.0.0.1:9"},
        "compaction": {"token_counter": "chars4"},
        "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
        "sources": {"transcript_root": str(tmp_path), "artifact_root": str(tmp_path)},
    })
    gc.unfreeze()
    stop, started = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(config, stop=stop, started=started.set))
    try:
        await asyncio.wait_for(started.wait(), 30)
        assert gc.get_freeze_count() > 10_000
        tracked = len(gc.get_objects())
        assert tracked < gc.get_freeze_count()  # what a full collection still walks
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        gc.unfreeze()
