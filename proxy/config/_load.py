"""Reading the file: strict YAML (no duplicate keys), then :meth:`Config.from_mapping`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import yaml

from proxy.config._errors import ConfigError
from proxy.config._root import Config

#: The environment variable naming the config file when no path is given.
CONFIG_ENV_VAR = "COMPACT_PROXY_CONFIG"


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate keys in a mapping (PyYAML keeps the last silently)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key; construct_mapping reports it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_config(
    path: str | os.PathLike[str] | None,
    *,
    require_upstream: bool = True,
    environ: Mapping[str, str] = os.environ,
) -> Config:
    """Read and validate the YAML file at ``path``, else at ``environ[COMPACT_PROXY_CONFIG]``;
    ``require_upstream=False`` allows no ``upstream.base_url`` (the demo). Raises
    :class:`ConfigError` for no path, an unreadable file, bad YAML (with its line), a bad value."""
    if path is None:
        path = environ.get(CONFIG_ENV_VAR) or None
    if path is None or not os.fspath(path):
        raise ConfigError("", f"no config file given: pass --config PATH or set {CONFIG_ENV_VAR}")
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ConfigError("", f"cannot read {name}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError("", f"cannot read {name}: not UTF-8 text") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = None if mark is None else mark.line + 1
        where = f"{name} line {line}" if line is not None else name
        raise ConfigError(
            "", f"{where}: invalid YAML: {exc.problem or exc.context or exc}", line=line
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError("", f"{name}: invalid YAML: {exc}") from None
    return Config.from_mapping(data, require_upstream=require_upstream)
