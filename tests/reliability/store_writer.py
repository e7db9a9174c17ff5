"""A writer process for the crash test (``python -m tests.reliability.store_writer DB SID``):
hammers ``SQLiteStateStore.put_state`` on one session, version after version, each write with
its change record (as the admin API writes), and prints ``committed <version>`` after each
write returns. Meant to be killed with SIGKILL.

Version ``v`` holds ``facts_for(v)`` facts, each naming ``v``: a reader can tell a whole
version from a torn one.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime

from compactor import DurableContextState, DurableFact
from proxy.audit.log import StateChange
from proxy.store import SQLiteStateStore


def facts_for(version: int) -> int:
    """How many facts version ``version`` holds (varies, so a torn write would show)."""
    return 20 + (version * 7) % 41


def state_for(version: int) -> DurableContextState:
    """The state written as ``version``: every fact's id and content name the version."""
    when = datetime(2025, 3, 1, tzinfo=UTC)
    return DurableContextState(facts=tuple(
        DurableFact(fact_id=f"v{version}-f{k}", content=f"version {version} fact {k} " + "x" * 400,
                    source_pointer=f"transcript:crash:{k + 1}", last_confirmed_at=when)
        for k in range(facts_for(version))))


async def hammer(path: str, session_id: str) -> None:
    """Write forever (until killed)."""
    store = await SQLiteStateStore(path).open()
    current = await store.get_state(session_id)
    version = current.version if current is not None else 0
    while True:
        change = StateChange(at=datetime.now(UTC), session_id=session_id, tenant="none",
                             actor="admin-api:crash", action="put", version=None,
                             detail=(f"version {version + 1}",))
        stored = await store.put_state(session_id, state_for(version + 1),
                                       version if version else None, change)
        version = stored.version
        sys.stdout.write(f"committed {version}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(hammer(sys.argv[1], sys.argv[2]))
