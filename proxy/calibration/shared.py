"""The per-session calibration shared by every process serving from one store.

A session's part lives in its versioned record ``calibration:<model>``, written in the
background after every answer it learnt from (newest wins) and restored when the versions read
with the session's state (:meth:`~SharedCalibration.refresh`) name one this process does not
hold: each replica plans with what the session's last answer taught, wherever it was served.
The fleets' medians and learnt windows stay per process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Final

import structlog
from cachetools import LRUCache

from proxy.calibration.local import MAX_SESSIONS, WINDOW_TTL_S, Calibration
from proxy.store import RecordFetch, ReplicaConsistency, SessionVersions, StoreError

__all__ = ["CALIBRATION_RECORD_PREFIX", "SharedCalibration"]

_log = structlog.get_logger("proxy.calibration.shared")

#: Record kind in the store: ``calibration:<model>``.
CALIBRATION_RECORD_PREFIX: Final = "calibration:"
#: A session this process holds no calibration of: every one it has in the store.
_ALL_CALIBRATIONS: Final = RecordFetch(CALIBRATION_RECORD_PREFIX)


class SharedCalibration(Calibration):
    """Calibration whose per-session part is saved in, and refreshed from, ``store``. Used
    from the event loop (``observe`` schedules the write on the running loop)."""

    def __init__(self, store: ReplicaConsistency, *, max_sessions: int = MAX_SESSIONS,
                 window_ttl_s: float = WINDOW_TTL_S) -> None:
        super().__init__(max_sessions=max_sessions, window_ttl_s=window_ttl_s)
        self._store = store
        # session -> model -> the store's version of what this process holds.
        self._versions: LRUCache[str, dict[str, int]] = LRUCache(max_sessions)
        # (session, model) -> the newest snapshot not yet written; its writer task.
        self._unsaved: dict[tuple[str, str], bytes] = {}
        self._writers: dict[tuple[str, str], asyncio.Task[None]] = {}

    def observe(self, session_key: str, model: str, counted: int, provider: int,
                reserved: int = 0, fingerprints: Sequence[int] = (),
                tokens: Sequence[int] = ()) -> float | None:
        """Learn as :meth:`Calibration.observe`, then save the session's calibration."""
        ratio = super().observe(session_key, model, counted, provider, reserved,
                                fingerprints, tokens)
        if ratio is not None:
            data = self.snapshot(session_key, model)
            if data is not None:
                key = (session_key, model)
                self._unsaved[key] = data
                if key not in self._writers:
                    self._writers[key] = asyncio.get_running_loop().create_task(self._write(key))
        return ratio

    async def _write(self, key: tuple[str, str]) -> None:
        session_key, model = key
        try:
            while (data := self._unsaved.pop(key, None)) is not None:
                try:
                    version = await self._store.put_versioned_record(
                        session_key, CALIBRATION_RECORD_PREFIX + model, data)
                except StoreError as exc:
                    _log.warning("calibration_save_failed", error_class=type(exc).__name__)
                    continue
                self._versions.setdefault(session_key, {})[model] = version
        finally:
            del self._writers[key]

    def wanted(self, session_key: str) -> RecordFetch:
        """The session's calibration records to read with its versions: each one whose
        version is not the one this process holds (a
        :data:`~proxy.store.read_cache.RecordsWanted`)."""
        held = self._versions.get(session_key)
        if not held:
            return _ALL_CALIBRATIONS
        return RecordFetch(CALIBRATION_RECORD_PREFIX, {
            CALIBRATION_RECORD_PREFIX + model: version for model, version in held.items()
            if self.holds(session_key, model)})

    async def refresh(self, session_key: str, versions: SessionVersions) -> None:
        """Restore each of the session's calibrations whose store version is not the one held
        (a :data:`~proxy.store.read_cache.VersionsListener`)."""
        for kind, version in versions.records.items():
            if not kind.startswith(CALIBRATION_RECORD_PREFIX):
                continue
            model = kind[len(CALIBRATION_RECORD_PREFIX):]
            held = self._versions.get(session_key)
            if ((held is not None and held.get(model) == version
                 and self.holds(session_key, model))
                    or (session_key, model) in self._writers):
                # Held already, or this process's newer answer is being written.
                continue
            found = versions.fetched.get(kind)
            if found is None:  # (not read with the versions)
                try:
                    found = await self._store.get_versioned_record(session_key, kind)
                except StoreError as exc:
                    _log.warning("calibration_load_failed", error_class=type(exc).__name__)
                    continue
                if found is None:
                    continue
            stored_version, data = found
            if self.restore(session_key, model, data):
                self._versions.setdefault(session_key, {})[model] = stored_version

    async def saved(self, session_key: str) -> None:
        """Wait until every snapshot of ``session_key`` taken so far is written (or failed)."""
        while writers := [task for (key, _), task in self._writers.items()
                          if key == session_key]:
            await asyncio.gather(*writers, return_exceptions=True)

    async def flush(self) -> None:
        """Wait until every snapshot taken so far is written (or failed)."""
        while self._writers:
            await asyncio.gather(*self._writers.values(), return_exceptions=True)
