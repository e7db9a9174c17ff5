"""Moving a session between tenants (``compact-proxy move-session``): its durable state and
its sources; and the Redis store's durable states from the key layout before hash tags to the
one now (``compact-proxy migrate-redis-keys``). Operators: docs/operations.md, "Tenants".

Switching ``session.scope`` changes every session's store key (:func:`scoped_key`) and where
its sources resolve (:func:`proxy.sources.resolvers.tenant_root`). Sticky checkpoints and
cached summaries are not moved: they are rebuilt on the session's next request.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from compactor import session_id_problem
from proxy.http.tenants import is_tenant, scoped_key
from proxy.sources.resolvers import tenant_root
from proxy.sources.s3_roots import S3_SCHEME, is_s3_url
from proxy.store import StoreBackend, StoredState, StoreError, VersionConflict

if TYPE_CHECKING:
    from proxy.sources.s3_client import S3ObjectStore
    from proxy.sources.s3_moves import ObjectMove
    from proxy.store import RedisStateStore

__all__ = ["LayoutMigration", "MoveRefused", "SessionMoved", "migrate_redis_layout",
           "move_session", "move_session_and_sources"]


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
    """Move the durable state of ``session_id`` from one tenant to another; returns it as
    stored under the target (a new state there: versions are never reused). The source's is
    deleted only if it is still the version copied, else the copy is undone (MoveRefused)."""
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


@dataclass(frozen=True)
class SessionMoved:
    """What :func:`move_session_and_sources` did: the state under the target (``None``: it
    had none), and each file or object moved as ``(from, to)``."""

    state: StoredState | None
    sources: tuple[tuple[str, str], ...]


def _source_moves(roots: tuple[str, str], session_id: str, from_tenant: str, to_tenant: str
                  ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The session's files to rename (those that exist), and the ``s3://`` prefixes to move;
    MoveRefused when a target file or folder exists already."""
    files, remote = [], []
    for root, name in zip(roots, (f"{session_id}.jsonl", session_id), strict=True):
        source = os.path.join(tenant_root(root, from_tenant), name)
        target = os.path.join(tenant_root(root, to_tenant), name)
        if is_s3_url(root):  # (os.path.join of an s3:// URL is its key with "/")
            folder = "" if name.endswith(".jsonl") else "/"
            remote.append((source + folder, target + folder))
        elif os.path.lexists(source):
            if os.path.lexists(target):
                raise MoveRefused(f"session {session_id} already has sources under tenant "
                                  f"{to_tenant} ({target}); remove them first")
            files.append((source, target))
    return files, remote


def _rename_all(moves: list[tuple[str, str]]) -> None:
    """Rename each ``(source, target)``, creating the target's tenant directory; on a failure,
    the renames done are undone and :class:`MoveRefused` says which failed."""
    done: list[tuple[str, str]] = []
    try:
        for source, target in moves:
            os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
            os.rename(source, target)
            done.append((source, target))
    except OSError as exc:
        for source, target in reversed(done):
            os.rename(target, source)
        raise MoveRefused(f"cannot move {source} to {target}: {exc.strerror or exc}; "
                          "nothing moved") from None


async def move_session_and_sources(store: StoreBackend, roots: tuple[str, str],
                                   session_id: str, from_tenant: str, to_tenant: str, *,
                                   objects: S3ObjectStore | None = None) -> SessionMoved:
    """Move ``session_id``'s durable state (:func:`move_session`; none is refused only when
    it has no source either) and its sources under ``roots`` (local: renamed; ``s3://``:
    copied then deleted through ``objects``) to the target tenant. Nothing moves when anything
    is refused (MoveRefused)."""
    _check(session_id, from_tenant, to_tenant)
    files, remote = _source_moves(roots, session_id, from_tenant, to_tenant)
    planned: list[ObjectMove] = []
    if remote:
        from proxy.sources.s3_moves import move_objects, plan_object_moves

        if objects is None:
            raise MoveRefused("s3:// roots: no object store to move the session's objects")
        planned = await plan_object_moves(objects, remote)
    state = None
    if (not files and not planned
            or await store.get_state(scoped_key(from_tenant, session_id)) is not None):
        state = await move_session(store, session_id, from_tenant, to_tenant)
    try:
        _rename_all(files)
        try:
            if planned:
                assert objects is not None
                await move_objects(objects, planned)
        except MoveRefused:
            _rename_all([(target, source) for source, target in reversed(files)])
            raise
    except MoveRefused:
        if state is not None:
            await move_session(store, session_id, to_tenant, from_tenant)
        raise
    moved = [*files, *((f"{S3_SCHEME}{bucket}/{source}", f"{S3_SCHEME}{bucket}/{target}")
                       for bucket, source, target in planned)]
    return SessionMoved(state, tuple(moved))


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
    """What :func:`migrate_redis_layout` did: states ``moved``, and the session keys ``kept``
    where they were because the new key holds a state already (delete one of the two)."""

    moved: int
    kept: tuple[str, ...]


async def migrate_redis_layout(store: RedisStateStore) -> LayoutMigration:
    """Move every durable state of the layout before hash tags (``<prefix>state:<key>``) to
    ``<prefix>{<key>}:state`` with its version and write time; idempotent, and never over a
    state written since. Caches and reports of the old layout are left (``<prefix>summary:*``,
    ``record:*``, ``usage:*``, ``audit:*``). StoreError on a cluster (it never held it)."""
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
