"""Pydantic's validation errors as one-line :class:`ConfigError` s: the dotted key, the problem.

The first error wins, an unknown key before any other (it explains the rest). Its location is
walked down the section types for the known keys of its section (a suggestion) and the limits
of its type (a range in words); the rest comes from pydantic's error data.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
from collections.abc import Mapping
from typing import Annotated, Any, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt
from pydantic import ValidationError
from pydantic_core import ErrorDetails


class ConfigError(Exception):
    """A configuration problem: the dotted ``key`` (``policies.rules[0].role``; empty for the
    file as a whole), the ``problem`` in a few words, the YAML ``line`` when known. ``str()``
    is one line, even for PyYAML's or the OS's messages: ``config error: <key>: <problem>``."""

    def __init__(self, key: str, problem: str, *, line: int | None = None) -> None:
        super().__init__(key, problem)
        self.key = key
        self.problem = " ".join(problem.split())
        self.line = line

    def __str__(self) -> str:
        where = f"{self.key}: " if self.key else ""
        return f"config error: {where}{self.problem}"


def shown(value: object) -> str:
    """How a bad value appears in an error: YAML spelling plus its type, never a long text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{'true' if value else 'false'} (a boolean)"
    if isinstance(value, (int, float)):
        return f"{value!r} (a number)"
    if isinstance(value, str):
        text = value if len(value) <= 60 else value[:57] + "..."
        return f"{text!r} (a string)"
    if isinstance(value, (list, tuple)):
        return "a list"
    return "a mapping" if isinstance(value, Mapping) else f"a {type(value).__name__}"


_UNKNOWN_KEY = frozenset({"unexpected_keyword_argument", "extra_forbidden", "invalid_key"})
_WANTED = {
    "int_type": "an integer", "float_type": "a number", "bool_type": "true or false",
    "string_type": "a string", "dataclass_type": "a mapping", "dataclass_args_type": "a mapping",
    "dict_type": "a mapping", "tuple_type": "a list", "list_type": "a list",
}
_BOUNDS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})


def config_error(exc: ValidationError, root: type[Any], prefix: str) -> ConfigError:
    """The ConfigError for pydantic's first error in validating ``root`` at ``prefix``."""
    errors = exc.errors(include_url=False)
    error = next((e for e in errors if e["type"] in _UNKNOWN_KEY), errors[0])
    if error["type"] == "soft_not_below_hard":
        ctx, loc = error["ctx"], tuple(error["loc"])
        soft, hard = (dotted(prefix, (*loc, ctx[name])) for name in ("soft_field", "hard_field"))
        return soft_not_below_hard(ctx, soft, hard, blame_soft=True)
    loc, problem = _problem(error, root)
    return ConfigError(dotted(prefix, loc), problem)


def soft_not_below_hard(ctx: Mapping[str, Any], soft_key: str, hard_key: str,
                        blame_soft: bool) -> ConfigError:
    """The error for soft >= hard, blaming the soft threshold or the hard limit."""
    soft, hard = ctx["soft"], ctx["hard"]
    if blame_soft:
        return ConfigError(soft_key, f"must be below {hard_key} ({soft} >= {hard})")
    return ConfigError(hard_key, f"must be above {soft_key} ({hard} <= {soft})")


def dotted(prefix: str, loc: tuple[str | int, ...]) -> str:
    """``policies`` + ``("rules", 0, "role")`` -> ``policies.rules[0].role``."""
    key = prefix
    for part in loc:
        key = f"{key}[{part}]" if isinstance(part, int) else f"{key}.{part}" if key else part
    return key


def _problem(error: ErrorDetails, root: type[Any]) -> tuple[tuple[str | int, ...], str]:
    """The location the error belongs to and its problem in words."""
    loc, kind, value = tuple(error["loc"]), error["type"], error["input"]
    ctx: Mapping[str, Any] = error.get("ctx") or {}
    if loc and loc[-1] == "[key]":  # a mapping's key: a role name, or a price's family
        if kind == "literal_error":
            return (*loc[:-2], str(loc[-2])), _unknown(
                str(loc[-2]), _choices(ctx), "role", "roles are")
        return loc[:-2], f"keys must be non-empty strings, got {shown(loc[-2])}"
    if kind in _UNKNOWN_KEY:
        name = str(loc[-1])
        owner, _ = _at(root, loc[:-1])
        misplaced = getattr(owner, "MISPLACED", {}).get(name)
        known = tuple(spec.name for spec in dataclasses.fields(owner) if spec.init
                      ) if dataclasses.is_dataclass(owner) else ()
        return (*loc[:-1], name), misplaced or _unknown(name, known, "key", "known keys:")
    annotation, meta = _at(root, loc)
    item = ""
    if loc and isinstance(loc[-1], int) and not dataclasses.is_dataclass(annotation):
        item, loc = f"item {loc[-1]} ", loc[:-1]  # an element of a list of values
    if kind in _WANTED:
        wanted = _WANTED[kind]
        items = get_args(annotation)[:1]
        if wanted == "a list" and items and dataclasses.is_dataclass(bare(items[0])[0]):
            wanted = f"a list of {str(loc[-1]).replace('_', ' ')}"  # a list of rules
        problem = f"must be {wanted}, got {shown(value)}"
    elif kind == "missing":
        problem = "required"
    elif kind == "literal_error":
        problem = f"must be one of {', '.join(_choices(ctx))}, got {shown(value)}"
    elif kind in _BOUNDS:
        problem = f"must be {range_words(meta)}, got {value}"
    elif kind == "invalid":  # policies.invalid: the message starts with the field's name
        name = ctx["field"]
        if name and name not in loc:  # a check of a whole section, about one of its keys
            loc = (*loc, name)
        problem = ctx["message"].removeprefix(f"{name} ")
    else:
        problem = error["msg"]
    return loc, item + problem


def _choices(ctx: Mapping[str, Any]) -> tuple[str, ...]:
    """A literal's choices from pydantic's ``'a', 'b' or 'c'``."""
    return tuple(re.findall(r"'([^']*)'", str(ctx.get("expected", ""))))


def _unknown(name: str, known: tuple[str, ...], what: str, listed: str) -> str:
    """``unknown key (did you mean 'x'?)``: the known name it begins, else difflib's guess,
    else the ``listed`` known names."""
    prefixed = [key for key in known if name and key.startswith(name)]
    close = prefixed if len(prefixed) == 1 else difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"{listed} {', '.join(known)}"
    return f"unknown {what} ({hint})"


def range_words(meta: list[Any]) -> str:
    """The limits in ``meta`` in words: ``at least 1``, ``between 0 and 65535``."""
    low = next((m for m in meta if isinstance(m, (Ge, Gt))), None)
    high = next((m for m in meta if isinstance(m, (Le, Lt))), None)
    if isinstance(low, Ge) and isinstance(high, Le):
        return f"between {low.ge} and {high.le}"
    words = [
        f"at least {low.ge}" if isinstance(low, Ge) else f"above {low.gt}" if low else "",
        f"at most {high.le}" if isinstance(high, Le) else f"below {high.lt}" if high else "",
    ]
    return " and ".join(word for word in words if word)


def _at(root: type[Any], loc: tuple[str | int, ...]) -> tuple[Any, list[Any]]:
    """The type at ``loc`` below ``root``, without its wrappers, and the limits they carried."""
    annotation: Any = root
    for part in loc:
        annotation, _ = bare(annotation)
        fields = getattr(annotation, "__pydantic_fields__", {})
        if part in fields:
            annotation = fields[part].rebuild_annotation()
        elif get_origin(annotation) in (tuple, dict, Mapping):  # an item's or a value's type
            annotation = [arg for arg in get_args(annotation) if arg is not Ellipsis][-1]
        else:
            return None, []
    return bare(annotation)


def bare(annotation: Any) -> tuple[Any, list[Any]]:
    """``annotation`` without ``Optional`` and ``Annotated``, and the metadata they carried."""
    meta: list[Any] = []
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            meta.extend(annotation.__metadata__)
            annotation = annotation.__origin__
        elif origin in (Union, types.UnionType) and len(
                args := [arg for arg in get_args(annotation) if arg is not type(None)]) == 1:
            annotation = args[0]
        else:
            return annotation, meta
