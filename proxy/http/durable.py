"""A request's session and its durable context: the state the admin API pinned, every source
pointer verified, rendered for ``system`` (SPEC section 4, step 4). While the store is down,
``store.on_unavailable: forward`` goes on without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import msgspec
from cachetools import LRUCache

import compactor
from proxy.http.tenants import scoped_key
from proxy.store import StoreUnavailable

if TYPE_CHECKING:
    from proxy.http.services import Services

__all__ = ["DurableBlocks", "DurableContext", "SessionRef", "load_durable_context"]

#: Sessions whose last rendered block is kept (least recently used go first).
DEFAULT_MAX_BLOCKS: Final = 1024


class DurableContext(msgspec.Struct, frozen=True):
    """A session's durable state and its rendered block (``""``: none); ``store_available``
    false when the request goes on without the store (no state, no sticky reuse)."""

    state: compactor.DurableContextState | None
    text: str
    store_available: bool = True


class SessionRef(msgspec.Struct, frozen=True):
    """A request's session: the client's own id, its tenant, and its store key (made once)."""

    session_id: str
    tenant: str
    key: str = ""  # (always derived)

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "key", scoped_key(self.tenant, self.session_id))


class DurableBlocks:
    """The durable block last rendered for each of ``max_sessions`` recent sessions, rendered
    again only when the state object or a source's resolution changed (SPEC section 7)."""

    def __init__(self, max_sessions: int = DEFAULT_MAX_BLOCKS) -> None:
        self._last: LRUCache[str, tuple[compactor.DurableContextState,
                                        tuple[compactor.SourceResolution, ...], str]] = LRUCache(
            max(1, max_sessions))

    def text(self, session_key: str, state: compactor.DurableContextState,
             resolutions: tuple[compactor.SourceResolution, ...]) -> str:
        """:func:`compactor.render_durable_context` of ``state`` with ``resolutions``."""
        found = self._last.get(session_key)
        if found is not None and found[0] is state and found[1] == resolutions:
            return found[2]
        text = compactor.render_durable_context(state, source_resolutions=resolutions)
        self._last[session_key] = (state, resolutions, text)
        return text


async def load_durable_context(s: Services, session: SessionRef) -> DurableContext:
    """The session's state with every source pointer verified (against the client's own
    session id, in its tenant's roots), rendered for ``system``."""
    try:
        stored = await s.store.get_state(session.key)
    except StoreUnavailable as exc:
        if s.config.store.on_unavailable != "forward":
            raise
        s.store_health.note_unavailable("request", exc)
        return DurableContext(None, "", store_available=False)
    if stored is None or stored.state.is_empty:
        return DurableContext(None if stored is None else stored.state, "")
    resolutions = await s.resolvers.resolve(session.session_id, stored.state, tenant=session.tenant)
    return DurableContext(stored.state,
                          s.durable_blocks.text(session.key, stored.state, resolutions))
