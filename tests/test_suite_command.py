"""The README's test command is the one ``.ci/run`` runs, and it runs the suite in parallel
with the markers it names registered."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def readme_command() -> str:
    """The pytest part of the README's by-hand test command."""
    found = re.findall(r"pip install -e '\.\[test\]' && (python -m pytest[^\n]*)",
                       (REPO / "README.md").read_text(encoding="utf-8"))
    assert len(found) == 1, found
    return str(found[0]).strip()


def test_ci_runs_the_readmes_test_command() -> None:
    """The last pytest line of ``.ci/run`` is the README's command, which runs on every core."""
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text(encoding="utf-8")
             .splitlines() if line.strip().startswith("python -m pytest")]
    assert lines == [readme_command()]
    assert "-n auto" in readme_command()


def test_the_markers_the_readme_names_are_registered() -> None:
    """``-m "not slow"`` selects by a registered marker (``--strict-markers`` is on)."""
    options = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))[
        "tool"]["pytest"]["ini_options"]
    names = {marker.split(":", 1)[0] for marker in options["markers"]}
    assert {"slow", "browser", "claude_code"} <= names
    assert "--strict-markers" in options["addopts"]
    assert '-m "not slow"' in (REPO / "README.md").read_text(encoding="utf-8")


def test_the_long_files_go_to_the_workers_first() -> None:
    """Files go to the workers in collection order (not xdist's most-tests-first), and the
    collection puts a file with a slow test before the quick files named before it."""
    options = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))[
        "tool"]["pytest"]["ini_options"]
    assert "--no-loadscope-reorder" in options["addopts"]
    quick, long = "tests/test_suite_command.py", "tests/bench/test_steps_smoke.py"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         quick, long], cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    files = list(dict.fromkeys(line.split("::")[0] for line in result.stdout.splitlines()
                               if "::" in line))
    assert files == [long, quick]
