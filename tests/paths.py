"""Where the shared test data lives: ``../shared`` beside the repository (as in CI), unless
``COMPACT_PROXY_SHARED`` names another folder."""

from __future__ import annotations

import os
from pathlib import Path

SHARED = Path(os.environ.get("COMPACT_PROXY_SHARED",
                             Path(__file__).resolve().parents[2] / "shared"))
CORPUS = SHARED / "corpus" / "real"

if not CORPUS.is_dir():  # fail loudly: the corpus tests must never pass vacuously
    raise RuntimeError(f"the shared corpus is missing at {CORPUS} "
                       "(set COMPACT_PROXY_SHARED to the folder holding corpus/)")
