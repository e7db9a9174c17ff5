"""One kind of bounded cache in the product (issue #32): cachetools' ``LRUCache`` (by count,
or by bytes with ``getsizeof``). No lru-dict, no hand-kept ``OrderedDict``; ``functools``'
``lru_cache`` only on the small pure functions listed here, whose answer depends on their
arguments alone."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PRODUCT = ("compactor", "policies", "proxy")

#: (module, function): pure functions memoised by ``functools.lru_cache``.
PURE_MEMOS = {
    ("compactor/_resolver.py", "_parsed"),  # a pointer's text -> its parts
    ("compactor/_sticky.py", "_derived_key"),  # a frozen policy -> its key
    ("proxy/http/admin_gate.py", "_is_admin_path"),  # a path -> whether it is /admin
    ("proxy/http/forward.py", "_joined"),  # (base URL, path) -> an immutable URL
    ("proxy/store/_rows.py", "decode_state"),  # a stored row -> its frozen state
}


def _sources() -> list[Path]:
    return sorted(path for folder in PRODUCT for path in (ROOT / folder).rglob("*.py")
                  if "fake_upstream" not in path.parts)


def _other_caches(path: Path) -> list[str]:
    found = []
    name = path.relative_to(ROOT).as_posix()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                       else [alias.name for alias in node.names])
            names = [alias.name for alias in node.names]
            if "lru" in modules or "OrderedDict" in names:
                found.append(f"{name}:{node.lineno}: imports {modules} {names}")
        elif isinstance(node, ast.Attribute) and node.attr == "OrderedDict":
            found.append(f"{name}:{node.lineno}: OrderedDict")
        elif isinstance(node, ast.Attribute) and node.attr == "lru_cache":
            found.append(f"{name}:{node.lineno}: lru_cache")
    return found


def _pure_memo_lines() -> set[str]:
    lines = set()
    for module, function in PURE_MEMOS:
        path = ROOT / module
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name == function:
                lines.update(f"{module}:{d.lineno}: lru_cache" for d in ast.walk(node)
                             if isinstance(d, ast.Attribute) and d.attr == "lru_cache")
            elif (isinstance(node, ast.Assign) and len(node.targets) == 1
                  and isinstance(node.targets[0], ast.Name) and node.targets[0].id == function):
                lines.update(f"{module}:{d.lineno}: lru_cache" for d in ast.walk(node.value)
                             if isinstance(d, ast.Attribute) and d.attr == "lru_cache")
    return lines


def test_every_bounded_cache_is_cachetools() -> None:
    allowed = _pure_memo_lines()
    assert len(allowed) == len(PURE_MEMOS), "a listed pure memo is gone: update PURE_MEMOS"
    others = [hit for path in _sources() for hit in _other_caches(path) if hit not in allowed]
    assert others == []


def test_lru_dict_is_not_a_dependency() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert "lru-dict" not in pyproject
