"""What the sections are built from: value types with their checks, descriptions, the decorator.

A value type carries its limits (``Ge(1)``) or a check raising :func:`policies._compaction.invalid`
with the words pydantic has none for; :class:`Kind` names a checked type for the reference.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar, dataclass_transform
from urllib.parse import urlsplit

from annotated_types import Ge, Le
from pydantic import (
    AfterValidator,
    Field,
    PlainValidator,
    Strict,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic.dataclasses import dataclass as pydantic_dataclass

from policies._compaction import STRICT, Text, invalid
from policies._roles import HEADER_NAME
from policies._session_ids import SESSION_ID_RULE, session_id_problem
from proxy.config._errors import config_error, shown
from proxy.telemetry.masking import mask_url


@dataclass(frozen=True)
class Kind:
    """How the reference names a type that a function checks (``seconds > 0``)."""

    name: str


def doc(default: Any, description: str, example: object = None) -> Any:
    """A key's default (``...``: required) and description, the one text the reference and
    ``config.example.yaml`` show, with an example value the latter shows commented out."""
    return Field(default, description=description, examples=None if example is None else [example])


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

Bool = Annotated[bool, Strict()]
Positive = Annotated[int, Strict(), Ge(1)]
NonNegative = Annotated[int, Strict(), Ge(0)]
Port = Annotated[int, Strict(), Ge(0), Le(65535)]


def _seconds(value: object, info: ValidationInfo) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(info.field_name, f"must be a number of seconds, got {shown(value)}")
    if not math.isfinite(value) or value <= 0:
        raise invalid(info.field_name, f"must be a positive number of seconds, got {value}")
    return float(value)


def _env_name(value: str, info: ValidationInfo) -> str:
    if _ENV_NAME.fullmatch(value) is None:
        raise invalid(info.field_name, f"must be an environment variable name, got {value!r}")
    return value


def _url(*schemes: str) -> Callable[[str, ValidationInfo], str]:
    def check(value: str, info: ValidationInfo) -> str:
        try:
            parts = urlsplit(value)
        except ValueError as exc:  # (the URL is shown without its password)
            raise invalid(info.field_name,
                          f"is not a valid URL ({exc}): {mask_url(value)!r}") from None
        if parts.scheme not in schemes or not (parts.netloc or parts.scheme == "unix"):
            wanted = " or ".join(f"{scheme}://" for scheme in schemes)
            raise invalid(info.field_name, f"must be a {wanted} URL, got {mask_url(value)!r}")
        return value

    return check


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _session_id(value: str, info: ValidationInfo) -> str:
    # The one rule for session ids (the same as compactor.check_session_id's).
    problem = session_id_problem(value)
    if problem is not None:
        raise invalid(info.field_name, f"is not a valid session id ({problem}; a session id "
                                       f"is {SESSION_ID_RULE}): {value!r}")
    return value


def _scope(value: str, info: ValidationInfo) -> str:
    if value in ("none", "credential"):
        return value
    kind, _, name = value.partition(":")
    if kind == "header" and HEADER_NAME.fullmatch(name):
        return f"header:{name.lower()}"
    raise invalid(info.field_name, f"must be credential, header:<name> or none, got {value!r}")


Seconds = Annotated[float, PlainValidator(_seconds), Kind("seconds, a positive number")]
EnvName = Annotated[Text, AfterValidator(_env_name), Kind("environment variable name")]
HttpUrl = Annotated[Text, AfterValidator(_url("http", "https")), Kind("http(s):// URL")]
RedisUrl = Annotated[Text, AfterValidator(_url("redis", "rediss", "unix")),
                     Kind("redis://, rediss:// or unix:// URL")]
SessionId = Annotated[Text, AfterValidator(_session_id), Kind("session id")]
#: Whose sessions are separate (``session.scope``).
Scope = Annotated[Text, AfterValidator(_scope), Kind("credential, header:<name> or none")]

_C = TypeVar("_C")


@dataclass_transform(frozen_default=True, field_specifiers=(field, Field))
def section(key: str) -> Callable[[type[_C]], type[_C]]:
    """Make ``cls`` a frozen pydantic dataclass at dotted position ``key`` that raises
    :class:`ConfigError` when built in Python too (``ListenConfig(port=1)``,
    ``dataclasses.replace``); nested sections are validated by their parent's validator."""

    def decorate(cls: type[_C]) -> type[_C]:
        model: Any = pydantic_dataclass(cls, frozen=True, config=STRICT)
        validate = model.__init__

        @functools.wraps(validate)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                validate(self, *args, **kwargs)
            except ValidationError as exc:
                raise config_error(exc, model, key) from None

        model.__init__ = __init__
        return model  # type: ignore[no-any-return]

    return decorate


class Section:
    """Base of the sections: a section given as null (``listen:`` alone) has its defaults."""

    @model_validator(mode="before")
    @classmethod
    def _null_is_empty(cls, data: Any) -> Any:
        return {} if data is None else data
