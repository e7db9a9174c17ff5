"""The Redis store's durable-state writes: each one Lua script with the change it records.

A deleted state leaves ``...:tombstone`` (docs/operations.md, "Redis keys"). Redis does not roll
a script back when a command in it fails, so each script checks every key's type before its
first write. A ``put``'s version is decided in the script: its change is sent as the JSON text
before and after the version's value, which the script joins around it.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import structlog

from compactor import DurableContextState
from proxy.audit.log import StateChange

from .._rows import (
    check_change,
    check_type,
    decode_state,
    encode_audit,
    encode_state,
    utc_now,
)
from ..base import CorruptStateError, StoredState, VersionConflict
from . import scripts
from .client import FAILURES
from .connection import RedisConnection
from .keys import as_bytes, as_score, as_text

__all__ = ["RedisState", "change_args", "put_change_args"]


class RedisState(RedisConnection):
    """:class:`~proxy.store.base.StateStore` on Redis."""

    async def get_state(self, session_id: str) -> StoredState | None:
        with self._failures("read state", partial(self._state_error, session_id)):
            values = await self._redis.hmget(self.state_key(session_id),
                                             ["version", "state", "updated_at"])
        version, state_json, updated_at = (as_bytes(value) for value in values)
        if version is None and state_json is None and updated_at is None:
            return None
        if version is None:
            raise CorruptStateError(session_id, "field 'version' is missing")
        if state_json is None:
            raise CorruptStateError(session_id, "field 'state' is missing")
        if updated_at is None:
            raise CorruptStateError(session_id, "field 'updated_at' is missing")
        try:
            number = int(version)
        except ValueError:
            number = 0
        if number < 1:
            raise CorruptStateError(session_id, "version is not an integer >= 1")
        try:
            stamp = updated_at.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptStateError(session_id, "updated_at is not UTF-8") from None
        return decode_state(session_id, number, state_json, stamp)

    async def put_state(self, session_id: str, state: DurableContextState,
                        expected_version: int | None,
                        change: StateChange | None = None) -> StoredState:
        check_type("state", state, DurableContextState)
        check_change(session_id, change, "put")
        with self._failures("write state", partial(self._state_error, session_id)):
            state_json = encode_state(state)
            when = utc_now()
            expected = "" if expected_version is None else str(int(expected_version))
            outcome, version, *newest = await self._script(scripts.PUT_STATE)(
                keys=self._state_keys(session_id),
                args=[expected, state_json, when.isoformat(),
                      *put_change_args(change, *self._bounds())])
        self._check_outcome(session_id, outcome)
        if outcome == 0:
            raise VersionConflict(session_id, expected_version, None if version < 0 else version)
        await self._index_change(session_id, change, newest)
        return StoredState(session_id=session_id, version=int(version), state=state,
                           updated_at=when)

    async def delete_state(self, session_id: str, expected_version: int | None = None,
                           change: StateChange | None = None) -> bool:
        check_change(session_id, change, "delete")
        with self._failures("delete state", partial(self._state_error, session_id)):
            expected = "" if expected_version is None else str(int(expected_version))
            outcome, current, *newest = await self._script(scripts.DELETE_STATE)(
                keys=self._state_keys(session_id),
                args=[expected, *change_args(change, *self._bounds())])
        self._check_outcome(session_id, outcome)
        if outcome == 2:
            raise VersionConflict(session_id, expected_version, int(current))
        if outcome == 1:
            await self._index_change(session_id, change, newest)
        return bool(outcome == 1)

    def _state_keys(self, session_id: str) -> list[str]:
        """The keys a state write touches: the state, its tombstone, its changes (one slot)."""
        return [self.state_key(session_id), self._key(session_id, "tombstone"),
                self._key(session_id, "audit:changes")]

    @staticmethod
    def _check_outcome(session_id: str, outcome: int) -> None:
        if outcome == -1:
            raise CorruptStateError(session_id, "stored version is not an integer >= 1")
        if outcome == -2:
            raise CorruptStateError("<audit log>", "cannot record the state change: a key "
                                    "does not hold what the audit log keeps there")

    async def _index_change(self, session_id: str, change: StateChange | None,
                            newest: list[Any]) -> None:
        """List the session in the index of changed sessions after a write recorded ``change``
        (a failure is logged: the next change or ``trim`` lists it again)."""
        if change is None or not newest or not newest[0]:
            return
        try:
            await self._index_changed(change.tenant, change.session_id, as_text(newest[0]))
        except FAILURES as exc:
            structlog.get_logger().warning("state_change_not_indexed",
                                           error_class=type(exc).__name__)


def change_args(change: StateChange | None, max_changes: int, cutoff: str) -> list[Any]:
    """A change's script arguments (a delete's, or one on its own): its JSON, its score, the
    bound and the cutoff (all empty without a change)."""
    if change is None:
        return ["", "", "", ""]
    return [encode_audit(change), as_score(change.at), max_changes, cutoff]


def put_change_args(change: StateChange | None, max_changes: int, cutoff: str) -> list[Any]:
    """A put's change arguments: the change's JSON cut where the version written goes (only
    the field itself matches: inside a JSON string every ``"`` is escaped), then as
    :func:`change_args`."""
    if change is None:
        return ["", "", "", "", ""]
    text = encode_audit(dataclasses.replace(change, version=None))
    head, found, tail = text.partition('"version":null')
    if not found:  # (as_json always writes the field; kept as a loud failure)
        raise ValueError("a state change's JSON has no version field")
    return [head + '"version":', tail, as_score(change.at), max_changes, cutoff]
