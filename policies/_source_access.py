"""Who may resolve which source pointers: by default a session only its own, so one session's
durable state cannot surface another's files; ``shared_sessions`` everyone may read, and
``allow_cross_session`` lifts the rule. The authorizer is duck-typed on ``pointer.session_id``
(``policies`` never imports ``compactor``): anything without a string ``session_id`` is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ._session_ids import check_session_id

__all__ = ["SourceAccessPolicy", "own_session_only"]


class SessionScoped(Protocol):
    """What the authorizer looks at: a parsed source pointer's ``session_id``."""

    @property
    def session_id(self) -> str:
        """The session that owns the source."""
        ...


@dataclass(frozen=True, slots=True, init=False)
class SourceAccessPolicy:
    """The source-access rule of a deployment; ``ValueError`` for a non-bool
    ``allow_cross_session`` or ``shared_sessions`` that is not a list/tuple of session ids."""

    allow_cross_session: bool
    shared_sessions: tuple[str, ...]

    # Hand-written so shared_sessions may be given as a list (e.g. from YAML) yet is
    # stored as a tuple.
    def __init__(self, allow_cross_session: bool = False,
                 shared_sessions: Sequence[str] = ()) -> None:
        if not isinstance(allow_cross_session, bool):
            raise ValueError(f"allow_cross_session: must be true or false, got "
                             f"{allow_cross_session!r}")
        object.__setattr__(self, "allow_cross_session", allow_cross_session)
        if not isinstance(shared_sessions, (list, tuple)):
            raise ValueError(f"shared_sessions: must be a list of session ids, got "
                             f"{type(shared_sessions).__name__}")
        for index, sid in enumerate(shared_sessions):
            check_session_id(sid, f"shared_sessions[{index}]")
        object.__setattr__(self, "shared_sessions", tuple(shared_sessions))

    def authorizer(self, requesting_session_id: str) -> Callable[[SessionScoped], bool]:
        """The ``authorize`` callable for a resolver serving ``requesting_session_id``
        (``ValueError`` when it is not a valid session id)."""
        requester = check_session_id(requesting_session_id, "requesting_session_id")
        if self.allow_cross_session:
            return _allow_any
        readable = frozenset((requester, *self.shared_sessions))

        def authorize(pointer: SessionScoped) -> bool:
            owner = getattr(pointer, "session_id", None)
            return isinstance(owner, str) and owner in readable

        return authorize


def _allow_any(pointer: SessionScoped) -> bool:
    # Even the open policy refuses things that are not pointers at all.
    return isinstance(getattr(pointer, "session_id", None), str)


_DEFAULT_POLICY = SourceAccessPolicy()


def own_session_only(requesting_session_id: str) -> Callable[[SessionScoped], bool]:
    """The default authorizer: ``requesting_session_id`` may resolve only its own pointers."""
    return _DEFAULT_POLICY.authorizer(requesting_session_id)
