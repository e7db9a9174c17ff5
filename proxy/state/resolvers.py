"""Source-pointer resolvers kept across requests, one per session.

A :class:`compactor.SourcePointerResolver` remembers what it verified (keyed by the file's
identity and change stamps), but its authorizer is bound to one requesting session. The proxy
resolves the same session's pointers on every request, so it keeps one resolver per recent
session: the second request of a session re-hashes nothing that did not change.

Each tenant has its own roots (:func:`tenant_root`): with a ``session.scope`` on, the
sources of tenant ``t…`` are ``<root>/t…/<session>.jsonl`` and ``<root>/t…/<session>/<file>``
(``s3://`` roots likewise, one key prefix per tenant), so a caller naming another tenant's
session id finds nothing of it; tenant ``none`` (no scope) reads the roots themselves, as
before tenants. ``compact-proxy move-session`` moves a session's files into its tenant's
directory (:mod:`proxy.state.migrate`). The session-access policy then applies within a
tenant (``shared_sessions`` are shared by the sessions of one tenant).

The roots' scheme chooses the kind: local paths get :class:`compactor.SourcePointerResolver`
(run in a worker thread: it reads files), ``s3://`` roots get
:class:`proxy.state.s3_sources.S3SourceResolver` (awaited on the event loop: one S3 client for
the pool, and one outcome cache shared by its sessions' resolvers, keyed by pointer and
object). Both roots are of one kind. :meth:`ResolverPool.resolve` and
:meth:`ResolverPool.excerpts` hide the difference.

:meth:`ResolverPool.excerpts` serves the operator (``GET /admin/.../state?resolve=true``, the
``session`` command): each pointer's status and, for an available source, the start of its
text, through the same resolver (so the same authorization and strict names). Nothing on the
request path calls it: excerpts never reach a prompt.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import compactor
from policies import SourceAccessPolicy
from proxy.state.s3_roots import S3Settings, is_s3_url, parse_s3_root

if TYPE_CHECKING:
    from proxy.state.s3_sources import S3SourceResolver

__all__ = ["DEFAULT_MAX_SESSIONS", "EXCERPT_CHARS", "ResolverPool", "tenant_root"]

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
    """Where ``tenant``'s sources are under a configured root (a path or an ``s3://`` URL):
    the root itself for tenant ``none``, else its directory (key prefix) named by the tenant.

    Raises:
        ValueError: ``tenant`` cannot name a directory.
    """
    if tenant == _NO_TENANT:
        return root
    if _TENANT_DIR.fullmatch(tenant) is None:
        raise ValueError(f"not a tenant: {tenant!r}")
    if is_s3_url(root):
        return f"{root.rstrip('/')}/{tenant}/"
    return os.path.join(root, tenant)


class ResolverPool:
    """The resolver of each recently seen session. Used from the event loop only; the local
    resolvers themselves are safe to use from worker threads.

    Args:
        transcript_root: ``sources.transcript_root`` (a path, or an ``s3://`` URL).
        artifact_root: ``sources.artifact_root`` (of the same kind).
        access: who may resolve which session's pointers.
        max_sessions: how many sessions' resolvers to keep.
        s3: the object store's endpoint and region (``sources.s3``), for ``s3://`` roots.

    Raises:
        ValueError: one root is an ``s3://`` URL and the other is not, or a bad ``s3://``
            URL.
    """

    def __init__(self, transcript_root: str, artifact_root: str, access: SourceAccessPolicy,
                 *, max_sessions: int = DEFAULT_MAX_SESSIONS,
                 s3: S3Settings | None = None) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self._transcript_root = transcript_root
        self._artifact_root = artifact_root
        self._access = access
        remote = is_s3_url(transcript_root), is_s3_url(artifact_root)
        if remote[0] != remote[1]:
            raise ValueError("sources: transcript_root and artifact_root must both be s3:// "
                             "URLs or both be paths")
        self._s3: _S3Sources | None = None
        if remote[0]:
            self._s3 = _S3Sources(transcript_root, artifact_root, s3)
        # (tenant, session id) -> its resolver, created on first use; least recently used
        # evicted.
        self._resolvers = functools.lru_cache(maxsize=max_sessions)(self._new_resolver)
        self._s3_resolvers = functools.lru_cache(maxsize=max_sessions)(self._new_s3_resolver)

    @property
    def is_remote(self) -> bool:
        """Whether the roots are on an object store (``s3://``)."""
        return self._s3 is not None

    def for_session(self, session_id: str, *, tenant: str) -> compactor.SourcePointerResolver:
        """The local resolver that serves ``tenant``'s ``session_id`` (created on first use).

        Raises:
            RuntimeError: the roots are on an object store (use :meth:`resolve`).
        """
        if self._s3 is not None:
            raise RuntimeError("the source roots are s3:// URLs: use ResolverPool.resolve")
        return self._resolvers(tenant, session_id)

    async def resolve(self, session_id: str, state: compactor.DurableContextState, *,
                      tenant: str) -> tuple[compactor.SourceResolution, ...]:
        """Each distinct pointer of ``state`` (first-seen order), resolved for ``tenant``'s
        ``session_id`` in that tenant's roots: the input
        :func:`compactor.render_durable_context` expects."""
        if self._s3 is not None:
            return await self._s3_resolvers(tenant, session_id).resolve_all(state)
        resolver = self._resolvers(tenant, session_id)
        return await asyncio.to_thread(compactor.resolve_durable_sources, state, resolver)

    async def excerpts(self, session_id: str, state: compactor.DurableContextState, *,
                       tenant: str, max_chars: int = EXCERPT_CHARS
                       ) -> tuple[compactor.SourceExcerpt, ...]:
        """Each distinct pointer of ``state`` (first-seen order), resolved for ``tenant``'s
        ``session_id``, with an excerpt of at most ``max_chars`` characters of each available
        source."""
        if self._s3 is not None:
            return await self._s3_resolvers(tenant, session_id).excerpts(state,
                                                                         max_chars=max_chars)
        resolver = self._resolvers(tenant, session_id)

        def read() -> tuple[compactor.SourceExcerpt, ...]:
            return tuple(resolver.excerpt(pointer, max_chars=max_chars)
                         for pointer in state.source_pointers())

        return await asyncio.to_thread(read)

    async def close(self) -> None:
        """Close the object store's client, if there is one."""
        if self._s3 is not None:
            await self._s3.store.close()

    def _new_resolver(self, tenant: str, session_id: str) -> compactor.SourcePointerResolver:
        return compactor.SourcePointerResolver(
            tenant_root(self._transcript_root, tenant), tenant_root(self._artifact_root, tenant),
            self._access.authorizer(session_id))

    def _new_s3_resolver(self, tenant: str, session_id: str) -> S3SourceResolver:
        assert self._s3 is not None
        return self._s3.resolver(tenant, self._access.authorizer(session_id))


class _S3Sources:
    """What the sessions' S3 resolvers share: the roots, the client and the outcome cache.
    The S3 client library is imported only here, so local roots never need it."""

    def __init__(self, transcript_root: str, artifact_root: str,
                 settings: S3Settings | None) -> None:
        from proxy.state import s3_sources

        self._module = s3_sources
        parse_s3_root(transcript_root)  # (checked now: a bad URL fails at startup)
        parse_s3_root(artifact_root)
        self.transcript_root = transcript_root
        self.artifact_root = artifact_root
        self.store = s3_sources.S3ObjectStore(settings or S3Settings())
        self.cache = s3_sources.new_outcome_cache()

    def resolver(self, tenant: str, authorize: Callable[[compactor.SourcePointer], bool]
                 ) -> S3SourceResolver:
        return self._module.S3SourceResolver(
            self.store, parse_s3_root(tenant_root(self.transcript_root, tenant)),
            parse_s3_root(tenant_root(self.artifact_root, tenant)), authorize, cache=self.cache)
