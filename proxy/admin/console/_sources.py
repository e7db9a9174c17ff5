"""Each source pointer of a state, as the session page shows it: its status and an excerpt,
what the admin API's ``?resolve=true`` shows, with the request path's authorization."""

from __future__ import annotations

from dataclasses import dataclass

import compactor
from proxy.sources.resolvers import ResolverPool

__all__ = ["SourceView", "source_views"]


@dataclass(frozen=True, slots=True)
class SourceView:
    """One pointer's status (``available``, ``missing``, ...), why, and an excerpt of it
    when available."""

    pointer: str
    status: str
    detail: str
    excerpt: str | None = None


async def source_views(resolvers: ResolverPool, session_id: str,
                       state: compactor.DurableContextState, tenant: str
                       ) -> dict[str, SourceView]:
    """Every distinct pointer of ``state`` resolved for ``tenant``'s ``session_id``."""
    excerpts = await resolvers.excerpts(session_id, state, tenant=tenant)
    return {e.resolution.pointer: SourceView(e.resolution.pointer, e.resolution.status,
                                             e.resolution.detail, e.text) for e in excerpts}
