"""Developer tooling run from the repository root (``python -m tools.<name>``); not installed."""
