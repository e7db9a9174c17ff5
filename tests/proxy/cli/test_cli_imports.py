"""The CLI's store commands stay light: they read the store without importing the request
path, whose imports bring in the anthropic SDK (seconds of every command's start)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

_PROBE = """
import sys
from proxy.cli.commands import main
code = main(["session", "nosuch", "--config", sys.argv[1]])
print(code, "anthropic" in sys.modules, "proxy.http.errors" in sys.modules)
"""


def test_the_session_command_does_not_import_the_sdk(tmp_path: Path) -> None:
    """``session`` answers (exit 1, no such session) with neither the anthropic SDK nor the
    request path's error module imported."""
    config = tmp_path / "config.yaml"
    config.write_text("upstream: {base_url: 'https://api.anthropic.com'}\n"
                      f"store: {{path: '{tmp_path / 'state' / 'state.db'}'}}\n",
                      encoding="utf-8")
    result = subprocess.run([sys.executable, "-c", _PROBE, str(config)], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["1", "False", "False"], result.stderr
