"""The Redis store's audit log (:class:`~proxy.audit.log.RequestLog`): each session's
entries, totals and changes in its own slot, kept and trimmed by scripts; the global indexes
(sessions, refusals, changed sessions) written after them (see :mod:`proxy.store.redis`).
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from proxy.audit.log import RequestEntry, SessionOrder, SessionSummary, StateChange, utc_iso

from .._rows import check_page, check_type, decode_audit, encode_audit, retention_cutoff
from ..base import CorruptStateError
from . import scripts
from .client import FAILURES
from .connection import RedisConnection
from .keys import as_score, as_text, listed, pair_member, pair_of
from .state import change_args

__all__ = ["RedisRequestLog"]


class RedisRequestLog(RedisConnection):
    """:class:`~proxy.audit.log.RequestLog` on Redis."""

    def add_request(self, entry: RequestEntry) -> asyncio.Future[None]:
        """Batched (:class:`~proxy.store.audit_batches.AuditBatches`): one script per session
        of the batch, then its places in the global indexes, which follow what its trim
        dropped; other sessions' old entries wait for :meth:`trim`."""
        check_type("entry", entry, RequestEntry)
        self._check_open()
        return self._batches.add(entry)

    async def _write_requests(self, batch: list[RequestEntry]) -> None:
        """One batch: each session's entries by one script, then that session's places in
        the global indexes (a failure leaves the sessions before it whole)."""
        sessions: dict[tuple[str, str], list[RequestEntry]] = {}
        for entry in batch:
            sessions.setdefault((entry.tenant, entry.session_id), []).append(entry)
        try:
            for (tenant, session_id), entries in sessions.items():
                keys = self.audit_keys(tenant, session_id)
                args: list[Any] = list(self._bounds())
                texts = [encode_audit(entry) for entry in entries]
                for entry, text in zip(entries, texts, strict=True):
                    args += [text, as_score(entry.at), utc_iso(entry.at),
                             entry.tokens_before or 0, entry.tokens_after or 0,
                             int(entry.blocked)]
                reply = await self._script(scripts.ADD_REQUESTS)(keys=keys, args=args)
                refused = {as_text(m) for m in reply[2]}
                blocked = {text: as_score(entry.at)
                           for entry, text in zip(entries, texts, strict=True)
                           if entry.blocked and text not in refused}
                if blocked:  # (refusals are few: their index is written session by session)
                    await self._redis.zadd(self.audit_blocked_key, blocked)
                await self._after_trim(tenant, session_id, reply)
        except FAILURES as exc:
            raise self._audit_error("add audit entries", exc) from exc

    async def flush(self) -> None:
        await self._batches.flush()

    async def add_state_change(self, change: StateChange) -> None:
        check_type("change", change, StateChange)
        with self._failures("add state change", self._audit_error):
            newest = await self._script(scripts.ADD_CHANGE)(
                keys=[self.change_key(change.tenant, change.session_id)],
                args=change_args(change, *self._bounds()))
            await self._index_changed(change.tenant, change.session_id,
                                      None if newest is None else as_text(newest))

    async def sessions(self, *, offset: int = 0, limit: int = 50, contains: str | None = None,
                       order: SessionOrder = "last_seen",
                       tenant: str | None = None) -> tuple[list[SessionSummary], int]:
        check_page(offset, limit, order)
        with self._failures("read audit sessions", self._audit_error):
            await self._batches.flush()  # this process's entries are read too
            index = self.audit_sessions_key
            if order == "last_seen" and not contains and tenant is None:
                # The index is in the order asked for: read just the page.
                total = int(await self._redis.zcard(index))
                page = [as_text(m) for m in listed(
                    await self._redis.zrevrange(index, offset, offset + limit - 1))]
                summaries = await self._summaries(page)
            else:
                members = [as_text(m) for m in listed(await self._redis.zrevrange(index, 0, -1))]
                if contains or tenant is not None:
                    needle = (contains or "").lower()
                    members = [m for m in members
                               if needle in pair_of(m, "<audit log>")[1].lower()
                               and tenant in (None, pair_of(m, "<audit log>")[0])]
                total = len(members)
                if order == "last_seen":
                    summaries = await self._summaries(members[offset:offset + limit])
                else:
                    everything = await self._summaries(members)
                    # Stable: equal counts keep the index's newest-first order.
                    everything.sort(key=lambda summary: -summary.blocked)
                    summaries = everything[offset:offset + limit]
        return summaries, total

    async def session_requests(self, tenant: str, session_id: str, *, offset: int = 0,
                               limit: int = 100) -> tuple[list[RequestEntry], int]:
        check_page(offset, limit)
        with self._failures("read audit entries", self._audit_error):
            await self._batches.flush()  # this process's entries are read too
            key = self.audit_keys(tenant, session_id)[0]
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.zcard(key)
                pipe.zrevrange(key, offset, offset + limit - 1)
                total, members = await pipe.execute()
        return [decode_audit(RequestEntry, member) for member in members], int(total)

    async def state_changes(self, tenant: str, session_id: str, *,
                            limit: int = 100) -> list[StateChange]:
        check_page(0, limit)
        with self._failures("read state changes", self._audit_error):
            members = await self._redis.zrevrange(self.change_key(tenant, session_id),
                                                  0, limit - 1)
        return [decode_audit(StateChange, member) for member in listed(members)]

    async def blocked_since(self, since: datetime, *, limit: int = 1000) -> list[RequestEntry]:
        check_page(0, limit)
        with self._failures("read blocked requests", self._audit_error):
            await self._batches.flush()  # this process's entries are read too
            members = await self._redis.zrangebyscore(self.audit_blocked_key,
                                                      as_score(since), "+inf", start=0, num=limit)
        return [decode_audit(RequestEntry, member) for member in listed(members)]

    async def trim(self, now: datetime) -> int:
        """Session by session."""
        cutoff = as_score(retention_cutoff(now, self.retention_days))
        removed = 0
        with self._failures("trim the audit log", self._audit_error):
            sessions = listed(await self._redis.zrange(self.audit_sessions_key, 0, -1))
            for tenant, session_id in [pair_of(m, "<audit log>") for m in sessions]:
                reply = await self._script(scripts.TRIM_SESSION)(
                    keys=self.audit_keys(tenant, session_id),
                    args=[self.max_requests_per_session, cutoff])
                removed += int(reply[0])
                await self._after_trim(tenant, session_id, reply)
            await self._redis.zremrangebyscore(self.audit_blocked_key, "-inf", f"({cutoff}")
            changed = listed(await self._redis.zrange(self.audit_changed_key, 0, -1))
            for tenant, session_id in [pair_of(m, "<audit log>") for m in changed]:
                gone, newest = await self._script(scripts.TRIM_CHANGES)(
                    keys=[self.change_key(tenant, session_id)], args=[cutoff])
                removed += int(gone)
                await self._index_changed(tenant, session_id, as_text(newest) or None)
        return removed

    async def _summaries(self, members: list[str]) -> list[SessionSummary]:
        """The totals of each session, in the order given; a session whose totals are gone
        (a writer stopped between its session's keys and the index) is left out."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for member in members:
                pipe.hgetall(self.audit_keys(*pair_of(member, "<audit log>"))[1])
            hashes = await pipe.execute()
        return [_totals(member, raw) for member, raw in zip(members, hashes, strict=True) if raw]

    async def _after_trim(self, tenant: str, session_id: str, reply: list[Any]) -> None:
        """After a session's add or trim script (its ``reply``): the refused entries it dropped
        leave the blocked index, and the session's place in the sessions index follows."""
        refused = [as_text(m) for m in reply[2]]
        if refused:
            await self._redis.zrem(self.audit_blocked_key, *refused)
        score = None if int(reply[1]) else as_text(reply[3]) or None

        async def last_score() -> str | None:
            value = await self._redis.hget(self.audit_keys(tenant, session_id)[1], "last_score")
            return None if value is None else as_text(value)

        await self._index(self.audit_sessions_key, pair_member(tenant, session_id), score,
                          last_score)


def _totals(member: str, raw: dict[Any, Any]) -> SessionSummary:
    """A session's totals hash as a :class:`SessionSummary`."""
    tenant, session_id = pair_of(member, "<audit log>")
    fields = {as_text(name): as_text(value) for name, value in raw.items()}
    try:
        counts = {name: int(fields.get(name, "0")) for name in
                  ("requests", "tokens_before", "tokens_after", "blocked")}
        last_seen = datetime.fromisoformat(fields["last_seen"])
    except (KeyError, ValueError):
        raise CorruptStateError("<audit log>", f"the totals of session {session_id!r} "
                                "do not read back") from None
    return SessionSummary(session_id=session_id, tenant=tenant, last_seen=last_seen, **counts)
