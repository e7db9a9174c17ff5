"""Moving a session's durable state between tenants (``compact-proxy move-session``).

Switching ``session.scope`` changes every session's store key (:func:`scoped_key`): a session
kept as ``sess-1`` under scope ``none`` is ``t…/sess-1`` under ``credential``. This moves the
durable state from one key to the other. Only the durable state moves: the sticky-compaction
checkpoints are a cache whose record kinds the store cannot list, and they are rebuilt on the
session's next request (one compaction from scratch); the summary cache is per tenant too and
refills the same way. Run it while the proxy is stopped (the scope change needs a restart
anyway), so no request writes the session meanwhile.
"""

from __future__ import annotations

from compactor import session_id_problem
from proxy.http.tenants import is_tenant, scoped_key
from proxy.state.store import StoreBackend, StoredState, VersionConflict

__all__ = ["MoveRefused", "move_session"]


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

    The target gets the state as version 1; the source's is deleted only if it is still
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
