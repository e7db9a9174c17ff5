"""Smoke test of ``bench.lines``: it classifies each line once and prints the columns."""

from __future__ import annotations

import pytest

from bench import lines


def test_each_line_is_counted_once_by_kind() -> None:
    source = '"""Module.\n\nMore."""\n\n# a comment\nx = 1  # trailing\n\n\ndef f():\n' \
             '    """One line."""\n    return x\n'
    assert lines.classify(source) == {"docstring": 4, "comment": 1, "blank": 3, "code": 3}


def test_the_fake_provider_and_other_folders_are_not_product() -> None:
    assert lines.is_product("proxy/http/handlers.py")
    assert lines.is_product("compactor/_pipeline.py")
    assert not lines.is_product("proxy/fake_upstream/rules/request.py")
    assert not lines.is_product("bench/lines.py")
    assert not lines.is_product("proxy/admin/console/static/app.js")


def test_a_baseline_column_beside_this_tree(capsys: pytest.CaptureFixture[str]) -> None:
    lines.main(["--baseline", "HEAD"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["lines", "HEAD", "this", "tree"]
    total = next(row for row in out if row.startswith("total")).split()
    assert int(total[1].replace(",", "")) > 10_000 and int(total[2].replace(",", "")) > 10_000
    assert any(row.startswith("compactor ") for row in out)
