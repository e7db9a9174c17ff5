"""bench/retention.py at a tiny size: a structure check, not a measurement."""

from __future__ import annotations

from bench import retention
from compactor import Chars4Counter
from policies import CompactionPolicy


def test_rows_count_what_the_views_keep() -> None:
    """A few corpus conversations and the synthetic sessions are compacted: every row counts
    user texts and artifacts at risk, never more kept than at risk, and prints one line."""
    named = retention.sessions(limit=3)
    assert sum(name.startswith("synthetic-") for name, _ in named) == 4
    rows = [retention.measure(named, f, "t") for f in (0.5, 0.2)]
    for row in rows:
        assert row.compacted >= 4 and row.texts > 0 and row.artifacts > 0
        assert row.texts_kept <= row.texts and row.artifacts_kept <= row.artifacts
        assert row.texts_in_budget_kept <= row.texts_in_budget <= row.texts
    table = retention.format_rows(rows)
    assert table.count("\n") == 2 and "%" in table


def test_in_budget_is_the_trails_rule_newest_first_by_rendered_cost() -> None:
    """The artifacts the trail must keep: the newest entries that fit by what they cost as
    written; a command alone over the whole budget is outside, its cut form still takes room;
    the oldest that no longer fits is outside."""
    heredoc = "cat > /x.py <<'EOF'\n" + "print('a long line of the file')\n" * 20 + "EOF"

    def call(n: int, name: str, result: str, **tool_input: str) -> list[dict]:
        return [{"role": "assistant", "content": [
                    {"type": "tool_use", "id": f"t{n}", "name": name, "input": tool_input}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": f"t{n}", "content": result}]}]

    gone = [*call(0, "Read", "text", file_path="/a.py"),
            *call(1, "Edit", "ok", file_path="/b.py", old_string="x", new_string="y"),
            *call(2, "Bash", "Exit code 0", command="make"),
            *call(3, "Bash", "Exit code 0", command=heredoc)]
    artifacts = ["/a.py", "/b.py", "make", heredoc]
    rule, counter = retention.trail_rule(), Chars4Counter()
    cut = rule.cut_entry(f"ran {heredoc} (exit 0)")
    assert cut.startswith("ran cat > /x.py <<'EOF' …[cut: ") and cut.endswith(" (exit 0)")
    budget = sum(rule.entry_cost(e, counter.count_text)
                 for e in (cut, "ran make (exit 0)", "edited /b.py"))
    assert rule.entry_cost(f"ran {heredoc} (exit 0)", counter.count_text) > budget
    inside = retention.artifacts_in_budget(gone, artifacts, budget, CompactionPolicy(), counter)
    assert inside == {"/b.py", "make"}
    wider = retention.artifacts_in_budget(gone, artifacts, 10_000, CompactionPolicy(), counter)
    assert wider == set(artifacts)
