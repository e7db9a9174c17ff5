"""``AcceptedCallers``: which credentials the provider has accepted, against the real fake
provider (it knows one caller's key)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import anthropic
import pytest

from proxy.summary.caller_checks import AcceptedCallers
from proxy.summary.summarizer import CallerCredentials
from tests.conftest import UpstreamServer

KNOWN = CallerCredentials(x_api_key="sk-ant-known")
STRANGER = CallerCredentials(x_api_key="sk-ant-made-up")
OPERATOR_KEY = "sk-ant-operator"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def client(upstream_server: UpstreamServer) -> AsyncIterator[anthropic.AsyncAnthropic]:
    """The summary client (the operator's key) in front of a provider that knows the
    operator and :data:`KNOWN`."""
    upstream_server.upstream.accepted_keys = frozenset({OPERATOR_KEY, "sk-ant-known"})
    sdk = anthropic.AsyncAnthropic(api_key=OPERATOR_KEY, base_url=upstream_server.base_url,
                                   max_retries=0)
    try:
        yield sdk
    finally:
        await sdk.close()


def checks(upstream_server: UpstreamServer) -> list[str]:
    """The credentials the checks were made with, in order."""
    return [r.api_key for r in upstream_server.upstream.requests if r.path == "/v1/models"]


async def test_a_check_uses_the_callers_credential_only(
        client: anthropic.AsyncAnthropic, upstream_server: UpstreamServer) -> None:
    callers = AcceptedCallers(client)
    assert await callers.accepted(KNOWN)
    assert not await callers.accepted(STRANGER)
    assert not await callers.accepted(CallerCredentials())  # no credential: no call at all
    assert checks(upstream_server) == ["sk-ant-known", "sk-ant-made-up"]
    assert await callers.accepted(KNOWN)  # remembered
    assert len(checks(upstream_server)) == 2
    bearer = CallerCredentials(authorization="Bearer sk-ant-known")
    assert await callers.accepted(bearer)
    sent = upstream_server.upstream.requests[-1].headers
    assert sent["authorization"] == "Bearer sk-ant-known" and "x-api-key" not in sent


async def test_answers_accept_and_refusals_forget(
        client: anthropic.AsyncAnthropic, upstream_server: UpstreamServer) -> None:
    callers = AcceptedCallers(client)
    callers.answered(STRANGER, 200)
    assert await callers.accepted(STRANGER)  # (the provider answered it: no check)
    callers.answered(STRANGER, 401)
    assert not await callers.accepted(STRANGER)  # checked again: refused
    callers.answered(KNOWN, 500)  # says nothing of the credential
    callers.answered(KNOWN, None)
    assert checks(upstream_server) == ["sk-ant-made-up"]


async def test_an_acceptance_expires_and_the_oldest_go_first(
        client: anthropic.AsyncAnthropic, upstream_server: UpstreamServer) -> None:
    clock = Clock()
    callers = AcceptedCallers(client, max_entries=2, ttl_s=60, timer=clock)
    callers.answered(KNOWN, 200)
    clock.now = 61
    assert await callers.accepted(KNOWN)  # expired: checked again
    assert checks(upstream_server) == ["sk-ant-known"]
    for index in range(2):
        callers.answered(CallerCredentials(x_api_key=f"other-{index}"), 200)
    assert await callers.accepted(KNOWN)  # pushed out by two newer ones: checked again
    assert len(checks(upstream_server)) == 2


async def test_concurrent_checks_of_one_credential_are_one_call(
        client: anthropic.AsyncAnthropic, upstream_server: UpstreamServer) -> None:
    callers = AcceptedCallers(client)
    answers = await asyncio.gather(*(callers.accepted(STRANGER) for _ in range(8)))
    assert answers == [False] * 8
    assert checks(upstream_server) == ["sk-ant-made-up"]


def test_the_credential_is_kept_only_as_a_keyed_digest() -> None:
    callers = AcceptedCallers(anthropic.AsyncAnthropic(api_key="x"))
    callers.answered(KNOWN, 200)
    other = AcceptedCallers(anthropic.AsyncAnthropic(api_key="x"))
    held = list(callers._accepted)
    assert held and "sk-ant-known" not in repr(held)
    assert other._digest(KNOWN) != held[0]  # a per-process key: no digest to look up
