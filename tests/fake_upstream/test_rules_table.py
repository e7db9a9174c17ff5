"""``tests/PROVIDER_RULES.md`` cannot drift: every test it names exists (module, function and
parameter id), every section of reference §5 has its table, every row names a test or says why
it cannot, and every error text the fake has (the ``MSG_*`` constants) is named by some row."""

from __future__ import annotations

import importlib
import re
from itertools import product
from pathlib import Path
from types import ModuleType

import pytest

from proxy.fake_upstream import rules, wire

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "tests" / "PROVIDER_RULES.md"
SECTIONS = ("5.1", "5.2", "5.3", "5.4", "5.5", "5.6")
REFERENCE = re.compile(r"`(tests/[\w/]+\.py::[^`]+)`")
# A row that names no test must say why, in its text column.
WHY_UNTESTED = ("not checked offline", "not a request rule")


def _rows() -> list[tuple[str, list[str]]]:
    """Every table row under a ``##`` heading: (heading, its cells)."""
    heading, rows = "", []
    for line in TABLE.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            heading = line[3:]
        elif line.startswith("| ") and not line.startswith(("| rule |", "|---")):
            rows.append((heading, [cell.strip() for cell in line.strip().strip("|").split("|")]))
    return rows


def _module_of(path: str) -> ModuleType:
    assert (ROOT / path).is_file(), f"the table names a module that does not exist: {path}"
    return importlib.import_module(path.removesuffix(".py").replace("/", "."))


def _param_ids(test: object) -> set[str]:
    """The ``[…]`` ids pytest gives ``test``: explicit ids only (``pytest.param(id=…)`` or an
    ``ids=`` list), stacked ``parametrize`` marks joined with ``-`` in application order."""
    marks = [mark for mark in getattr(test, "pytestmark", ()) if mark.name == "parametrize"]
    per_mark: list[list[str | None]] = []
    for mark in marks:  # the bottom decorator is applied, and named, first
        values, ids = mark.args[1], mark.kwargs.get("ids")
        per_mark.append([getattr(value, "id", None) or (
            ids[k] if isinstance(ids, (list, tuple)) else None) for k, value in enumerate(values)])
    return {"-".join(parts) for parts in product(*per_mark)
            if all(part is not None for part in parts)} if per_mark else set()


def _exists(reference: str) -> bool:
    path, _, name = reference.partition("::")
    function, _, param = name.partition("[")
    test = getattr(_module_of(path), function, None)
    if not callable(test) or not function.startswith("test_"):
        return False
    return not param or param.removesuffix("]") in _param_ids(test)


def test_every_section_of_reference_5_has_a_table() -> None:
    """Sections 5.1 to 5.6 each have a heading with at least one row."""
    headings = {heading.split()[0] for heading, _ in _rows()}
    assert set(SECTIONS) <= headings


def test_every_row_is_well_formed_and_names_a_test_or_why_not() -> None:
    """Four cells per row; the test cell names tests unless the row says it cannot."""
    for heading, cells in _rows():
        assert len(cells) == 4, f"{heading}: a row needs 4 cells, got {cells}"
        named = re.findall(r"`([^`]*)`", cells[-1])
        assert named == REFERENCE.findall(cells[-1]), f"not a module::test name in {named}"
        if not named:
            assert cells[-1] == "—" and cells[1].startswith(WHY_UNTESTED), (heading, cells[0])


def test_every_named_test_exists() -> None:
    """Each ``module::test`` or ``module::test[param]`` in the table is a collected test."""
    unknown = [ref for _, cells in _rows() for ref in REFERENCE.findall(cells[-1])
               if not _exists(ref)]
    assert not unknown, f"the table names tests that do not exist: {unknown}"


def test_a_wrong_name_is_caught() -> None:
    """The existence check itself: a misspelt test, module or parameter id is not found."""
    assert _exists("tests/fake_upstream/test_rules.py::test_invalid_bodies_raise_the_provider_"
                   "text[missing result]")
    assert _exists("tests/fake_upstream/test_rules_thinking.py::test_tool_loop_turn_must_"
                   "start_with_thinking[opener starts with text-enabled]")
    assert not _exists("tests/fake_upstream/test_rules.py::test_invalid_bodies_raise_the_"
                       "provider_text[no such case]")
    assert not _exists("tests/fake_upstream/test_rules.py::test_no_such_test")
    assert not _exists("tests/fake_upstream/test_rules_corpus.py::CORPUS")


@pytest.mark.parametrize("module", [rules, wire], ids=lambda module: module.__name__)
def test_every_error_text_of_the_fake_has_a_row(module: object) -> None:
    """No provider text is enforced without a row: each ``MSG_*`` constant is named."""
    table = TABLE.read_text(encoding="utf-8")
    names = [name for name in vars(module) if name.startswith("MSG_")]
    assert names
    assert [name for name in names if f"`{name}`" not in table] == []
