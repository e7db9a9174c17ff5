"""The per-session calibration across processes: a snapshot restores the same factors and
per-message counts bit for bit; SharedCalibration saves after each answer and another
instance on the same store picks it up with the next state read; the fleet's medians stay
per process."""

from __future__ import annotations

from pathlib import Path

from proxy.state.calibration import Calibration
from proxy.state.shared_calibration import SharedCalibration
from proxy.state.store import CachedStateReads, SQLiteStateStore

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
