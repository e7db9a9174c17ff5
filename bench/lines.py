"""Product lines by kind, for this tree and for baseline commits, side by side (issue #32).

The product is ``compactor/``, ``policies/`` and ``proxy/`` without the fake provider. Each
``.py`` line is counted once, as docstring, comment, blank or code, and per top-level folder.

    python -m bench.lines --baseline 39007a2 --baseline c485c2f~1
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tokenize
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("compactor", "policies", "proxy")
KINDS = ("code", "docstring", "comment", "blank")


def is_product(path: str) -> bool:
    """Whether ``path`` (relative to the repo) is a product source file."""
    parts = path.split("/")
    return path.endswith(".py") and parts[0] in ROOTS and "fake_upstream" not in parts


def classify(source: str) -> Counter[str]:
    """How many of ``source``'s lines are code, docstring, comment and blank."""
    lines = source.splitlines()
    docs: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) \
                and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            docs.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    comments = {token.start[0] for token in tokenize.generate_tokens(io.StringIO(source).readline)
                if token.type == tokenize.COMMENT
                and lines[token.start[0] - 1].lstrip().startswith("#")} - docs
    blank = {number for number, line in enumerate(lines, 1) if not line.strip()} - docs
    counts = Counter(docstring=len(docs), comment=len(comments), blank=len(blank))
    counts["code"] = len(lines) - sum(counts.values())
    return counts


def files_at(ref: str | None) -> dict[str, str]:
    """The product files of commit ``ref`` (the work tree when ``None``), by path."""
    if ref is None:
        return {path.relative_to(REPO).as_posix(): path.read_text()
                for root in ROOTS for path in sorted((REPO / root).rglob("*.py"))
                if is_product(path.relative_to(REPO).as_posix())}
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", ref, "--", *ROOTS], cwd=REPO,
                            check=True, capture_output=True, text=True).stdout.split()
    return {path: subprocess.run(["git", "show", f"{ref}:{path}"], cwd=REPO, check=True,
                                 capture_output=True, text=True).stdout
            for path in listed if is_product(path)}


def measure(ref: str | None) -> tuple[Counter[str], Counter[str]]:
    """Lines by kind and lines by top-level folder (``proxy/http``, ``compactor``)."""
    kinds: Counter[str] = Counter()
    folders: Counter[str] = Counter()
    for path, source in files_at(ref).items():
        counts = classify(source)
        kinds += counts
        parts = path.split("/")
        folders["/".join(parts[:2]) if parts[0] == "proxy" and len(parts) > 2 else parts[0]] \
            += sum(counts.values())
    return kinds, folders


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", action="append", default=[], metavar="REF",
                        help="a commit to count beside this tree (repeatable)")
    args = parser.parse_args(argv)
    columns = [*args.baseline, "this tree"]
    measured = [measure(ref) for ref in args.baseline] + [measure(None)]
    total = [sum(kinds.values()) for kinds, _ in measured]
    print(f"{'lines':<18}" + "".join(f"{name:>14}" for name in columns))
    for kind in KINDS:
        print(f"{kind:<18}" + "".join(f"{kinds[kind]:>14,}" for kinds, _ in measured))
    print(f"{'total':<18}" + "".join(f"{count:>14,}" for count in total))
    if args.baseline:
        print(f"{'this tree vs':<18}" + "".join(
            f"{(total[-1] - count) / count:>+14.1%}" for count in total[:-1]))
    print()
    names = sorted({name for _, folders in measured for name in folders},
                   key=lambda name: -measured[-1][1][name])
    for name in names:
        print(f"{name:<18}" + "".join(f"{folders[name]:>14,}" for _, folders in measured))


if __name__ == "__main__":
    main()
