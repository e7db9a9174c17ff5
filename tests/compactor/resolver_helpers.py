"""What the source-pointer resolver tests share: sessions, transcript and artifact writers."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from compactor._pointers import SourcePointer
from compactor._resolver import SourcePointerResolver

SESSION = "s1"
OTHER = "s2"
T0 = datetime(2025, 3, 1, tzinfo=UTC)


def allow_all(pointer: SourcePointer) -> bool:
    return True


def event_line(seq: int, session: str = SESSION, **extra: Any) -> bytes:
    event: dict[str, Any] = {"sequence": seq, "session_id": session, "event_id": f"e{seq}",
                             "type": "message", "text": f"event number {seq}"}
    event.update(extra)
    return json.dumps(event, sort_keys=True).encode()


def write_transcript(root: Path, session: str, lines: list[bytes], *, ending: bytes = b"\n",
                     final_newline: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{session}.jsonl"
    body = ending.join(lines) + (ending if final_newline else b"")
    path.write_bytes(body)
    return path


def write_artifact(root: Path, session: str, name: str, data: bytes) -> tuple[Path, str]:
    folder = root / session
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def resolver_for(roots: tuple[Path, Path],
                 authorize: Callable[[SourcePointer], bool] = allow_all,
                 **kwargs: Any) -> SourcePointerResolver:
    return SourcePointerResolver(roots[0], roots[1], authorize, **kwargs)


REPORT_SHA = hashlib.sha256(b"quarterly numbers\n").hexdigest()
