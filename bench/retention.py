"""What a compacted view still holds: the user's own words and the artifact trail (issue #34).

Every corpus conversation and a few synthetic Claude Code sessions are compacted at three soft
thresholds (a share of each conversation's own size; hard limit far away) with a summariser
that carries no facts (a lower bound: a real summary may repeat some). For each row:

* user texts: the texts a person typed (``compactor._user_text.person_texts``) in input
  messages that are not in the view as they were (dropped or summarised, the first user message
  excluded), and the share of them found verbatim in the view; "in budget" is the share among
  the newest of them that fit ``user_text_budget_tokens`` (a tenth of the soft threshold);
* artifacts: the file paths (``file_path``/``path``/``notebook_path``) and commands of the
  ``tool_use`` blocks in those messages, and the share of them found in the view; "in budget"
  those whose trail entries are among the newest that fit ``artifact_trail_budget_tokens`` (a
  twentieth of the soft threshold) by their rendered cost: the trail's rule, with its entries
  (``artifact_trail``, ``entry_cost``, ``cut_entry``) taken from this tree's
  ``compactor/_trail.py`` for every tree measured. An entry that alone costs more than the
  whole budget is cut by the rule and its artifact counts as outside the budget (its cut form
  still takes its room); an artifact the rule writes no entry for counts as inside;
* tokens: the view's tokens over the soft threshold, summed over the compacted conversations
  (what keeping them costs).

``--baseline REF`` runs the same measurement on commit REF's ``compactor/`` and ``policies/``
(in a subprocess, with this tree's ``_user_text.py`` to tell person text apart and its
``_trail.py`` for the trail's rule) and prints its rows first, side by side with this tree's.

    python -m bench.retention --baseline 39007a2
    python -m bench.retention --limit 20 --fractions 0.5
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from compactor import Chars4Counter, CompactionOptions, compact_context, estimate_tokens
from compactor._user_text import person_texts
from policies import CompactionPolicy

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("COMPACT_PROXY_SHARED", REPO.parent / "shared")) / "corpus" / "real"
FRACTIONS = (0.5, 0.3, 0.15)
PATH_KEYS = ("file_path", "path", "notebook_path")
#: Where the trail's rule is read from (a baseline's subprocess points it at this tree).
TRAIL_RULE = Path(os.environ.get("COMPACT_PROXY_TRAIL_RULE", REPO / "compactor"))


@dataclass
class Row:
    """One threshold's figures over every session."""

    tree: str
    fraction: float
    sessions: int
    compacted: int
    texts: int
    texts_kept: int
    texts_in_budget: int
    texts_in_budget_kept: int
    artifacts: int
    artifacts_kept: int
    artifacts_in_budget: int
    artifacts_in_budget_kept: int
    tokens_after: int
    soft_total: int
    summary_calls: int


def synthetic_session(turns: int, seed: int) -> list[dict[str, Any]]:
    """A Claude Code-like session: person-typed requests (some with a reminder appended, some
    after a slash-command echo), then a tool loop of reads, edits and test runs per request."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"Session {seed}: make the payment tests pass."}]
    n = 0
    for turn in range(turns):
        if turn:
            text = (f"Request {seed}.{turn}: keep the retry limit at {turn + 2} and do not "
                    f"touch src/legacy_{turn}.py, it belongs to another team.")
            if turn % 3 == 0:
                messages.append({"role": "user", "content": [
                    {"type": "text", "text": "<command-name>/cost</command-name>\n"
                                             "<command-message>cost</command-message>"},
                    {"type": "text", "text": text}]})
            elif turn % 3 == 1:
                messages.append({"role": "user", "content": [{"type": "text", "text": (
                    f"{text}\n\n<system-reminder>\nThe todo list is empty.\n"
                    "</system-reminder>")}]})
            else:
                messages.append({"role": "user", "content": text})
        for step in range(4):
            n += 1
            tool_id = f"toolu_{seed:02d}{n:05d}"
            if step == 0:
                use = {"name": "Read", "input": {"file_path": f"/repo/src/pay_{seed}_{n}.py"}}
                result = "".join(f"{i:5d}\tdef f_{i}(x): return x + {n}\n" for i in range(300))
            elif step == 1:
                use = {"name": "Edit", "input": {"file_path": f"/repo/src/pay_{seed}_{n}.py",
                                                 "old_string": "x + 1", "new_string": "x + 2"}}
                result = "The file has been updated."
            else:
                use = {"name": "Bash", "input": {
                    "command": f"pytest tests/test_pay_{seed}_{n}.py -x -q",
                    "description": "Run the tests"}}
                result = f"Exit code {n % 2}\n" + "".join(
                    f"tests/test_pay_{seed}_{n}.py::test_{i} PASSED\n" for i in range(200))
            messages.append({"role": "assistant", "content": [
                {"type": "text", "text": f"Step {n}."},
                {"type": "tool_use", "id": tool_id, **use}]})
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": tool_id, "content": result}]})
        messages.append({"role": "assistant", "content": f"Request {turn} done."})
    messages.append({"role": "user", "content": "Now summarise what changed."})
    return messages


def sessions(limit: int | None) -> list[tuple[str, list[dict[str, Any]]]]:
    """The corpus conversations (up to ``limit``), then four synthetic sessions."""
    found: list[tuple[str, list[dict[str, Any]]]] = []
    paths = sorted(p for p in CORPUS.glob("*.json") if p.name != "manifest.json")
    paths += sorted(p for p in (CORPUS / "repaired").glob("*.json") if p.name != "manifest.json")
    for path in paths[:limit]:
        found.append((path.name, json.loads(path.read_text(encoding="utf-8"))["messages"]))
    found += [(f"synthetic-{seed}", synthetic_session(12 + 6 * seed, seed)) for seed in range(4)]
    return found


def _strings(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _strings(item, out)
    elif isinstance(value, list):
        for item in value:
            _strings(item, out)


def _artifacts(message: dict[str, Any]) -> list[str]:
    found: list[str] = []
    content = message.get("content")
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict) or block.get("type") != "tool_use":
            continue
        tool_input = block.get("input")
        if not isinstance(tool_input, dict):
            continue
        paths = [v for k in PATH_KEYS if isinstance(v := tool_input.get(k), str) and v]
        found += paths
        command = tool_input.get("command")
        if not paths and isinstance(command, str) and command.strip():
            found.append(command)
    return found


def _newest_within(texts: list[str], budget: int, counter: Chars4Counter) -> int:
    """How many of ``texts`` (oldest first) fit ``budget``, taking the newest first."""
    used = fitted = 0
    for text in reversed(texts):
        used += counter.count_text(text)
        if used > budget:
            break
        fitted += 1
    return fitted


def trail_rule() -> ModuleType:
    """``compactor/_trail.py`` of :data:`TRAIL_RULE`, imported apart from the tree measured."""
    package = sys.modules.get("trail_rule")
    if package is None:
        package = types.ModuleType("trail_rule")
        package.__path__ = [str(TRAIL_RULE)]
        sys.modules["trail_rule"] = package
    return importlib.import_module("trail_rule._trail")


def artifacts_in_budget(gone: list[dict[str, Any]], artifacts: list[str], budget: int,
                        policy: CompactionPolicy, counter: Chars4Counter) -> set[str]:
    """Which of ``artifacts`` the trail must keep: those of the newest entries that fit
    ``budget`` by their rendered cost (an entry alone over the budget is cut: its artifact is
    outside, its cut form takes its room), and those the rule writes no entry for."""
    rule = trail_rule()
    entries = rule.artifact_trail(gone, policy.read_tools)
    what = {entry: rule.STATUS.sub("", entry).split(" ", 1)[-1] for entry in entries}
    inside = set(artifacts) - set(what.values())
    # The rule's own fill; an entry it kept cut is not among the entries as written.
    kept = rule.entries_within(entries, budget, counter.count_text)
    return inside | {what[entry] for entry in kept if entry in what}


def measure(named: list[tuple[str, list[dict[str, Any]]]], fraction: float, tree: str) -> Row:
    """Compact every session at ``fraction`` of its size; count what the views keep."""
    counter = Chars4Counter()
    row = Row(tree, fraction, len(named), *([0] * 12))
    summaries: list[str] = []

    def summarise(span: str) -> str:
        summaries.append(span)
        return f"Earlier work: {len(json.loads(span))} messages."

    for _name, messages in named:
        soft = max(2, int(estimate_tokens(messages, counter) * fraction))
        policy = CompactionPolicy(soft_threshold_tokens=soft, hard_limit_tokens=10**9,
                                  max_tool_result_tokens=2_000)
        result = compact_context(messages, None, policy=policy, summarizer=summarise,
                                 counter=counter, options=CompactionOptions(copy=False))
        if not result.changed:
            continue
        row.compacted += 1
        row.tokens_after += result.tokens_after
        row.soft_total += soft
        kept_ids = {id(m) for m in result.messages}
        first = next((i for i, m in enumerate(messages) if m.get("role") == "user"), 0)
        gone = [m for i, m in enumerate(messages) if i != first and id(m) not in kept_ids]
        strings: list[str] = []
        _strings(result.messages, strings)
        haystack = "\n".join(strings)
        texts = [t for m in gone for t in person_texts(m)]
        fitted = _newest_within(texts, max(1, soft // 10), counter)
        row.texts += len(texts)
        row.texts_kept += sum(t in haystack for t in texts)
        row.texts_in_budget += fitted
        row.texts_in_budget_kept += sum(t in haystack for t in texts[len(texts) - fitted:])
        artifacts = list(dict.fromkeys(a for m in gone for a in _artifacts(m)))
        row.artifacts += len(artifacts)
        row.artifacts_kept += sum(a in haystack for a in artifacts)
        inside = artifacts_in_budget(gone, artifacts, max(1, soft // 20), policy, counter)
        row.artifacts_in_budget += len(inside)
        row.artifacts_in_budget_kept += sum(a in haystack for a in inside)
    row.summary_calls = len(summaries)
    return row


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f} %" if whole else "    —  "


def format_rows(rows: list[Row]) -> str:
    """The rows as a table."""
    lines = [f"{'tree':<16}{'soft':>6}{'compacted':>10}{'user texts':>11}{'kept':>9}"
             f"{'in budget':>10}{'kept':>9}{'artifacts':>10}{'kept':>9}{'in budget':>10}{'kept':>9}"
             f"{'tokens/soft':>12}"]
    for r in rows:
        lines.append(
            f"{r.tree:<16}{r.fraction:>6.2f}{r.compacted:>10}{r.texts:>11}"
            f"{_share(r.texts_kept, r.texts):>9}{r.texts_in_budget:>10}"
            f"{_share(r.texts_in_budget_kept, r.texts_in_budget):>9}{r.artifacts:>10}"
            f"{_share(r.artifacts_kept, r.artifacts):>9}{r.artifacts_in_budget:>10}"
            f"{_share(r.artifacts_in_budget_kept, r.artifacts_in_budget):>9}"
            f"{(r.tokens_after / r.soft_total if r.soft_total else 0):>12.3f}")
    return "\n".join(lines)


def baseline_rows(ref: str, fractions: list[float], limit: int | None) -> list[Row]:
    """The rows of commit ``ref``'s compactor, measured in a subprocess."""
    with tempfile.TemporaryDirectory() as tmp:
        for folder in ("compactor", "policies"):
            archive = subprocess.run(["git", "archive", ref, folder], cwd=REPO, check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        target = Path(tmp, "compactor", "_user_text.py")
        if not target.exists():
            shutil.copy(REPO / "compactor" / "_user_text.py", target)
        Path(tmp, "bench").mkdir()
        for name in ("retention.py",):
            shutil.copy(REPO / "bench" / name, Path(tmp, "bench", name))
        args = [sys.executable, "-m", "bench.retention", "--json", "--tree", ref,
                "--fractions", *map(str, fractions)]
        if limit is not None:
            args += ["--limit", str(limit)]
        env = {**os.environ, "PYTHONPATH": tmp, "COMPACT_PROXY_SHARED": str(CORPUS.parent.parent),
               "COMPACT_PROXY_TRAIL_RULE": str(TRAIL_RULE)}
        out = subprocess.run(args, cwd=tmp, env=env, check=True, capture_output=True,
                             text=True).stdout
    return [Row(**r) for r in json.loads(out)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fractions", type=float, nargs="+", default=list(FRACTIONS))
    parser.add_argument("--limit", type=int, default=None, help="corpus conversations to use")
    parser.add_argument("--baseline", default=None, help="commit to compare with")
    parser.add_argument("--tree", default="this tree", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    named = sessions(args.limit)
    rows = [measure(named, f, args.tree) for f in args.fractions]
    if args.json:
        print(json.dumps([asdict(r) for r in rows]))
        return
    if args.baseline:
        rows = baseline_rows(args.baseline, args.fractions, args.limit) + rows
    print(f"{len(named)} sessions; a summary carrying no facts; soft = share of each size")
    print(format_rows(rows))


if __name__ == "__main__":
    main()
