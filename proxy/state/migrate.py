"""Moving a session's durable state between tenants (``compact-proxy move-session``), and the
Redis store's durable states from the key layout before hash tags to the one now
(``compact-proxy migrate-redis-keys``).

Switching ``session.scope`` changes every session's store key (:func:`scoped_key`): a session
kept as ``sess-1`` under scope ``none`` is ``t…/sess-1`` under ``credential``. This moves the
durable state from one key to the other. Only the durable state moves: the sticky-compaction
checkpoints are a cache whose record kinds the store cannot list, and they are rebuilt on the
session's next request (one compaction from scratch); the summary cache is per tenant too and
refills the same way. Run it while the proxy is stopped (the scope change needs a restart
anyway), so no request writes the session meanwhile.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from compactor import session_id_problem
from proxy.http.tenants import is_tenant, scoped_key
from proxy.state.store import StoreBackend, StoredState, StoreError, VersionConflict

if TYPE_CHECKING:
    from proxy.state.store import RedisStateStore

__all__ = ["LayoutMigration", "MoveRefused", "migrate_redis_layout", "move_session"]


class MoveRefused(Exception):
    """The move was not done, and nothing was changed; the message says why (one line)."""


def _check(session_id: str, from_tenant: str, to_tenant: str) -> None:
    problem = session_id_problem(session_id)
    if problem is not None:
        raise MoveRefused(f"--session: {problem}")
    # The values are not repeated: a credential may have been pasted instead of its tenant.
    for flag, tenant in (("--from-tenant", from_tenant), ("--to-tenant", to_tenant)):
        if not is_tenant(tenant):
            raise MoveRefused(f"{flag}: not a tenant; a tenant is none, t<16 hex> or h<16 hex> "
                              "(compact-proxy tenant-id prints one)")
    if from_tenant == to_tenant:
        raise MoveRefused("--from-tenant and --to-tenant are the same tenant")


async def move_session(store: StoreBackend, session_id: str, from_tenant: str,
                       to_tenant: str) -> StoredState:
    """Move the durable state of ``session_id`` from one tenant to another.

    The target gets the state as a new state (version 1, or the one after a state deleted
    there before: versions are never reused); the source's is deleted only if it is still
    the version copied (otherwise the copy is undone).

    Returns:
        the state as now stored under the target.

    Raises:
        MoveRefused: a bad session id or tenant, the same tenant twice, no state at the
            source, state already at the target, or the source changed during the move.
        StoreError: the store failed.
    """
    _check(session_id, from_tenant, to_tenant)
    source_key, target_key = scoped_key(from_tenant, session_id), scoped_key(to_tenant, session_id)
    source = await store.get_state(source_key)
    if source is None:
        raise MoveRefused(f"session {session_id} has no durable state under tenant {from_tenant}")
    try:
        moved = await store.put_state(target_key, source.state, None)
    except VersionConflict as exc:
        raise MoveRefused(
            f"session {session_id} already has state under tenant {to_tenant} "
            f"(version {exc.current_version}); delete it first "
            f"(DELETE /admin/tenants/{to_tenant}/sessions/{session_id}/state)") from None
    try:
        await store.delete_state(source_key, source.version)
    except VersionConflict:
        await store.delete_state(target_key, moved.version)
        raise MoveRefused(f"session {session_id} changed under tenant {from_tenant} during "
                          "the move; nothing moved (stop the proxy and retry)") from None
    return moved


# KEYS = the old state hash, the new one. Copies the old hash to the new key unless that
# exists, then deletes the old one. Returns 1 when moved, 0 when the new key was taken.
# Both keys are named by the caller, but only on a single server (where the old layout
# lived; a cluster never held it) may one script touch both.
_MOVE_STATE_LUA = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local fields = redis.call('HGETALL', KEYS[1])
if #fields == 0 then return 0 end
redis.call('HSET', KEYS[2], unpack(fields))
redis.call('DEL', KEYS[1])
return 1
"""


@dataclass(frozen=True)
class LayoutMigration:
    """What :func:`migrate_redis_layout` did.

    Attributes:
        moved: durable states now under their hash-tagged key.
        kept: session keys whose old state was left where it is, because a state exists
            under the new key already (written since the upgrade: delete one of the two).
    """

    moved: int
    kept: tuple[str, ...]


async def migrate_redis_layout(store: RedisStateStore) -> LayoutMigration:
    """Move every durable state of the Redis layout before hash tags
    (``<prefix>state:<session key>``) to its key now (``<prefix>{<session key>}:state``),
    keeping its version (so clients' ``If-Match`` still holds) and its write time.

    Idempotent; safe while the proxy runs (a state written under the new key since the
    upgrade is never overwritten). Only the durable states move: the old layout's summaries,
    records, usage rows and audit log are caches and reports; they are left for Redis to
    hold until deleted (``<prefix>summary:*``, ``<prefix>record:*``, ``<prefix>usage:*``,
    ``<prefix>audit:*``).

    Raises:
        StoreError: the store failed, or runs on a cluster (which never held the old layout).
    """
    if store.mode == "cluster":
        raise StoreError("a Redis Cluster never held the old key layout: nothing to migrate")
    from redis.exceptions import RedisError

    old_prefix = f"{store.key_prefix}state:"
    client = store.client
    moved, kept = 0, []
    try:
        script = client.register_script(_MOVE_STATE_LUA)
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", old_prefix) + "*"  # glob-escaped
        async for raw in client.scan_iter(match=pattern, count=1000):
            key = raw.decode("utf-8", errors="surrogateescape")
            session_key = key[len(old_prefix):]
            if await script(keys=[key, store.state_key(session_key)]):
                moved += 1
            else:
                kept.append(session_key)
    except RedisError as exc:
        raise StoreError(f"redis store {store.url}: cannot migrate the key layout: {exc}"
                         ) from None
    return LayoutMigration(moved, tuple(sorted(kept)))
