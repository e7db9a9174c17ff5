"""The audit console in a real browser (Debian's chromium, driven by playwright), after a
demo-like run through the real proxy: a compacted session, a request blocked over the hard
limit, and a durable state with one available and one missing source.

Every page is saved as a screenshot under the test's tmp dir and copied to
``/tmp/console-shots/`` so it can be looked at. Skipped, saying why, only when chromium or
playwright is missing (``.ci/run`` installs both).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import pytest

from tests.conftest import (
    TEST_API_KEY,
    LoopThread,
    ProxyFactory,
    RunningProxy,
    UpstreamServer,
    user_text,
)

try:
    from playwright.sync_api import Browser, Page, sync_playwright
except ImportError:  # pragma: no cover - the skip below says so
    sync_playwright = None  # type: ignore[assignment]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
SHOTS = Path("/tmp/console-shots")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(sync_playwright is None,
                       reason="the browser tests need playwright: pip install -e '.[test]'"),
    pytest.mark.skipif(not CHROMIUM.exists(),
                       reason="the browser tests need /usr/bin/chromium: apt-get install chromium"),
]

TOKEN = "console-e2e-token-8c2f4a9d1e3b5c7f9a0d"
SID = "console-demo"
OTHER_SID = "review-bot"
MODEL = "claude-sonnet-4-5"
THRESHOLDS = {"soft_threshold_tokens": 3000, "hard_limit_tokens": 8000,
              "max_tool_result_tokens": 200, "keep_recent_messages": 4,
              "summary_keep_recent": 4}
TRANSCRIPT_TEXT = "Keep the public parse_* names unchanged."
XSS = "<img src=x onerror=\"document.title='pwned';window.__xss=1\">"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless chromium for the module (never downloaded: Debian's own)."""
    assert sync_playwright is not None
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def shot(tmp_path: Path) -> Callable[[Page, str], Path]:
    """``shot(page, name)`` saves a full-page screenshot (tmp dir and /tmp/console-shots)."""
    folder = tmp_path / "screenshots"
    folder.mkdir()
    SHOTS.mkdir(exist_ok=True)

    def take(page: Page, name: str) -> Path:
        path = folder / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        shutil.copy(path, SHOTS / path.name)
        return path

    return take


def turns(count: int, *, paste: str = "") -> list[Any]:
    """A user prompt, ``count`` Read calls with 3 000-character results, then a question
    (carrying ``paste`` when given)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": user_text("fix the parser")}]
    for index in range(count):
        tool_id = f"toolu_{index:04d}"
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Reading file {index}."},
            {"type": "tool_use", "id": tool_id, "name": "Read",
             "input": {"file_path": f"/src/mod{index}.py"}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_id,
             "content": f"# module {index}\n" + "line of code\n" * 230}]})
    messages.append({"role": "assistant", "content": "I have read them."})
    messages.append({"role": "user", "content": user_text("now what?") + paste})
    return messages


def put_state(servers: LoopThread, proxy: RunningProxy, state: dict[str, Any],
              version: int | None = None) -> None:
    """Write the session's state through the admin API."""
    async def put() -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        if version is not None:
            headers["If-Match"] = f'"{version}"'
        async with aiohttp.ClientSession() as http, http.put(
                f"{proxy.base_url}/admin/sessions/{SID}/state", json=state,
                headers=headers) as resp:
            assert resp.status in (200, 201), await resp.text()

    servers.run(put())


@pytest.fixture
def demo(servers: LoopThread, proxy_factory: ProxyFactory,
         upstream_server: UpstreamServer) -> RunningProxy:
    """The proxy after the demo-like run: state first, then three growing requests (the
    later ones compacted), then one blocked over the hard limit."""
    proxy = proxy_factory({"compaction": THRESHOLDS, "summary": {"enabled": False}},
                          admin_token=TOKEN)
    event = {"sequence": 1, "session_id": SID, "event_id": "evt-1",
             "type": "user_decision", "text": TRANSCRIPT_TEXT}
    (proxy.transcript_root / f"{SID}.jsonl").write_text(json.dumps(event) + "\n")
    put_state(servers, proxy, {
        "facts": [{"fact_id": "keep-api", "content": "The public parse_* names must not change.",
                   "source_pointer": f"transcript:{SID}:1",
                   "last_confirmed_at": "2026-12-01T09:00:00Z"}],
        "pending_items": [{"item_id": "changelog", "description": "Add a changelog entry.",
                           "source_pointer": f"transcript:{SID}:2",
                           "last_confirmed_at": "2026-12-01T09:05:00Z"}]})
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0,
                                 default_headers={"x-compact-session-id": SID})
    with client:
        layers = []
        for count in (2, 5, 8):
            raw = client.messages.with_raw_response.create(
                model=MODEL, max_tokens=256, messages=turns(count))
            layers.append(raw.headers["x-compact-layers"])
        assert layers[0] == "" and "L1" in layers[-1]  # the later requests were compacted
        with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
            client.messages.create(model=MODEL, max_tokens=256,
                                   messages=turns(8, paste=" build log line" * 3000))
        # Another session, seen last: first by last seen, second by blocked.
        client.messages.create(model=MODEL, max_tokens=256, messages=turns(1),
                               extra_headers={"x-compact-session-id": OTHER_SID})
    return proxy


def log_in(page: Page, proxy: RunningProxy) -> None:
    """Open the console (the login form comes first) and log in."""
    page.goto(f"{proxy.base_url}/admin/ui/")
    assert "/admin/ui/login" in page.url
    page.fill("input[name=token]", TOKEN)
    page.click("form[action='/admin/ui/login'] button[type=submit]")
    page.wait_for_selector("h1:text('Sessions')")


def session_rows(page: Page) -> list[list[str]]:
    """The sessions table's cells, row by row."""
    return [[cell.inner_text() for cell in row.locator("td").all()]
            for row in page.locator("#sessions tbody tr").all()]


def wait_for_sessions(page: Page, proxy: RunningProxy) -> None:
    """Reload the sessions page until both sessions are there and the demo's shows its
    blocked request (the audit log is written just after each response)."""
    deadline = time.monotonic() + 10
    while True:
        page.goto(f"{proxy.base_url}/admin/ui/")
        rows = {row[0]: row for row in session_rows(page) if len(row) == 8}
        if OTHER_SID in rows and SID in rows and rows[SID][7] == "1":
            return
        assert time.monotonic() < deadline, page.content()
        time.sleep(0.1)


def fact_form(page: Page, fact_id: str) -> Any:
    """The edit form of fact ``fact_id`` (its ``details`` opened)."""
    details = page.locator("details", has=page.locator("summary code", has_text=fact_id))
    if details.get_attribute("open") is None:
        details.locator("summary").click()
    return details.locator("form")


def system_text(upstream_server: UpstreamServer) -> str:
    """The ``system`` of the last request the provider got, as text."""
    return json.dumps(upstream_server.upstream.message_requests[-1].body["system"])


def test_console_walkthrough(browser: Browser, demo: RunningProxy,
                             upstream_server: UpstreamServer,
                             shot: Callable[[Page, str], Path]) -> None:
    """Log in, find the session, see its chart, its blocked request and both source
    statuses; edit a fact and see it in the next forwarded ``system``; a stale edit shows the
    conflict."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(f"{demo.base_url}/admin/ui/tenants/none/sessions/{SID}")
    assert "/admin/ui/login?next=" in page.url
    assert page.locator("input[name=token][type=password]").count() == 1
    shot(page, "01-login")
    page.fill("input[name=token]", TOKEN)
    page.click("form[action='/admin/ui/login'] button[type=submit]")
    page.wait_for_selector("h1:has-text('Session')")  # back where it was asked for
    assert TOKEN not in page.url and TOKEN not in page.content()
    cookie = next(c for c in context.cookies() if c["name"] == "compact_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and TOKEN not in cookie["value"]

    # The sessions table: newest first; sorted by blocked; filtered by id.
    wait_for_sessions(page, demo)
    assert [row[0] for row in session_rows(page)] == [OTHER_SID, SID]
    shot(page, "02-sessions")
    page.select_option("#sort", "blocked")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**sort=blocked**")
    assert [row[0] for row in session_rows(page)] == [SID, OTHER_SID]
    page.fill("#q", "console-de")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**q=console-de**")
    rows = session_rows(page)
    assert len(rows) == 1
    cells = rows[0]
    assert cells[0] == SID and cells[1] == "none" and int(cells[3]) == 4
    assert int(cells[4].replace(",", "")) > int(cells[5].replace(",", "")) > 0
    assert cells[6].endswith("%") and cells[7] == "1"
    shot(page, "03-sessions-filtered")

    # The session's page.
    page.get_by_role("link", name=SID).click()
    page.wait_for_selector("#session-id")
    assert page.locator("#session-id").inner_text() == SID
    chart = page.locator("svg.chart")
    assert chart.is_visible()
    assert chart.locator("path.series.before").get_attribute("d")
    assert chart.locator("path.series.after").get_attribute("d")
    assert chart.locator("path.threshold.soft").count() == 1
    assert chart.locator("text.threshold-label.soft").text_content() == "soft 3,000"
    assert chart.locator("text.threshold-label.hard").text_content() == "hard 8,000"
    assert chart.locator("circle.dot.blocked").count() == 1
    blocked = page.locator("#blocked tbody tr")
    assert blocked.count() == 1
    assert blocked.locator("td.reason").inner_text() == "MessageViewLimitExceeded"
    figures = [cell.inner_text() for cell in blocked.locator("td").all()]
    assert int(figures[4].replace(",", "")) > 8000 and figures[5] == "8,000"
    assert "L1" in page.locator("#requests").inner_text()
    fact = page.locator("tr.fact[data-id='keep-api']")
    assert fact.locator(".badge.status-available").inner_text() == "available"
    assert fact.locator("blockquote.excerpt").inner_text() == TRANSCRIPT_TEXT
    pending = page.locator("tr.pending[data-id='changelog']")
    assert pending.locator(".badge.status-missing").inner_text() == "missing"
    assert pending.locator("blockquote.excerpt").count() == 0
    shot(page, "04-session")

    # Edit the fact; the next forwarded request carries it.
    form = fact_form(page, "keep-api")
    form.locator("textarea[name=content]").fill("Rename nothing public: parse_* stays.")
    form.locator("button[type=submit]").click()
    page.wait_for_selector("p.ok:has-text('Fact saved.')")
    assert "Rename nothing public" in page.locator("tr.fact[data-id='keep-api']").inner_text()
    client = anthropic.Anthropic(base_url=demo.base_url, api_key=TEST_API_KEY, max_retries=0,
                                 default_headers={"x-compact-session-id": SID})
    with client:
        client.messages.create(model=MODEL, max_tokens=256, messages=turns(1))
    assert "Rename nothing public: parse_* stays." in system_text(upstream_server)
    assert "console" in page.locator("#changes").inner_text()

    # Set the pending item's status.
    pending = page.locator("tr.pending[data-id='changelog']")
    pending.locator("select[name=status]").select_option("done")
    pending.locator(".status-form button").click()
    page.wait_for_selector("p.ok:has-text('Status set.')")
    assert page.locator("tr.pending[data-id='changelog'] .badge.pending-done").count() == 1
    shot(page, "05-edited")

    # A stale edit: a second tab loaded the page, then this one changed the state.
    stale = context.new_page()
    stale.goto(page.url)
    stale_form = fact_form(stale, "keep-api")
    stale_form.locator("textarea[name=content]").fill("An edit from a stale page.")
    form = fact_form(page, "keep-api")
    form.locator("textarea[name=content]").fill("The newest edit wins.")
    form.locator("button[type=submit]").click()
    page.wait_for_selector("p.ok:has-text('Fact saved.')")
    with stale.expect_response(lambda r: r.request.method == "POST") as answer:
        stale_form.locator("button[type=submit]").click()
    assert answer.value.status == 409
    stale.wait_for_selector("#conflict")
    assert "Changed since you loaded it" in stale.locator("#conflict").inner_text()
    assert "The newest edit wins." in stale.locator("tr.fact[data-id='keep-api']").inner_text()
    shot(stale, "06-conflict")

    # A bad value names its field.
    stale.locator("details.add summary").first.click()
    add = stale.locator("#add-fact")
    add.locator("input[name=fact_id]").fill("when")
    add.locator("textarea[name=content]").fill("a fact")
    add.locator("input[name=source_pointer]").fill(f"transcript:{SID}:1")
    add.locator("input[name=last_confirmed_at]").fill("yesterday")
    with stale.expect_response(lambda r: r.request.method == "POST") as answer:
        add.locator("button[type=submit]").click()
    assert answer.value.status == 400
    assert "last_confirmed_at" in stale.locator("#invalid").inner_text()
    assert stale.locator("#add-fact input[name=last_confirmed_at][aria-invalid=true]").count() == 1
    shot(stale, "07-invalid")
    context.close()


def test_a_fact_holding_html_never_runs_script(browser: Browser, servers: LoopThread,
                                               proxy_factory: ProxyFactory,
                                               shot: Callable[[Page, str], Path]) -> None:
    """A fact whose content is an ``<img onerror>`` shows as text, added through the admin
    API or through the console's own form; its handler never runs."""
    proxy = proxy_factory(admin_token=TOKEN)
    put_state(servers, proxy, {"facts": [{"fact_id": "html", "content": XSS,
                                          "source_pointer": f"transcript:{SID}:1",
                                          "last_confirmed_at": "2026-12-01T09:00:00Z"}]})
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    log_in(page, proxy)
    page.goto(f"{proxy.base_url}/admin/ui/tenants/none/sessions/{SID}")
    page.locator("details.add summary").first.click()
    add = page.locator("#add-fact")
    add.locator("input[name=fact_id]").fill("<b>bold</b>")
    add.locator("textarea[name=content]").fill(XSS.replace("__xss", "__xss2"))
    add.locator("input[name=source_pointer]").fill(f"transcript:{SID}:1")
    add.locator("button[type=submit]").click()
    page.wait_for_selector("p.ok:has-text('Fact added.')")
    page.wait_for_load_state("load")
    assert page.evaluate("window.__xss") is None and page.evaluate("window.__xss2") is None
    assert page.title() != "pwned"
    assert page.locator("tr.fact[data-id='html'] .content").inner_text() == XSS
    assert page.locator("tr.fact img, #state img, #state b").count() == 0
    assert page.locator("tr.fact[data-id='<b>bold</b>'] code").first.inner_text() == "<b>bold</b>"
    shot(page, "08-html-as-text")
    context.close()
