"""The Redis store's Lua scripts, read from ``lua/*.lua`` beside this module on import (they
are package data: a wheel carries them). Each file's header says its keys, arguments and
reply; a script made of two files is the two texts joined (shared functions first)."""

from __future__ import annotations

from importlib.resources import files
from typing import Final


def _lua(name: str) -> str:
    return (files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


_TRIM_FUNCTIONS: Final = _lua("trim_functions")
_STATE_CHANGE: Final = _lua("state_change")

PUT_STATE: Final = _STATE_CHANGE + _lua("put_state")
DELETE_STATE: Final = _STATE_CHANGE + _lua("delete_state")
PUT_SUMMARY: Final = _lua("put_summary")
ADD_USAGE: Final = _lua("add_usage")
TRIM_SESSION: Final = _TRIM_FUNCTIONS + "return trim()\n"
ADD_REQUESTS: Final = _TRIM_FUNCTIONS + _lua("add_requests")
ADD_CHANGE: Final = _lua("add_change")
TRIM_CHANGES: Final = _lua("trim_changes")
VERSIONS_AND_RECORDS: Final = _lua("versions_and_records")
GET_VERSIONED: Final = _lua("get_versioned")
PUT_VERSIONED: Final = _lua("put_versioned")
EXTEND_LOCK: Final = _lua("extend_lock")
RELEASE_LOCK: Final = _lua("release_lock")
