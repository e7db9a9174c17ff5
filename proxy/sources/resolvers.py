"""Source-pointer resolvers kept across requests, one per recent session (a resolver's
authorizer is bound to one session; what it verified is not re-hashed while unchanged).

Each tenant resolves in its own directory of each root (:func:`tenant_root`; docs/admin.md).
Local roots get :class:`compactor.SourcePointerResolver` (in a worker thread), ``s3://`` roots
:class:`proxy.sources.s3_sources.S3SourceResolver` (on the loop); each pointer goes to its
root's kind. Excerpts serve the operator only, never a prompt.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Final, TypeVar

from cachetools import LRUCache, cached

import compactor
from policies import SourceAccessPolicy
from proxy.sources.s3_roots import S3Settings, is_s3_url, parse_s3_root

if TYPE_CHECKING:
    from proxy.sources.s3_client import S3ObjectStore
    from proxy.sources.s3_sources import S3SourceResolver

__all__ = ["DEFAULT_MAX_SESSIONS", "EXCERPT_CHARS", "ResolverPool", "tenant_root"]

_T = TypeVar("_T")

#: Sessions whose resolver (and its verified outcomes) is kept; least recently used go first.
DEFAULT_MAX_SESSIONS: Final = 1024
#: The most characters of a source an excerpt shows.
EXCERPT_CHARS: Final = 500
#: The tenant of no scope (:data:`proxy.http.tenants.NO_TENANT`; not imported: that module
#: imports the request path, which imports this one).
_NO_TENANT: Final = "none"
#: What a tenant directory's name may be: one path component, never . or .. (tenants are
#: ``t<16 hex>`` and ``h<16 hex>``).
_TENANT_DIR: Final = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)


def tenant_root(root: str, tenant: str) -> str:
    """Where ``tenant``'s sources are under a root (a path or an ``s3://`` URL): the root
    itself for tenant ``none``, else its directory named by the tenant (else a ValueError)."""
    if tenant == _NO_TENANT:
        return root
    if _TENANT_DIR.fullmatch(tenant) is None:
        raise ValueError(f"not a tenant: {tenant!r}")
    if is_s3_url(root):
        return f"{root.rstrip('/')}/{tenant}/"
    return os.path.join(root, tenant)


class ResolverPool:
    """The resolvers of each recently seen session (``sources.*``; a bad ``s3://`` URL is a
    ValueError). Used from the event loop only; the local resolvers are thread-safe."""

    def __init__(self, transcript_root: str, artifact_root: str, access: SourceAccessPolicy,
                 *, max_sessions: int = DEFAULT_MAX_SESSIONS,
                 s3: S3Settings | None = None) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self._roots = transcript_root, artifact_root
        self._access = access
        self._shared = frozenset(access.shared_sessions)
        # Which kind of source (transcripts, artifacts) is on the object store.
        self._remote = is_s3_url(transcript_root), is_s3_url(artifact_root)
        self._s3: S3ObjectStore | None = None
        if any(self._remote):
            # The S3 client library is imported only here, so local roots never need it.
            from proxy.sources import s3_client, s3_sources

            # (a kind on a local root never reaches the S3 resolver: it is given the other root)
            self._s3_roots = _of_kind(self._roots, self._remote, remote_wanted=True)
            for root in self._s3_roots:
                parse_s3_root(root)  # (checked now: a bad URL fails at startup)
            self._s3 = s3_client.S3ObjectStore(s3 or S3Settings())
            self._s3_cache = s3_sources.new_outcome_cache()
        # (tenant, session id) -> its resolver, created on first use.
        self._resolvers = cached(LRUCache(max_sessions), lock=threading.Lock())(
            self._new_resolver)
        self._s3_resolvers = cached(LRUCache(max_sessions), lock=threading.Lock())(
            self._new_s3_resolver)

    async def resolve(self, session_id: str, state: compactor.DurableContextState, *,
                      tenant: str) -> tuple[compactor.SourceResolution, ...]:
        """Each distinct pointer of ``state`` (first-seen order), resolved for ``tenant``'s
        ``session_id`` in that tenant's roots: the input
        :func:`compactor.render_durable_context` expects."""
        return await self._each(
            tenant, session_id, state.source_pointers(),
            lambda resolver, pointers: resolver.resolve_all(pointers),
            lambda resolver, pointers: resolver.resolve_pointers(pointers))

    async def excerpts(self, session_id: str, state: compactor.DurableContextState, *,
                       tenant: str, max_chars: int = EXCERPT_CHARS
                       ) -> tuple[compactor.SourceExcerpt, ...]:
        """Each distinct pointer of ``state`` (first-seen order), resolved for ``tenant``'s
        ``session_id``, with an excerpt of at most ``max_chars`` characters of each available
        source."""
        return await self._each(
            tenant, session_id, state.source_pointers(),
            lambda resolver, pointers: tuple(resolver.excerpt(p, max_chars=max_chars)
                                             for p in pointers),
            lambda resolver, pointers: resolver.excerpt_pointers(pointers, max_chars=max_chars))

    async def _each(self, tenant: str, session_id: str, pointers: Sequence[str],
                    local: Callable[[compactor.SourcePointerResolver, list[str]],
                                    tuple[_T, ...]],
                    remote: Callable[[S3SourceResolver, list[str]],
                                     Awaitable[tuple[_T, ...]]]) -> tuple[_T, ...]:
        """``local`` over the pointers of local roots (in a worker thread) and ``remote`` over
        the others, each group with its roots' resolver; results in the pointers' order."""
        routes = [self._route(pointer, tenant) for pointer in pointers]
        groups: dict[tuple[str, bool], list[str]] = {}
        for pointer, route in zip(pointers, routes, strict=True):
            groups.setdefault(route, []).append(pointer)

        async def run(route: tuple[str, bool], group: list[str]) -> tuple[_T, ...]:
            where, on_store = route
            if on_store:
                return await remote(self._s3_resolvers(where, session_id), group)
            return await asyncio.to_thread(local, self._resolvers(where, session_id), group)

        if len(groups) == 1:  # (the usual case: one kind of root, no shared session)
            [(route, group)] = groups.items()
            return await run(route, group)
        done = await asyncio.gather(*(run(route, group) for route, group in groups.items()))
        results = {route: iter(found) for route, found in zip(groups, done, strict=True)}
        return tuple(next(results[route]) for route in routes)

    def _route(self, pointer: str, tenant: str) -> tuple[str, bool]:
        """Whose roots resolve ``pointer`` (the tenant's; the roots themselves for a session of
        ``shared_sessions``, which every tenant may read) and whether its kind's root is on
        the object store. A pointer names its kind first; anything else (refused by any
        resolver before a lookup) goes with the transcripts."""
        parts = pointer.split(":", 2)
        where = _NO_TENANT if len(parts) == 3 and parts[1] in self._shared else tenant
        return where, self._remote[1] if parts[0] == "artifact" else self._remote[0]

    async def close(self) -> None:
        """Close the object store's client, if there is one."""
        if self._s3 is not None:
            await self._s3.close()

    def _new_resolver(self, tenant: str, session_id: str) -> compactor.SourcePointerResolver:
        # A kind on the object store never reaches this resolver: it is given the other root.
        transcripts, artifacts = (tenant_root(root, tenant) for root in _of_kind(
            self._roots, self._remote, remote_wanted=False))
        return compactor.SourcePointerResolver(transcripts, artifacts,
                                               self._access.authorizer(session_id))

    def _new_s3_resolver(self, tenant: str, session_id: str) -> S3SourceResolver:
        from proxy.sources.s3_sources import S3SourceResolver

        assert self._s3 is not None
        transcripts, artifacts = (parse_s3_root(tenant_root(root, tenant))
                                  for root in self._s3_roots)
        return S3SourceResolver(self._s3, transcripts, artifacts,
                                self._access.authorizer(session_id), cache=self._s3_cache)


def _of_kind(roots: tuple[str, str], remote: tuple[bool, bool], *,
             remote_wanted: bool) -> tuple[str, str]:
    """``roots`` with a root of the other kind replaced by the one of the wanted kind."""
    transcripts, artifacts = roots
    if remote[0] != remote_wanted:
        transcripts = artifacts
    if remote[1] != remote_wanted:
        artifacts = transcripts
    return transcripts, artifacts

