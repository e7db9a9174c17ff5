"""The SQLite store's tables, created (``IF NOT EXISTS``) when a file is opened."""

from __future__ import annotations

from proxy.accounting.usage import UsageEntry

__all__ = ["SCHEMA", "SCHEMA_VERSION", "USAGE_COLUMNS"]

#: Bump together with a migration in ``SCHEMA`` handling when the table layout changes.
#: A new table (``CREATE TABLE IF NOT EXISTS``) is no such change: a file from before gets it
#: when it is opened, and an older program never looks at it (``session_usage`` came so).
SCHEMA_VERSION = 1

#: The usage counters, one INTEGER column each (names from our own dataclass, not input).
USAGE_COLUMNS: tuple[str, ...] = UsageEntry.field_names()

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
    # One row per session: the durable state as canonical JSON, with its CAS version.
    """CREATE TABLE IF NOT EXISTS session_state (
        session_id TEXT PRIMARY KEY,
        version INTEGER NOT NULL CHECK (version >= 1),
        state_json TEXT NOT NULL,
        updated_at TEXT NOT NULL
    ) WITHOUT ROWID""",
    # ``seq`` is the rowid, so it grows with insertion order: the oldest rows have the
    # smallest seq and eviction is a range delete on the primary key.
    """CREATE TABLE IF NOT EXISTS summary_cache (
        seq INTEGER PRIMARY KEY,
        key TEXT NOT NULL UNIQUE,
        text TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS session_record (
        session_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        data BLOB NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (session_id, kind)
    ) WITHOUT ROWID""",
    # One row per (session key, model): additive usage counters, see proxy.accounting.usage.
    "CREATE TABLE IF NOT EXISTS session_usage (\n"
    "    session_key TEXT NOT NULL,\n"
    "    model TEXT NOT NULL,\n"
    + "".join(f"    {name} INTEGER NOT NULL DEFAULT 0,\n" for name in USAGE_COLUMNS)
    + "    last_seen TEXT NOT NULL,\n"
    "    PRIMARY KEY (session_key, model)\n"
    ") WITHOUT ROWID",
    # The audit log (see proxy.audit.log): one row per request, its JSON in ``entry``;
    # the columns are what the queries and the totals need. ``at`` is fixed-width ISO (UTC).
    """CREATE TABLE IF NOT EXISTS audit_request (
        seq INTEGER PRIMARY KEY,
        tenant TEXT NOT NULL,
        session_id TEXT NOT NULL,
        at TEXT NOT NULL,
        tokens_before INTEGER NOT NULL,
        tokens_after INTEGER NOT NULL,
        blocked INTEGER NOT NULL,
        entry TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS audit_request_session ON audit_request (tenant, session_id, at)",
    "CREATE INDEX IF NOT EXISTS audit_request_at ON audit_request (at)",
    "CREATE INDEX IF NOT EXISTS audit_request_blocked ON audit_request (at) WHERE blocked = 1",
    # Each session's totals over its rows in audit_request, changed with them.
    """CREATE TABLE IF NOT EXISTS audit_session (
        tenant TEXT NOT NULL,
        session_id TEXT NOT NULL,
        last_seen TEXT NOT NULL,
        requests INTEGER NOT NULL,
        tokens_before INTEGER NOT NULL,
        tokens_after INTEGER NOT NULL,
        blocked INTEGER NOT NULL,
        PRIMARY KEY (tenant, session_id)
    ) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS audit_session_last_seen ON audit_session (last_seen)",
    "CREATE INDEX IF NOT EXISTS audit_session_blocked ON audit_session (blocked, last_seen)",
    """CREATE TABLE IF NOT EXISTS audit_change (
        seq INTEGER PRIMARY KEY,
        tenant TEXT NOT NULL,
        session_id TEXT NOT NULL,
        at TEXT NOT NULL,
        change TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS audit_change_session ON audit_change (tenant, session_id, at)",
    "CREATE INDEX IF NOT EXISTS audit_change_at ON audit_change (at)",
    # Replica consistency: the version of each versioned record (bumped with the record in
    # one transaction), and leases by name (a row whose expires_at, Unix seconds, has passed
    # is free).
    """CREATE TABLE IF NOT EXISTS record_version (
        session_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        version INTEGER NOT NULL,
        PRIMARY KEY (session_id, kind)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS state_tombstone (
        session_id TEXT PRIMARY KEY,
        version INTEGER NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS store_lock (
        name TEXT PRIMARY KEY,
        token TEXT NOT NULL,
        expires_at REAL NOT NULL
    ) WITHOUT ROWID""",
)
