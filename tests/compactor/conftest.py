"""Fixtures of the compactor tests: the transcript and artifact roots under tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.compactor.resolver_helpers import (
    OTHER,
    SESSION,
    event_line,
    write_artifact,
    write_transcript,
)


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    """A transcript root and an artifact root with a little content for SESSION and OTHER."""
    troot, aroot = tmp_path / "transcripts", tmp_path / "artifacts"
    write_transcript(troot, SESSION, [event_line(i) for i in range(1, 6)])
    write_transcript(troot, OTHER, [event_line(i, OTHER) for i in range(1, 3)])
    write_artifact(aroot, SESSION, "report.txt", b"quarterly numbers\n")
    write_artifact(aroot, OTHER, "secret.txt", b"other session's data\n")
    return troot, aroot
