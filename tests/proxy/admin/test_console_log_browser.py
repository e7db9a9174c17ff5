"""The console as a request log, in a real browser (chromium, as in
``test_console_browser``): each request drawn against the limits it was judged by, cost and
cache columns with totals, a time range and a request-id search, the overview, the L4 summary's
text, a tool-protocol refusal's kind and id, and the landing page after login.

Each test drives the real proxy with the real SDK (the store is the proxy's SQLite file), then
reads the pages as a user sees them.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anthropic
import pytest

from proxy.audit.log import LayerSaving, RequestEntry
from proxy.fake_upstream.scripts import is_summarizer_request
from proxy.http.keys import SERVICES
from tests.conftest import (
    TEST_API_KEY,
    LoopThread,
    ProxyFactory,
    RunningProxy,
    UpstreamServer,
)
from tests.proxy.admin import test_console_browser as walkthrough
from tests.proxy.admin.test_console_browser import (
    CHROMIUM,
    MODEL,
    TOKEN,
    log_in,
    turns,
)

try:
    from playwright.sync_api import Browser, Page, sync_playwright
except ImportError:  # pragma: no cover - the skip below says so
    sync_playwright = None  # type: ignore[assignment]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(sync_playwright is None,
                       reason="the browser tests need playwright: pip install -e '.[test]'"),
    pytest.mark.skipif(not CHROMIUM.exists(),
                       reason="the browser tests need /usr/bin/chromium: apt-get install chromium"),
]

#: The walkthrough's fixtures: one chromium for the module, and screenshots.
browser = walkthrough.browser
shot = walkthrough.shot

SID = "request-log"
Shot = Callable[["Page", str], Path]


def client_for(proxy: RunningProxy, sid: str = SID) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0,
                               default_headers={"x-compact-session-id": sid})


def open_session(page: Page, proxy: RunningProxy, requests: int, sid: str = SID,
                 query: str = "") -> None:
    """Open the session's page until it lists ``requests`` requests (the audit log is
    written just after each response)."""
    deadline = time.monotonic() + 10
    while True:
        page.goto(f"{proxy.base_url}/admin/ui/tenants/none/sessions/{sid}{query}")
        if page.locator("#requests tbody tr.request").count() >= requests:
            return
        assert time.monotonic() < deadline, page.content()
        time.sleep(0.1)


def _y_on(path: str, x: float) -> float:
    """The y of a step path (``M x,y Hx L x,y Hx ...``) over ``x``."""
    for start, y, end in re.findall(r"[ML]([\d.]+),([\d.]+) H([\d.]+)", path):
        if float(start) <= x <= float(end):
            return float(y)
    raise AssertionError(f"{x} not on {path}")


def test_each_request_is_drawn_against_the_limits_it_was_judged_by(
        browser: Browser, proxy_factory: ProxyFactory, shot: Shot) -> None:
    """A request refused at hard 8,000 stays above its own hard line after the limits were
    raised to 40,000; on a chart made tall by a huge paste the soft and hard labels do not
    overlap."""
    small = {"soft_threshold_tokens": 3000, "hard_limit_tokens": 8000,
             "max_tool_result_tokens": 200, "keep_recent_messages": 4}
    first = proxy_factory({"compaction": small, "summary": {"enabled": False}},
                          admin_token=TOKEN)
    with client_for(first) as client, pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=64,
                               messages=turns(2, paste=" build log line" * 3000))
    store = {"path": str(first.state_dir / "state.db")}
    big = {**small, "soft_threshold_tokens": 24000, "hard_limit_tokens": 40000}
    later = proxy_factory({"compaction": big, "summary": {"enabled": False}, "store": store},
                          admin_token=TOKEN)
    with client_for(later) as client:
        client.messages.create(model=MODEL, max_tokens=64, messages=turns(2))
        with pytest.raises(anthropic.BadRequestError):
            client.messages.create(model=MODEL, max_tokens=64,
                                   messages=turns(2, paste=" pasted dump" * 250_000))
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    log_in(page, later)
    open_session(page, later, 3)
    chart = page.locator("svg.chart")
    hard_path = chart.locator("path.threshold.hard").get_attribute("d") or ""
    first_blocked = chart.locator("circle.dot.blocked").first
    assert first_blocked.get_attribute("data-hard") == "8000"
    x = float(first_blocked.get_attribute("cx") or 0)
    y = float(first_blocked.get_attribute("cy") or 0)
    assert y <= _y_on(hard_path, x)  # at or above its own hard line (y grows downwards)
    last_x = float(chart.locator("circle.dot").last.get_attribute("cx") or 0)
    assert _y_on(hard_path, last_x) < _y_on(hard_path, x)  # the later, higher limit
    assert chart.locator("text.threshold-label.hard").text_content() == "hard 40,000"
    soft_box = chart.locator("text.threshold-label.soft").bounding_box()
    hard_box = chart.locator("text.threshold-label.hard").bounding_box()
    assert soft_box is not None and hard_box is not None
    assert hard_box["y"] + hard_box["height"] <= soft_box["y"]  # apart, hard above
    shot(page, "limits-as-they-were")
    page.close()


def cached_turns(count: int) -> list[Any]:
    """:func:`turns` with a cache breakpoint on its last message (the provider caches it)."""
    messages = turns(count)
    last = messages[-1]
    last["content"] = [{"type": "text", "text": last["content"],
                        "cache_control": {"type": "ephemeral"}}]
    return messages


def _figure(text: str) -> int:
    return int(text.replace(",", ""))


def test_each_request_shows_its_cache_reads_writes_and_cost_with_totals(
        browser: Browser, proxy_factory: ProxyFactory, shot: Shot) -> None:
    """The provider's usage of each request (cache reads and writes too) and its cost at the
    model's list price, as the SDK saw them; the footer and the figures add them up; a model
    without a price shows no cost and is counted as unpriced."""
    proxy = proxy_factory({"summary": {"enabled": False}}, admin_token=TOKEN)
    usages = []
    with client_for(proxy) as client:
        for _ in range(2):  # the second reads what the first wrote
            usages.append(client.messages.create(model=MODEL, max_tokens=64,
                                                 messages=cached_turns(2)).usage)
        client.messages.create(model="claude-unpriced-9", max_tokens=64, messages=turns(1))
    assert usages[1].cache_read_input_tokens and usages[0].cache_creation_input_tokens
    page = browser.new_page(viewport={"width": 1600, "height": 900})
    log_in(page, proxy)
    open_session(page, proxy, 3)
    rows = page.locator("#requests tbody tr.request")  # newest first
    costs = []
    for index, usage in zip((2, 1), usages, strict=True):
        row = rows.nth(index)
        assert _figure(row.locator("td.cache-read").inner_text()) == usage.cache_read_input_tokens
        assert (_figure(row.locator("td.cache-write").inner_text())
                == usage.cache_creation_input_tokens)
        # claude-sonnet-4-5: $3 input, $3.75 cache write, $0.30 cache read, $15 output per M
        cost = (usage.input_tokens * 3 + usage.cache_creation_input_tokens * 3.75
                + usage.cache_read_input_tokens * 0.30 + usage.output_tokens * 15) / 1e6
        costs.append(cost)
        assert row.locator("td.cost").inner_text() == f"${cost:,.4f}"
    assert rows.nth(0).locator("td.cost").inner_text() == "—"  # no price for that model
    footer = page.locator("#requests tfoot tr.totals")
    assert _figure(footer.locator("td.cache-read").inner_text()) == sum(
        u.cache_read_input_tokens or 0 for u in usages)
    assert footer.locator("td.cost").inner_text() == f"${sum(costs):,.4f}"
    figures = page.locator("section.figures").inner_text()
    assert f"${sum(costs):,.4f}" in figures and "1 unpriced" in figures
    shot(page, "costs-and-cache")
    page.close()


def test_a_tool_protocol_refusal_shows_its_kind_and_id(
        browser: Browser, proxy_factory: ProxyFactory, shot: Shot) -> None:
    """A history whose ``tool_use`` is never answered is refused as the client's mistake
    (outcome ``invalid``, not a limit: it is not among the blocked); its row names the rule
    (``missing``) and the ``tool_use_id``."""
    proxy = proxy_factory(admin_token=TOKEN)
    messages: list[Any] = [{"role": "user", "content": "run it"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_lost01", "name": "Bash",
                     "input": {"command": "ls"}}]},
                {"role": "user", "content": "and?"}]
    with client_for(proxy) as client, pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=64, messages=messages)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    log_in(page, proxy)
    open_session(page, proxy, 1)
    assert page.locator("#blocked td.reason").count() == 0
    row = page.locator("#requests tbody tr.request").first
    assert row.locator(".protocol").inner_text() == "missing toolu_lost01"
    assert "invalid" in row.inner_text()
    shot(page, "tool-protocol")
    page.close()


SUMMARY_POLICY = {"soft_threshold_tokens": 3000, "hard_limit_tokens": 60000,
                  "max_tool_result_tokens": 2000, "keep_recent_messages": 40,
                  "summary_keep_recent": 4}


def test_the_l4_summary_is_readable_from_its_request(
        browser: Browser, proxy_factory: ProxyFactory, upstream_server: UpstreamServer,
        shot: Shot) -> None:
    """A request L4 compacted links from its row to the summary's text: the very text the
    provider was sent in the forwarded view (read from the summary cache by its key, which
    is all the audit record keeps)."""
    proxy = proxy_factory({"compaction": SUMMARY_POLICY, "summary": {"mode": "separate"}},
                          admin_token=TOKEN)
    with client_for(proxy) as client:
        raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=64,
                                                       messages=turns(12))
    assert "L4" in raw.headers["x-compact-layers"].split(",")
    request_id = raw.headers["x-compact-request-id"]
    forwarded = json.dumps([r.body["messages"] for r in upstream_server.upstream.message_requests
                            if not is_summarizer_request(r.body)], ensure_ascii=False)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    log_in(page, proxy)
    open_session(page, proxy, 1)
    row = page.locator(f"tr#request-{request_id}")
    row.locator("a.summary-link").click()
    page.wait_for_url(f"**#summary-{request_id}")
    text = page.locator(f"#summary-{request_id} blockquote.summary-text").inner_text()
    assert len(text) > 20
    assert json.dumps(text, ensure_ascii=False)[1:-1] in forwarded
    shot(page, "l4-summary")
    page.close()


def _utc_now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def test_a_time_range_and_a_request_id_find_requests(
        browser: Browser, proxy_factory: ProxyFactory, shot: Shot) -> None:
    """On a session's page ``from``/``to`` keep the requests on either side of a moment; on
    the request log (every session) a request id, whole or in part, finds that request and
    links to it in its session."""
    proxy = proxy_factory({"summary": {"enabled": False}}, admin_token=TOKEN)
    with client_for(proxy) as client:
        early = client.messages.with_raw_response.create(model=MODEL, max_tokens=64,
                                                         messages=turns(1))
        time.sleep(1.1)
        moment = _utc_now_text()
        time.sleep(1.1)
        late = client.messages.with_raw_response.create(model=MODEL, max_tokens=64,
                                                        messages=turns(2))
        client.messages.create(model=MODEL, max_tokens=64, messages=turns(1),
                               extra_headers={"x-compact-session-id": "another"})
    early_id, late_id = (raw.headers["x-compact-request-id"] for raw in (early, late))
    page = browser.new_page(viewport={"width": 1600, "height": 900})
    log_in(page, proxy)
    open_session(page, proxy, 2)

    def listed() -> list[str]:
        return [row.get_attribute("id") or "" for row in
                page.locator("#requests tbody tr.request").all()]

    page.fill("#range-from", moment)
    page.click("#range button[type=submit]")
    page.wait_for_url("**from=**")
    assert listed() == [f"request-{late_id}"]
    assert page.locator("#matched").inner_text().startswith("1 of 2 requests match")
    page.fill("#range-from", "")
    page.fill("#range-to", moment)
    page.click("#range button[type=submit]")
    page.wait_for_url("**to=**")
    assert listed() == [f"request-{early_id}"]
    shot(page, "session-time-range")

    page.goto(f"{proxy.base_url}/admin/ui/requests")
    assert page.locator("#request-log tbody tr.request").count() == 3  # both sessions
    page.fill("#rid", late_id[4:16])  # a part of it
    page.click("#range button[type=submit]")
    page.wait_for_url("**rid=**")
    rows = page.locator("#request-log tbody tr.request")
    assert rows.count() == 1 and rows.first.get_attribute("data-id") == late_id
    shot(page, "request-id-search")
    rows.first.locator(f"a:has-text('{late_id}')").click()
    page.wait_for_url(f"**/sessions/{SID}?rid={late_id}#request-{late_id}")
    assert listed() == [f"request-{late_id}"]
    page.goto(f"{proxy.base_url}/admin/ui/requests?from=yesterday")
    assert "from: not a time" in page.locator("#range-problem").inner_text()
    page.close()


def test_the_overview_adds_up_requests_savings_cost_cache_and_outcomes(
        browser: Browser, proxy_factory: ProxyFactory, shot: Shot) -> None:
    """The overview's figures are the sums of what the SDK saw: requests, sessions, tokens
    saved, cost at the list price, the share of input read from the cache, the outcomes;
    its trend table adds up to the same requests."""
    small = {"soft_threshold_tokens": 3000, "hard_limit_tokens": 8000,
             "max_tool_result_tokens": 200, "keep_recent_messages": 4}
    proxy = proxy_factory({"compaction": small, "summary": {"enabled": False}},
                          admin_token=TOKEN)
    raws = []
    with client_for(proxy) as client:
        for count in (2, 5):
            raws.append(client.messages.with_raw_response.create(
                model=MODEL, max_tokens=64, messages=cached_turns(count)))
        raws.append(client.messages.with_raw_response.create(
            model=MODEL, max_tokens=64, messages=cached_turns(5),
            extra_headers={"x-compact-session-id": "another"}))
        with pytest.raises(anthropic.BadRequestError):
            client.messages.create(model=MODEL, max_tokens=64,
                                   messages=turns(8, paste=" build log line" * 3000))
    usages = [raw.parse().usage for raw in raws]
    saved = sum(int(raw.headers["x-compact-tokens-before"])
                - int(raw.headers["x-compact-tokens-after"]) for raw in raws)
    assert saved > 0
    cost = sum((u.input_tokens * 3 + (u.cache_creation_input_tokens or 0) * 3.75
                + (u.cache_read_input_tokens or 0) * 0.30 + u.output_tokens * 15) / 1e6
               for u in usages)
    read = sum(u.cache_read_input_tokens or 0 for u in usages)
    prompt = read + sum(u.input_tokens + (u.cache_creation_input_tokens or 0) for u in usages)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    log_in(page, proxy)
    open_session(page, proxy, 3)  # the audit log has them
    page.goto(f"{proxy.base_url}/admin/ui/overview")

    def figure(name: str) -> str:
        return page.locator(f"#totals .figure[data-name={name}]").inner_text()

    assert figure("requests") == "4" and figure("sessions") == "2"
    assert figure("blocked") == "1"
    # The blocked request's own before/after count too: it was compacted before refused.
    assert _figure(figure("saved")) >= saved
    assert figure("cost") == f"${cost:,.4f}"
    assert figure("cache-share") == f"{read / prompt * 100:.1f} %"
    outcomes = {row.get_attribute("data-outcome"): row.locator("td").nth(1).inner_text()
                for row in page.locator("#outcomes tbody tr[data-outcome]").all()}
    assert outcomes == {"forwarded": "3", "blocked": "1"}
    trend_rows = page.locator("#trend-table tbody tr").all()
    assert sum(int(row.locator("td").nth(1).inner_text()) for row in trend_rows) == 4
    assert page.locator("svg.trend rect.bar.after").count() >= 1
    shot(page, "overview")
    page.goto(f"{proxy.base_url}/admin/ui/overview?to=2000-01-01T00:00")
    assert figure("requests") == "0"
    page.close()


def test_logging_in_lands_on_the_sessions_page(
        browser: Browser, proxy_factory: ProxyFactory, shot: Shot) -> None:
    """From the login page, however it was reached — typed, after a wrong token, with a
    second login tab opened meanwhile, or after logging out — the right token lands on the
    sessions page (``/admin/ui/``), not on ``/admin/ui/login``."""
    proxy = proxy_factory(admin_token=TOKEN)
    home = f"{proxy.base_url}/admin/ui/"
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()

    def submit(tab: Page, token: str) -> None:
        tab.fill("input[name=token]", token)
        with tab.expect_navigation():
            tab.click("form[action='/admin/ui/login'] button[type=submit]")

    page.goto(f"{proxy.base_url}/admin/ui/login")
    other = context.new_page()  # a second tab on the login page, opened after the first
    other.goto(f"{proxy.base_url}/admin/ui/login")
    submit(page, "not the token")
    assert page.locator("p.error").inner_text() == "Wrong admin token."
    submit(page, TOKEN)
    assert page.url == home and page.locator("h1").inner_text() == "Sessions"
    page.click("button:has-text('Log out')")
    page.wait_for_url("**/admin/ui/login")
    submit(other, TOKEN)  # the older tab's form still logs in
    assert other.url == home and other.locator("h1").inner_text() == "Sessions"
    shot(other, "sessions")
    context.close()


def test_an_invalid_request_shows_as_its_own_outcome(
        browser: Browser, servers: LoopThread, proxy_factory: ProxyFactory,
        shot: Shot) -> None:
    """A record whose outcome is ``invalid`` (a client's mistake, not a limit refusal) is
    marked as such: not among the blocked requests, counted apart on the session's page and
    in the overview; a layer that ran and saved nothing reads ``L1 0``."""
    proxy = proxy_factory(admin_token=TOKEN)
    with client_for(proxy) as client:
        client.messages.create(model=MODEL, max_tokens=64, messages=turns(1))
    assert proxy.app is not None
    log = proxy.app[SERVICES].backend
    mistake = RequestEntry(at=datetime.now(UTC), request_id="0badc0ffee0badc0ffee0bad",
                           session_id=SID, tenant="none", route="messages", model=MODEL,
                           tokens_before=900, tokens_after=900,
                           layers=(LayerSaving("L1", 0),), outcome="invalid",
                           reason="invalid_messages", status=400)

    async def add() -> None:  # (on the proxy's loop, as its own writes are)
        await log.add_request(mistake)

    servers.run(add())
    page = browser.new_page(viewport={"width": 1600, "height": 900})
    log_in(page, proxy)
    open_session(page, proxy, 2)
    row = page.locator("tr#request-0badc0ffee0badc0ffee0bad")
    assert "invalid-row" in (row.get_attribute("class") or "")
    assert row.locator("td.outcome.warn").inner_text() == "invalid (invalid_messages)"
    assert row.locator(".layer").inner_text() == "L1 0"
    assert page.locator("#blocked tbody tr").count() == 0
    assert page.locator("#invalid-count").inner_text() == "1"
    page.goto(f"{proxy.base_url}/admin/ui/overview")
    assert page.locator("#totals .figure[data-name=invalid]").inner_text() == "1"
    assert page.locator("#totals .figure[data-name=blocked]").inner_text() == "0"
    assert page.locator("#outcomes tr[data-outcome=invalid] td.warn").count() == 1
    shot(page, "invalid-outcome")
    page.close()
