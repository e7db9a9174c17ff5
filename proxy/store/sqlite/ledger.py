"""The SQLite store's usage ledger (:class:`~proxy.store.base.UsageLedger`): the
``session_usage`` table, one row of counters per ``(session key, model)``, each added to in
one statement."""

from __future__ import annotations

from proxy.accounting.usage import UsageEntry, UsageRow

from .._rows import check_type, decode_usage_row, usage_stamp
from .connection import SQLiteConnection, in_worker
from .schema import USAGE_COLUMNS

__all__ = ["SQLiteLedger"]

# Every counter added to the row's own, in one statement; last_seen only moves forward.
_ADD_USAGE = (
    f"INSERT INTO session_usage (session_key, model, {', '.join(USAGE_COLUMNS)}, last_seen)"
    f" VALUES (?, ?, {', '.join('?' for _ in USAGE_COLUMNS)}, ?)"
    " ON CONFLICT (session_key, model) DO UPDATE SET "
    + ", ".join(f"{name} = {name} + excluded.{name}" for name in USAGE_COLUMNS)
    + ", last_seen = max(last_seen, excluded.last_seen)"
)
_USAGE_ROWS = (
    f"SELECT session_key, model, {', '.join(USAGE_COLUMNS)}, last_seen FROM session_usage"
    " ORDER BY session_key, model"
)


class SQLiteLedger(SQLiteConnection):
    """:class:`~proxy.store.base.UsageLedger` on SQLite."""

    async def add_usage(self, session_key: str, model: str, entry: UsageEntry) -> None:
        check_type("entry", entry, UsageEntry)
        await self._call(self._add_usage, session_key, model, entry)

    def _add_usage(self, session_key: str, model: str, entry: UsageEntry) -> None:
        counters = tuple(getattr(entry, name) for name in USAGE_COLUMNS)
        with self._sqlite_errors("add usage") as conn:
            # A single statement is its own atomic transaction in autocommit mode.
            conn.execute(_ADD_USAGE, (session_key, model, *counters, usage_stamp()))

    @in_worker
    def usage_rows(self) -> list[UsageRow]:
        with self._sqlite_errors("read usage") as conn:
            rows = conn.execute(_USAGE_ROWS).fetchall()
        return [
            decode_usage_row(str(key), str(model), dict(zip(USAGE_COLUMNS, counters,
                                                            strict=True)), last_seen)
            for key, model, *counters, last_seen in rows
        ]
