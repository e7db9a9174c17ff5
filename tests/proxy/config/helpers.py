"""What the proxy.config tests share: the repo's example config, a minimal upstream, write()."""

from __future__ import annotations

import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "config.example.yaml"
UPSTREAM = {"upstream": {"base_url": "https://api.anthropic.com"}}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path
