"""The per-session calibration across processes: a snapshot restores the same factors and
per-message counts bit for bit; SharedCalibration saves after each answer and another
instance on the same store picks it up with the next state read; the fleet's medians stay
per process."""

from __future__ import annotations

from pathlib import Path

from proxy.calibration.local import Calibration
from proxy.calibration.shared import SharedCalibration
from proxy.store import CachedStateReads, SQLiteStateStore

MODEL = "claude-sonnet-4-5"


def teach(calibration: Calibration, session: str, answers: int) -> None:
    for n in range(answers):
        prints = list(range(1000, 1000 + 4 * (n + 1)))
        tokens = [300 + 7 * k for k in range(len(prints))]
        counted = 2000 + sum(tokens)
        calibration.observe(session, MODEL, counted, round(counted * (1.27 + 0.01 * n)),
                            2000, prints, tokens)


def test_a_snapshot_restores_the_same_factors_and_counts() -> None:
    one, two = Calibration(), Calibration()
    teach(one, "s", 6)
    data = one.snapshot("s", MODEL)
    assert data is not None and two.snapshot("s", MODEL) is None
    assert two.restore("s", MODEL, data)
    assert two.factors("s", MODEL) == one.factors("s", MODEL)
    assert dict(two.known("s", MODEL)) == dict(one.known("s", MODEL))
    assert two.snapshot("s", MODEL) == data
    assert not two.restore("s", MODEL, b"not a snapshot")


async def test_an_answer_on_one_process_calibrates_the_next_request_on_another(
        tmp_path: Path) -> None:
    a_store = await SQLiteStateStore(tmp_path / "s.db", shared=True).open()
    b_store = await SQLiteStateStore(tmp_path / "s.db", shared=True).open()
    a, b = SharedCalibration(a_store), SharedCalibration(b_store)
    b_reads = CachedStateReads(b_store, listeners=[b.refresh])
    try:
        teach(a, "s", 3)
        await a.flush()
        assert b.factors("s", MODEL) != a.factors("s", MODEL)
        await b_reads.get_state("s")  # the request's state read refreshes it
        assert b.factors("s", MODEL) == a.factors("s", MODEL)
        assert dict(b.known("s", MODEL)) == dict(a.known("s", MODEL))
        teach(b, "s", 5)  # b answers next; a follows on its next read
        await b.flush()
        a_reads = CachedStateReads(a_store, listeners=[a.refresh])
        await a_reads.get_state("s")
        assert a.snapshot("s", MODEL) == b.snapshot("s", MODEL)
        # The fleet (another session's start) stays per process.
        assert a.factors("new", MODEL) != b.factors("new", MODEL)
    finally:
        await a_store.close()
        await b_store.close()


async def test_saved_returns_once_the_sessions_answer_is_in_the_store(tmp_path: Path) -> None:
    """What the request path awaits before the answer ends: after it, another process's
    next state read finds the calibration."""
    a_store = await SQLiteStateStore(tmp_path / "s.db", shared=True).open()
    b_store = await SQLiteStateStore(tmp_path / "s.db", shared=True).open()
    a = SharedCalibration(a_store)
    try:
        teach(a, "s", 2)
        await a.saved("s")
        assert (await b_store.session_versions("s")).records.get(f"calibration:{MODEL}")
        await Calibration().saved("s")  # the per-process one: nothing to wait for
    finally:
        await a_store.close()
        await b_store.close()


class CountingRecordReads(SQLiteStateStore):
    """The real SQLite store, counting the record reads made on their own (round trips)."""

    record_reads = 0

    async def get_versioned_record(self, session_id: str, kind: str
                                   ) -> tuple[int, bytes] | None:
        self.record_reads += 1
        return await super().get_versioned_record(session_id, kind)


async def test_what_another_process_taught_comes_with_the_versions_read(tmp_path: Path) -> None:
    """Round robin between two processes: each request's state read brings the calibration
    the other one wrote (one round trip, no record read of its own); a process that holds
    the current calibration, its own or one it read, is sent nothing."""
    a_store = await CountingRecordReads(tmp_path / "s.db", shared=True).open()
    b_store = await CountingRecordReads(tmp_path / "s.db", shared=True).open()
    a, b = SharedCalibration(a_store), SharedCalibration(b_store)
    a_reads = CachedStateReads(a_store, listeners=[a.refresh], fetch=a.wanted)
    b_reads = CachedStateReads(b_store, listeners=[b.refresh], fetch=b.wanted)
    try:
        for turn in range(1, 5):
            this, reads, other = (a, a_reads, b) if turn % 2 else (b, b_reads, a)
            await reads.get_state("s")
            assert this.snapshot("s", MODEL) == other.snapshot("s", MODEL)
            teach(this, "s", turn)
            await this.saved("s")
        assert a_store.record_reads == b_store.record_reads == 0
        # Held and current: nothing more comes with the next reads.
        kind = f"calibration:{MODEL}"
        assert kind not in (await b_store.session_versions("s", b.wanted("s"))).fetched
        assert kind in (await a_store.session_versions("s", a.wanted("s"))).fetched
        await a_reads.get_state("s")
        assert kind not in (await a_store.session_versions("s", a.wanted("s"))).fetched
    finally:
        await a_store.close()
        await b_store.close()
