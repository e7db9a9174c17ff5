"""Calibration: the factor learnt from the provider's counts, and the learnt window."""

from __future__ import annotations

import pytest

from policies import CompactionPolicy
from proxy.calibration.local import (
    FIXED_SHARE,
    MAX_FACTOR,
    MIN_COUNTED_TOKENS,
    Calibration,
    clamp_to_window,
)

MODEL = "claude-sonnet-4-5"


def test_a_new_session_starts_at_one_then_follows_the_providers_ratio() -> None:
    calibration = Calibration()
    assert calibration.factors("s", MODEL) == (1.0, 1.0)
    assert calibration.observe("s", MODEL, 10_000, 13_000) == pytest.approx(1.3)
    assert calibration.factors("s", MODEL) == (pytest.approx(1.3), pytest.approx(1.3))


def test_the_newest_ratio_is_followed_but_one_outlier_is_not() -> None:
    calibration = Calibration()
    for provider in (13_000, 13_100, 12_900, 13_050):
        calibration.observe("s", MODEL, 10_000, provider)
    assert calibration.factor("s", MODEL) == pytest.approx(1.305)
    calibration.observe("s", MODEL, 10_000, 30_000)  # one broken answer: ratio 3
    assert calibration.factor("s", MODEL) == pytest.approx(1.305)
    for _ in range(3):  # a shift that persists is followed
        calibration.observe("s", MODEL, 10_000, 30_000)
    assert calibration.factor("s", MODEL) == pytest.approx(3.0)


def test_unbelievable_and_tiny_views_are_ignored() -> None:
    calibration = Calibration()
    assert calibration.observe("s", MODEL, 10_000, int(10_000 * (MAX_FACTOR + 1))) is None
    assert calibration.observe("s", MODEL, 10_000, 0) is None
    assert calibration.observe("s", MODEL, MIN_COUNTED_TOKENS - 1, 1_000) is None
    assert calibration.factor("s", MODEL) == 1.0


def test_sessions_are_separate_and_a_new_one_starts_from_the_models_fleet_median() -> None:
    calibration = Calibration()
    calibration.observe("a", MODEL, 10_000, 12_000)
    calibration.observe("b", MODEL, 10_000, 14_000)
    calibration.observe("c", MODEL, 10_000, 13_000)
    assert calibration.factor("a", MODEL) == pytest.approx(1.2)
    assert calibration.factor("new", MODEL) == pytest.approx(1.3)
    assert calibration.factor("new", "claude-haiku-4-5") == 1.0


def test_the_fixed_part_and_the_messages_get_their_own_factors() -> None:
    """A first view that is mostly system and tools teaches their ratio; later views teach
    the messages' ratio as what is left of the provider's count."""
    calibration = Calibration()
    fixed = 9_000
    calibration.observe("s", MODEL, 10_000, 11_000, reserved=fixed)  # 90 % fixed part
    assert fixed >= FIXED_SHARE * 10_000
    assert calibration.factors("s", MODEL) == (pytest.approx(1.1), pytest.approx(1.1))
    # fixed 9 000 at 1.1 = 9 900; messages 41 000 at 1.4 = 57 400
    calibration.observe("s", MODEL, 50_000, 9_900 + 57_400, reserved=fixed)
    reserved, messages = calibration.factors("s", MODEL)
    assert reserved == pytest.approx(1.1) and messages == pytest.approx(1.4)
    # After compaction the mix changes; the estimate still holds.
    assert fixed * reserved + 5_000 * messages == pytest.approx(9_900 + 7_000)


def test_the_window_is_learnt_and_clamps_the_thresholds() -> None:
    calibration = Calibration()
    assert calibration.window("s", MODEL) is None
    calibration.learn_window("s", MODEL, 200_000)
    calibration.learn_window("s", MODEL, 150_000)
    calibration.learn_window("other", MODEL, 180_000)
    assert calibration.window("s", MODEL) == 150_000
    assert calibration.window("new", MODEL) == 150_000  # one tenant (none): every session
    policy = CompactionPolicy(soft_threshold_tokens=160_000, hard_limit_tokens=190_000)
    clamped = clamp_to_window(policy, 150_000)
    assert (clamped.soft_threshold_tokens, clamped.hard_limit_tokens) == (135_000, 150_000)
    assert clamp_to_window(policy, None) is policy
    assert clamp_to_window(policy, 1_000_000) is policy  # already fits: same key


def test_a_new_session_starts_from_the_fleets_fixed_and_message_factors() -> None:
    """Once one session taught both parts, a new one starts from them: its second request,
    the first with many messages, is estimated with the fleet's messages' factor rather than
    its own fixed part's."""
    calibration = Calibration()
    calibration.observe("a", MODEL, 10_000, 11_000, reserved=9_000)
    calibration.observe("a", MODEL, 50_000, 9_900 + 57_400, reserved=9_000)
    assert calibration.factors("b", MODEL) == (pytest.approx(1.1), pytest.approx(1.4))
    calibration.observe("b", MODEL, 10_000, 11_200, reserved=9_500)  # mostly fixed part
    reserved, messages = calibration.factors("b", MODEL)
    assert reserved == pytest.approx(1.12) and messages == pytest.approx(1.4)


def test_each_message_keeps_the_count_the_provider_gave_it() -> None:
    """A view's new messages share what is left of the provider's count once the fixed part
    and the messages known before are paid for; after compaction (some of those messages and
    one new one) the known counts are used, the new one at the messages' factor."""
    calibration = Calibration()
    a, b, c = (101, 1_000), (102, 2_000), (103, 3_000)
    calibration.observe("s", MODEL, 10_000 + 1_000, 11_000 + 1_300, reserved=10_000,
                        **_view(a))
    # A view that is mostly fixed part teaches one ratio for both.
    first = 1_000 * 12_300 / 11_000
    assert calibration.known("s", MODEL) == {101: pytest.approx(first)}
    # b and c are new: 2 000 + 3 000 counted, the provider says 6 500 more.
    calibration.observe("s", MODEL, 16_000, 11_000 + 1_300 + 6_500, reserved=10_000,
                        **_view(a, b, c))
    known = calibration.known("s", MODEL)
    assert known == {101: pytest.approx(first), 102: pytest.approx(2_600),
                     103: pytest.approx(3_900)}
    # A compacted view keeps a and c and adds d: d gets what is left.
    calibration.observe("s", MODEL, 14_500, 12_300 + 3_900 + 600, reserved=10_000,
                        **_view(a, c, (104, 500)))
    assert calibration.known("s", MODEL)[104] == pytest.approx(600)
    assert calibration.known("s", MODEL)[102] == pytest.approx(2_600)  # kept a while
    assert calibration.known("other", MODEL) == {}


def _view(*messages: tuple[int, int]) -> dict[str, list[int]]:
    return {"fingerprints": [p for p, _ in messages], "tokens": [t for _, t in messages]}


def test_messages_that_left_the_views_are_forgotten_in_time() -> None:
    """The counts stay bounded by the views: once many messages have gone, they are pruned."""
    calibration = Calibration()
    for start in range(0, 3_000, 100):
        view = [(start + n, 100) for n in range(100)]
        calibration.observe("s", MODEL, 20_000, 26_000, reserved=10_000, **_view(*view))
    assert len(calibration.known("s", MODEL)) <= 2 * 100 + 256 + 100


def test_a_view_whose_counts_do_not_match_its_messages_is_refused() -> None:
    """One count per fingerprint, or a ValueError (a caller's bug, never a wrong factor)."""
    calibration = Calibration()
    with pytest.raises(ValueError, match="2 fingerprints for 1 counts"):
        calibration.observe("s", MODEL, 16_000, 18_000, reserved=10_000,
                            fingerprints=[1, 2], tokens=[3_000])


def test_a_new_session_starts_from_its_own_tenants_fleet() -> None:
    """Sessions of tenant ``tB`` teach ratio 3.5; a new session of tenant ``tA`` still starts
    from what ``tA``'s sessions taught (or 1 when they taught nothing)."""
    calibration = Calibration()
    calibration.observe("tA/one", MODEL, 10_000, 11_000)
    assert calibration.factors("tA/new", MODEL) == (pytest.approx(1.1), pytest.approx(1.1))
    for index in range(60):
        calibration.observe(f"tB/s{index}", MODEL, 10_000, 35_000)
    assert calibration.factors("tA/new", MODEL) == (pytest.approx(1.1), pytest.approx(1.1))
    assert calibration.factors("tC/new", MODEL) == (1.0, 1.0)
    assert calibration.factor("tB/new", MODEL) == pytest.approx(3.5)
    assert calibration.factor("new", MODEL) == 1.0  # tenant none taught nothing


def test_a_window_is_per_tenant_and_grows_back() -> None:
    """A window learnt for tenant ``tB`` clamps ``tB``'s sessions only; it is forgotten after
    ``window_ttl_s``, or at once when the provider accepts a view larger than it."""
    now = [1000.0]
    calibration = Calibration(window_ttl_s=60, clock=lambda: now[0])
    calibration.learn_window("tB/s1", MODEL, 300)
    assert calibration.window("tB/s2", MODEL) == 300
    assert calibration.window("tA/s1", MODEL) is None
    assert calibration.window("s1", MODEL) is None
    now[0] += 59
    assert calibration.window("tB/s2", MODEL) == 300
    now[0] += 1
    assert calibration.window("tB/s2", MODEL) is None
    calibration.learn_window("tB/s1", MODEL, 300)
    calibration.observe("tB/s3", MODEL, 200, 280)  # within the window: kept
    assert calibration.window("tB/s2", MODEL) == 300
    calibration.observe("tB/s3", MODEL, 2_000, 2_400)  # accepted above it: forgotten
    assert calibration.window("tB/s2", MODEL) is None
