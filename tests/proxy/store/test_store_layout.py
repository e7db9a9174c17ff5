"""The stores' layout as shipped: the Redis scripts are package data a wheel carries, and
each is loaded by :mod:`proxy.store.redis.scripts`."""

from __future__ import annotations

import tomllib
from pathlib import Path

import proxy
from proxy.store.redis import scripts

ROOT = Path(__file__).resolve().parents[3]
LUA = Path(scripts.__file__).parent / "lua"


def test_every_lua_script_is_package_data() -> None:
    """pyproject's package data for ``proxy`` names every ``.lua`` file of the Redis store
    (a non-editable install has only what it names)."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["proxy"]
    package = Path(proxy.__file__).parent
    shipped = {path for pattern in patterns for path in package.glob(pattern)}
    files = set(LUA.glob("*.lua"))
    assert files and files <= shipped


def test_every_lua_script_is_loaded() -> None:
    """Each ``.lua`` file is part of a script the store runs (none is left over)."""
    texts = [value for name, value in vars(scripts).items()
             if name.isupper() and isinstance(value, str)]
    for path in LUA.glob("*.lua"):
        body = path.read_text(encoding="utf-8")
        assert any(body in text for text in texts), path.name
