"""The Redis store's replica consistency (:class:`~proxy.store.base.ReplicaConsistency`).

A session's versioned records are fields of its record hash; their versions, fields of the
same name in the hash ``record_versions_key`` (in the session's slot); each script touches one
session's keys, or one lease's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from .._rows import lease_ms
from ..base import CorruptStateError, RecordFetch, SessionVersions
from . import scripts
from .connection import RedisConnection
from .keys import as_bytes, as_text

__all__ = ["RedisConsistency"]


class RedisConsistency(RedisConnection):
    """:class:`~proxy.store.base.ReplicaConsistency` on Redis."""

    @property
    def shared(self) -> bool:
        return True  # any number of processes may use the same server

    def record_versions_key(self, session_id: str) -> str:
        """The Redis key of the hash of the session's record versions (``kind -> n``)."""
        return f"{self.record_key(session_id)}-versions"

    async def _replica_script(self, text: str, keys: Sequence[str],
                              args: Sequence[Any]) -> Any:
        """Run the script ``text`` on ``keys`` with ``args``: EVALSHA on the lane where there
        is one (bench/README.md, "The stores' twins"); a server that does not hold the script
        (NOSCRIPT) gets it through redis-py's script object, which loads it."""
        script = self._script(text)
        try:
            if self._lane is not None:
                return await self._lane.call("EVALSHA", script.sha, len(keys), *keys, *args)
            return await self._redis.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await script(keys=list(keys), args=list(args))

    async def session_versions(self, session_id: str,
                               fetch: RecordFetch | None = None) -> SessionVersions:
        """One round trip: a pipeline; with ``fetch``, one script, so the records are those
        of the versions read."""
        fetched: dict[str, tuple[int, bytes]] = {}
        with self._failures("read versions"):
            if fetch is None:
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.hmget(self.state_key(session_id), ["version", "updated_at"])
                    pipe.hgetall(self.record_versions_key(session_id))
                    (version, updated_at), records = await pipe.execute()
            else:
                held = [item for kind, number in fetch.held.items() for item in (kind, number)]
                (version, updated_at), flat, found = await self._replica_script(
                    scripts.VERSIONS_AND_RECORDS,
                    (self.state_key(session_id), self.record_versions_key(session_id),
                     self.record_key(session_id)), (fetch.prefix, *held))
                records = dict(zip(flat[::2], flat[1::2], strict=True))
        try:
            versions = {as_text(kind): int(number) for kind, number in records.items()}
        except ValueError:
            raise CorruptStateError(session_id, "a version is not an integer") from None
        if fetch is not None:
            for kind, data in zip(found[::2], found[1::2], strict=True):
                name = as_text(kind)
                if isinstance(data, bytes) and name in versions:
                    fetched[name] = (versions[name], data)
        return SessionVersions(None if version is None else int(version),
                               None if updated_at is None else as_text(updated_at),
                               versions, fetched)

    async def get_versioned_record(self, session_id: str, kind: str
                                   ) -> tuple[int, bytes] | None:
        with self._failures("read record"):
            version, data = await self._replica_script(
                scripts.GET_VERSIONED,
                (self.record_key(session_id), self.record_versions_key(session_id)), (kind,))
        if version is None or data is None:
            return None
        return int(version), bytes(as_bytes(data) or b"")

    async def put_versioned_record(self, session_id: str, kind: str, data: bytes) -> int:
        with self._failures("write record"):
            version = await self._replica_script(
                scripts.PUT_VERSIONED,
                (self.record_key(session_id), self.record_versions_key(session_id)),
                (kind, bytes(data)))
        return int(version)

    async def acquire_lock(self, name: str, token: str, ttl_ms: int) -> bool:
        """``SET lock token NX PX ttl``."""
        with self._failures("take lock"):
            return bool(await self._redis.set(self.lock_key(name), token, nx=True,
                                              px=lease_ms(ttl_ms)))

    async def extend_lock(self, name: str, token: str, ttl_ms: int) -> bool:
        """``PEXPIRE`` the lease if it still holds ``token`` (one script)."""
        with self._failures("extend lock"):
            return bool(await self._replica_script(scripts.EXTEND_LOCK, (self.lock_key(name),),
                                                   (token, lease_ms(ttl_ms))))

    async def release_lock(self, name: str, token: str) -> bool:
        """Delete the lease if it still holds ``token`` (compare-and-delete, one script)."""
        with self._failures("release lock"):
            return bool(await self._replica_script(scripts.RELEASE_LOCK, (self.lock_key(name),),
                                                   (token,)))
