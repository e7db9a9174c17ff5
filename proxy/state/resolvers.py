"""Source-pointer resolvers kept across requests, one per session.

A :class:`compactor.SourcePointerResolver` remembers what it verified (keyed by the file's
identity and change stamps), but its authorizer is bound to one requesting session. The proxy
resolves the same session's pointers on every request, so it keeps one resolver per recent
session: the second request of a session re-hashes nothing that did not change.

:meth:`ResolverPool.excerpts` serves the operator (``GET /admin/.../state?resolve=true``, the
``session`` command): each pointer's status and, for an available source, the start of its
text, through the same resolver (so the same authorization and strict names). Nothing on the
request path calls it: excerpts never reach a prompt.
"""

from __future__ import annotations

import functools
from typing import Final

import compactor
from policies import SourceAccessPolicy

__all__ = ["DEFAULT_MAX_SESSIONS", "EXCERPT_CHARS", "ResolverPool"]

#: Sessions whose resolver (and its verified outcomes) is kept; least recently used go first.
DEFAULT_MAX_SESSIONS: Final = 1024
#: The most characters of a source an excerpt shows.
EXCERPT_CHARS: Final = 500


class ResolverPool:
    """The resolver of each recently seen session. Used from the event loop only; the
    resolvers themselves are safe to use from worker threads.

    Args:
        transcript_root: ``sources.transcript_root``.
        artifact_root: ``sources.artifact_root``.
        access: who may resolve which session's pointers.
        max_sessions: how many sessions' resolvers to keep.
    """

    def __init__(self, transcript_root: str, artifact_root: str, access: SourceAccessPolicy,
                 *, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self._transcript_root = transcript_root
        self._artifact_root = artifact_root
        self._access = access
        # session id -> its resolver, created on first use; least recently used evicted.
        self._resolvers = functools.lru_cache(maxsize=max_sessions)(self._new_resolver)

    def for_session(self, session_id: str) -> compactor.SourcePointerResolver:
        """The resolver that serves ``session_id`` (created on first use)."""
        return self._resolvers(session_id)

    def excerpts(self, session_id: str, state: compactor.DurableContextState, *,
                 max_chars: int = EXCERPT_CHARS) -> tuple[compactor.SourceExcerpt, ...]:
        """Each distinct pointer of ``state`` (first-seen order), resolved for ``session_id``,
        with an excerpt of at most ``max_chars`` characters of each available source.

        Reads files: call it from a worker thread.
        """
        resolver = self.for_session(session_id)
        return tuple(resolver.excerpt(pointer, max_chars=max_chars)
                     for pointer in state.source_pointers())

    def _new_resolver(self, session_id: str) -> compactor.SourcePointerResolver:
        return compactor.SourcePointerResolver(
            self._transcript_root, self._artifact_root, self._access.authorizer(session_id)
        )
