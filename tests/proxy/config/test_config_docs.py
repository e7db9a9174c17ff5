"""The configuration reference and config.example.yaml are generated from the config models:
these tests fail when either is stale, or when a key has no description."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from proxy.config import Config, load_config
from tools import config_docs as docs

REPO = Path(__file__).resolve().parents[3]


def test_generated_files_are_current() -> None:
    """docs/configuration.md and config.example.yaml are what the models generate now."""
    stale = "stale: run python -m tools.config_docs --write"
    reference = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert reference == docs.reference(), stale
    assert (REPO / "config.example.yaml").read_text(encoding="utf-8") == docs.example(), stale


def test_every_key_has_a_description_and_a_row() -> None:
    """Each key of every section has a description, and a row in the reference; each
    effective key (check-config's output) is among them."""
    documented = {key.name for key in docs.keys(Config)}
    assert [key.name for key in docs.keys(Config) if not key.description] == []
    reference = docs.reference()
    for name in documented:
        assert f"`{name}`" in reference, name
    for section, values in Config().as_dict().items():
        if section not in ("prices", "policies"):
            assert {f"{section}.{name}" for name in values} <= documented, section


def test_the_example_is_the_defaults_with_a_provider(tmp_path: Path) -> None:
    """The generated example loads to the defaults plus upstream.base_url."""
    path = tmp_path / "config.yaml"
    path.write_text(docs.example(), encoding="utf-8")
    assert load_config(path) == Config.from_mapping(
        {"upstream": {"base_url": "https://api.anthropic.com"}})
    assert yaml.safe_load(docs.example())["limits"]["max_json_objects"] == 200_000


def test_check_reports_a_stale_file_and_write_mends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m tools.config_docs` exits 1 naming a stale file; --write rewrites it."""
    reference, example = tmp_path / "docs" / "configuration.md", tmp_path / "config.example.yaml"
    monkeypatch.setattr(docs, "REPO", tmp_path)
    monkeypatch.setattr(docs, "REFERENCE", reference)
    monkeypatch.setattr(docs, "EXAMPLE", example)
    example.write_text(docs.example().replace("port: 8787", "port: 9999"), encoding="utf-8")
    assert docs.main([]) == 1
    assert "stale: docs/configuration.md, config.example.yaml" in capsys.readouterr().err
    assert docs.main(["--write"]) == 0
    assert docs.main(["--check"]) == 0
    assert example.read_text(encoding="utf-8") == docs.example()
    assert reference.read_text(encoding="utf-8") == docs.reference()
