"""The per-tenant in-flight count (proxy.http.limits.TenantLimiter)."""

from __future__ import annotations

import pytest

from proxy.http.limits import TenantLimiter


def test_each_tenant_has_its_own_limit_and_gets_its_slots_back() -> None:
    limiter = TenantLimiter(2)
    assert limiter.enter("a") and limiter.enter("a")
    assert not limiter.enter("a")  # full: nothing counted
    assert limiter.in_flight("a") == 2
    assert limiter.enter("b")  # another tenant is not affected
    limiter.leave("a")
    assert limiter.enter("a")
    for tenant in ("a", "a", "b"):
        limiter.leave(tenant)
    assert limiter.in_flight("a") == limiter.in_flight("b") == 0
    assert not limiter._in_flight  # noqa: SLF001 - a tenant with none left is forgotten


@pytest.mark.parametrize("bad", [0, -1])
def test_a_limit_below_one_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        TenantLimiter(bad)
