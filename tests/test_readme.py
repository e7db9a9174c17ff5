"""The README is a user's guide (issue #35): short, Claude Code on its first screen with the
fixed-part warning and the team recipe, the offline provider shown, and every link into
``docs/`` resolving (file and heading)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
FIRST_SCREEN = 60  # lines


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_is_short_and_starts_with_claude_code() -> None:
    """At most 200 lines; the Claude Code line, the health check and the fixed-part warning
    are on the first screen; the team recipe and the offline provider are there."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200
    first = "\n".join(lines[:FIRST_SCREEN])
    assert "ANTHROPIC_BASE_URL=http://127.0.0.1:8787 claude" in first
    assert "/healthz" in first and "request_completed" in first
    assert "18k tokens" in first
    text = "\n".join(lines)
    assert 'scope: "header:x-team-user"' in text
    assert 'ANTHROPIC_CUSTOM_HEADERS="x-team-user: alice"' in text
    assert "compact-proxy fake-upstream --port 8788 --script tool-loop" in text
    assert "--dump" in text
    assert "µs" not in text


def test_every_link_of_the_readme_and_docs_resolves() -> None:
    """Each relative link names a file that exists and, with a ``#``, one of its headings."""
    checked = 0
    for page in (README, *sorted((REPO / "docs").glob("*.md"))):
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), f"{page.name}: {target}"
            if anchor:
                headings = re.findall(r"^#+ (.*)$", linked.read_text(encoding="utf-8"), re.M)
                assert anchor in {_slug(h) for h in headings}, f"{page.name}: {target}"
            checked += 1
    assert checked >= 15
    for name in ("how-it-works", "operations", "admin", "library", "performance",
                 "configuration"):
        assert f"docs/{name}.md" in README.read_text(encoding="utf-8")
