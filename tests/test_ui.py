"""The memory inspector (`GET /ui`) in a real browser: Debian's Chromium, headless, driven by
Playwright against a daemon served over loopback, its data seeded through the public API.

The page is read-only and shows hostile text (whatever users said): the tests check that it
renders every piece of it as text, under the daemon's Content-Security-Policy, with the token kept
in the tab's sessionStorage and sent as a bearer header, and that a tenant's token sees nothing of
another tenant's. One browser serves the whole run; each test gets a fresh context (no storage
carried over) and page. UI_SCREENSHOTS_DIR, when set, receives full-page PNGs of three views.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Dialog, Locator, Page, ViewportSize, async_playwright, expect

from tests.helpers.daemon import Daemon, TextWorkers, new_sid
from tests.helpers.servers import backend_environment
from tests.helpers.skips import required_tool

# The browser and every daemon of this module live on the run's one event loop: Playwright's
# connection to the browser is bound to the loop that opened it.
pytestmark = pytest.mark.asyncio(loop_scope="session")

ADMIN = "admin-token-0123456789abcdef"
ACME = "acme-token-0123456789abcdef"
GLOBEX = "globex-token-0123456789abcdef"
TOKEN_KEY = "tiered-memory-token"
VIEWPORT: ViewportSize = {"width": 1280, "height": 900}
# Playwright's wait for an element, a text or an action (the page's fetches answer well within
# it; summaries are made before the page is opened).
WAIT_MS = 10_000

# Nine turns: at SUMMARY_EVERY_N_TURNS=3 the session gets three summary versions, each adding the
# facts of its three new turns, and three slices.
EN_TURNS = [
    ("Hi, I'm Alice and I'd like to know about the X200 earbuds.", "Hello Alice! The X200 are wireless earbuds."),
    ("How much do they cost?", "The X200 cost $129, in black or white."),
    ("I prefer something light. How heavy are they?", "Each earbud weighs 4.5 grams."),
    ("What about the battery?", "The battery lasts 30 hours with the charging case."),
    ("Do they cancel noise?", "Yes, the X200 have active noise cancelling with three modes."),
    ("Can I use them while running?", "They are rated IPX5, so sweat and rain are fine."),
    ("My order number is QX-5521, when will it ship?", "Order QX-5521 ships tomorrow from the Hamburg depot."),
    ("Can it go to my office in Lyon instead?", "Yes, QX-5521 will now go to your office in Lyon."),
    ("Great, thanks for the help.", "You're welcome, Alice. Enjoy the X200!"),
]
HOSTILE = [
    '<img src=x onerror="window.__pwned=1">',
    "<script>window.__pwned=2</script>",
    "</title><b>bold</b>",
]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def chromium() -> AsyncIterator[Browser]:
    """Debian's Chromium (no browser download: .ci/run installs the package), headless; no
    sandbox, as CI runs as root."""
    executable = required_tool("chromium", "Debian package chromium")
    expect.set_options(timeout=WAIT_MS)
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=executable, headless=True, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            await browser.close()


async def _started(env: dict[str, str], text_workers: TextWorkers) -> Daemon:
    """A daemon with an unrestricted token and two tenants' tokens, the inspector on; its helpers
    speak as `acme`."""
    env = env | {"API_TOKENS": f"{ADMIN}, acme:{ACME}, globex:{GLOBEX}", "UI_ENABLED": "true"}
    d = Daemon(env, text_workers, headers=bearer(ACME))
    await d.start()
    return d


@pytest_asyncio.fixture(loop_scope="session")
async def daemon(request: pytest.FixtureRequest, tmp_path: Path, text_workers: TextWorkers) -> AsyncIterator[Daemon]:
    """The inspector's daemon on the embedded default."""
    d = await _started(backend_environment("embedded", request, tmp_path), text_workers)
    yield d
    await d.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def any_daemon(backend_env: dict[str, str], text_workers: TextWorkers) -> AsyncIterator[Daemon]:
    """The inspector's daemon on the embedded default and on real Redis + MariaDB."""
    d = await _started(backend_env, text_workers)
    yield d
    await d.stop()


@dataclass
class Ui:
    """A fresh browser context's page, and what it reported while the test ran."""

    page: Page
    console: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        """No script error, no dialog, no Content-Security-Policy violation."""
        assert self.errors == []
        assert self.dialogs == []
        assert [m for m in self.console if "Content Security Policy" in m] == []


@pytest_asyncio.fixture(loop_scope="session")
async def ui(chromium: Browser) -> AsyncIterator[Ui]:
    """A page of a context of its own (empty storage) in the run's browser, 1280×900."""
    context = await chromium.new_context(viewport=VIEWPORT)
    page = await context.new_page()
    page.set_default_timeout(WAIT_MS)
    seen = Ui(page)
    page.on("console", lambda message: seen.console.append(message.text))
    page.on("pageerror", lambda error: seen.errors.append(str(error)))

    async def dismiss(dialog: Dialog) -> None:
        seen.dialogs.append(dialog.message)
        await dialog.dismiss()

    page.on("dialog", dismiss)
    yield seen
    await context.close()


def url(d: Daemon, path: str) -> str:
    return str(d.http.make_url(path))


async def open_inspector(ui: Ui, d: Daemon, token: str) -> None:
    """The page, served whole, with `token` entered."""
    page = ui.page
    response = await page.goto(url(d, "/ui"))
    assert response is not None
    assert response.status == 200, await response.text()
    await page.get_by_test_id("token-input").fill(token)
    await page.get_by_test_id("token-save").click()
    await expect(page.get_by_test_id("token-status")).to_have_text("token set for this tab")


async def open_session(ui: Ui, sid: str) -> None:
    page = ui.page
    await page.get_by_test_id("session-input").fill(sid)
    await page.get_by_test_id("session-find").click()
    await expect(page.get_by_test_id("session-title")).to_have_text(f"Session {sid}")


def fact(page: Page, table: str, name: str) -> Locator:
    """The value cell of the row `name` of one of the page's key/value tables."""
    row = page.get_by_test_id(table).locator("tr").filter(has=page.locator("th", has_text=re.compile(f"^{name}$")))
    return row.locator("td").first


async def screenshot(page: Page, name: str) -> None:
    """A full-page PNG into UI_SCREENSHOTS_DIR (made if missing), when that is set."""
    where = os.environ.get("UI_SCREENSHOTS_DIR")
    if where:
        await page.screenshot(path=str(Path(where) / name), full_page=True)


async def conversation(d: Daemon, turns: list[tuple[str, str]], **extra: Any) -> str:
    """A new session of `acme` with `turns`, its summaries made: each cadence point's before the
    next turn, so that there is a summary version for each (a slow summary would otherwise cover
    two cadence points in one pass, and the versions' diff would have nothing to show)."""
    sid = new_sid()
    for n, (user, assistant) in enumerate(turns, start=1):
        await d.post(sid, "user", user, **extra)
        await d.post(sid, "assistant", assistant, **extra)
        if n % d.settings.summary_every_n_turns == 0:
            await d.settle()
    await d.settle()
    return sid


async def test_the_token_is_entered_and_the_overview_renders(ui: Ui, daemon: Daemon) -> None:
    """Before a token the overview shows the 401 as text; with the operator's token it shows the
    daemon's overview as tables."""
    page = ui.page
    await page.goto(url(daemon, "/ui"))
    await expect(page.get_by_test_id("overview-error")).to_contain_text("HTTP 401")
    await open_inspector(ui, daemon, ADMIN)
    overview = page.get_by_test_id("overview")
    await expect(overview).to_contain_text("summary_answers")
    await expect(overview).to_contain_text("pending_summarizations")
    await expect(page.get_by_test_id("overview-error")).to_be_hidden()
    ui.assert_clean()


async def test_a_session_shows_its_tiers_summary_versions_and_what_changed(ui: Ui, any_daemon: Daemon) -> None:
    """A found session shows its counts, its three tiers, the summary the API gives, its version
    history newest first, and a word diff of the newest two versions with words added."""
    d = any_daemon
    sid = await conversation(d, EN_TURNS)
    summary = await d.get(f"/v1/sessions/{sid}/summary")
    assert summary["version"] >= 2, summary
    page = ui.page
    await open_inspector(ui, d, ACME)
    await open_session(ui, sid)

    await expect(fact(page, "session-facts", "turns")).to_have_text("9")
    await expect(fact(page, "session-facts", "messages")).to_have_text("18")
    await expect(fact(page, "session-facts", "covered turns")).to_have_text(str(summary["covered_turns"]))
    await expect(fact(page, "session-facts", "lag \\(turns\\)")).to_have_text(str(9 - summary["covered_turns"]))
    created = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$")
    await expect(fact(page, "session-facts", "created")).to_have_text(created)
    await expect(fact(page, "session-facts", "closed")).to_have_text("no")
    for tier in ("hot", "warm", "cold"):
        await expect(page.get_by_test_id(f"tier-{tier}")).to_contain_text(f"{tier}yes")
    # The hot tier's TTL, in words.
    await expect(page.get_by_test_id("tier-hot")).to_contain_text(re.compile(r"\d+ (min|h)"))

    await expect(page.get_by_test_id("summary-text")).to_have_text(summary["summary"])
    await expect(page.get_by_test_id("summary")).to_contain_text(f"version {summary['version']}")
    versions = page.get_by_test_id("version")
    await expect(versions).to_have_count(summary["version"])
    await expect(versions.first).to_contain_text(f"v{summary['version']}")

    # By default the newest version against the one before it.
    diff = page.get_by_test_id("diff")
    await expect(page.get_by_test_id("diff-to")).to_have_value("0")
    await expect(page.get_by_test_id("diff-from")).to_have_value("1")
    added = diff.locator("ins.added")
    await expect(added.first).to_be_visible()
    assert "".join(await added.all_text_contents()).strip()
    # The oldest against the newest: what the first summary had not yet heard of is added.
    await page.get_by_test_id("diff-from").select_option(str(summary["version"] - 1))
    await expect(added.filter(has_text="QX-5521")).not_to_have_count(0)
    await expect(page.get_by_test_id("diff-stats")).to_contain_text(f"v1 → v{summary['version']}")
    await screenshot(page, "session.png")
    ui.assert_clean()


async def test_a_slice_opens_its_raw_messages(ui: Ui, daemon: Daemon) -> None:
    """The slices timeline lists one row per summarization batch; clicking one shows the raw
    messages of its turns."""
    sid = await conversation(daemon, EN_TURNS)
    slices = (await daemon.get(f"/v1/sessions/{sid}/slices"))["slices"]
    assert len(slices) >= 2, slices
    page = ui.page
    await open_inspector(ui, daemon, ACME)
    await open_session(ui, sid)
    rows = page.get_by_test_id("slice-row")
    await expect(rows).to_have_count(len(slices))
    first = slices[0]
    await expect(rows.first).to_contain_text(f"turns {first['from_turn']}–{first['to_turn']}")
    await rows.first.click()
    shown = page.get_by_test_id("slice-messages")
    await expect(shown).to_contain_text(f"seq {first['first_seq']}–{first['last_seq']}")
    messages = (await daemon.get(first["messages_url"]))["messages"]
    await expect(page.get_by_test_id("slice-message")).to_have_count(len(messages))
    await expect(shown).to_contain_text(EN_TURNS[0][0])
    # Another slice replaces them.
    await rows.nth(1).click()
    await expect(shown).not_to_contain_text(EN_TURNS[0][0])
    await expect(shown).to_contain_text(EN_TURNS[first["to_turn"]][0])
    ui.assert_clean()


async def test_the_context_preview_labels_each_part_with_its_origin(ui: Ui, daemon: Daemon) -> None:
    """At a small max_chars, with a question about an early turn, the preview shows the memory's
    parts with where each came from, the raw turns with their text, and the token estimate."""
    sid = await conversation(daemon, EN_TURNS)
    question = "What was my order number again?"
    page = ui.page
    await open_inspector(ui, daemon, ACME)
    await open_session(ui, sid)
    await page.get_by_test_id("context-max-chars").fill("400")
    await page.get_by_test_id("context-question").fill(question)
    await page.get_by_test_id("context-run").click()

    parts = page.get_by_test_id("context-part")
    raw = parts.and_(page.locator("[data-origin=raw]"))
    await expect(raw.first).to_be_visible()
    await expect(raw.first.get_by_test_id("origin-badge")).to_have_text("raw turn")
    # The last completed turn is always there raw.
    await expect(raw.last).to_contain_text(EN_TURNS[-1][1])
    await expect(raw.last).to_contain_text("assistant")
    labels = {
        "summary": "summary fact",
        "snippets": "recall snippet",
        "condensed": "earlier turns, condensed",
        "salient": "said earlier",
        "subject": "subject",
        "events": "gateway events",
        "carried": "earlier sessions",
        "lagging": "turns the summary lags behind",
    }
    memory = parts.and_(page.locator(":not([data-origin=raw]):not([data-origin=question])"))
    await expect(memory.first).to_be_visible()
    for item in await memory.all():
        origin = await item.get_attribute("data-origin")
        assert origin in labels, origin
        await expect(item.get_by_test_id("origin-badge")).to_have_text(labels[origin])
    await expect(parts.and_(page.locator("[data-origin=question]"))).to_contain_text(question)
    tokens = re.compile(r"^context \d+, full history \d+$")
    await expect(fact(page, "context-facts", "estimated tokens")).to_have_text(tokens)
    await expect(fact(page, "context-facts", "summary tier")).to_have_text(re.compile(r"^(hot|warm|cold|none)$"))
    await screenshot(page, "context.png")
    ui.assert_clean()


async def test_a_users_sessions_are_listed_and_open(ui: Ui, daemon: Daemon) -> None:
    """A user's sessions are listed by id; clicking one opens its view."""
    first = await conversation(daemon, EN_TURNS[:2], user_id="u-ui-1")
    second = await conversation(daemon, EN_TURNS[2:5], user_id="u-ui-1")
    await conversation(daemon, EN_TURNS[:1], user_id="u-ui-2")
    page = ui.page
    await open_inspector(ui, daemon, ACME)
    await page.get_by_test_id("user-input").fill("u-ui-1")
    await page.get_by_test_id("user-find").click()
    listed = page.get_by_test_id("user-session")
    await expect(listed).to_have_count(2)
    assert sorted(await listed.all_text_contents()) == sorted([first, second])
    await listed.filter(has_text=second).click()
    await expect(page.get_by_test_id("session-title")).to_have_text(f"Session {second}")
    await expect(fact(page, "session-facts", "user")).to_have_text("u-ui-1")
    await expect(fact(page, "session-facts", "turns")).to_have_text("3")
    ui.assert_clean()


async def test_hostile_content_is_shown_as_text_and_runs_nothing(ui: Ui, daemon: Daemon) -> None:
    """Markup in messages (and so in summaries, slices and the context) is shown literally: no
    element is made of it, no script runs, no dialog opens, and the CSP reports no violation."""
    # Six turns: two summary versions, so that the diff shows the markup too.
    turns = [(h, f"You said {h} and I repeat it: {h}") for h in HOSTILE]
    turns += [(f"Again: {h}", f"Once more: {h}") for h in HOSTILE]
    sid = await conversation(daemon, turns)
    page = ui.page
    response = await page.goto(url(daemon, "/ui"))
    assert response is not None
    csp = await response.header_value("Content-Security-Policy")
    assert csp is not None
    assert "script-src 'self'" in csp
    assert "default-src 'none'" in csp
    await open_inspector(ui, daemon, ACME)
    await open_session(ui, sid)
    await page.get_by_test_id("slice-row").first.click()
    for text in HOSTILE:
        await expect(page.get_by_test_id("slice-messages")).to_contain_text(text)
    await page.get_by_test_id("context-max-chars").fill("2000")
    await page.get_by_test_id("context-question").fill(HOSTILE[0])
    await page.get_by_test_id("context-run").click()
    await expect(page.get_by_test_id("context-part").first).to_be_visible()
    for text in HOSTILE:
        await expect(page.get_by_test_id("context")).to_contain_text(text)
    await page.locator("[data-testid=versions] details").first.click()
    await expect(page.get_by_test_id("diff").locator("ins.added")).not_to_have_count(0)

    assert await page.evaluate("typeof window.__pwned") == "undefined"
    assert await page.locator("main img, main b, main script, main iframe").count() == 0
    assert await page.title() == "tiered-memory inspector"
    await screenshot(page, "hostile.png")
    ui.assert_clean()
    # The policy is in force on the page, and a violation would have been seen: an inline script
    # put in the page does not run, and the console says why.
    inline = "() => { const s = document.createElement('script'); s.textContent = 'window.__inline = 1';"
    inline += " document.head.append(s); return typeof window.__inline; }"
    async with page.expect_console_message(lambda m: "Content Security Policy" in m.text):
        assert await page.evaluate(inline) == "undefined"


async def test_another_tenants_session_shows_an_error_and_none_of_its_content(ui: Ui, daemon: Daemon) -> None:
    """With acme's token, globex's session id answers like an unknown one: an error with its
    status, and nothing of what globex's user said."""
    secret = "The vault code is 7719-ALPHA."
    sid = new_sid()
    for role, content in (("user", secret), ("assistant", "Noted the code.")) * 3:
        resp = await daemon.http.post(
            f"/v1/sessions/{sid}/messages", json={"role": role, "content": content}, headers=bearer(GLOBEX)
        )
        assert resp.status == 201, await resp.text()
    await daemon.settle()
    page = ui.page
    await open_inspector(ui, daemon, ACME)
    await open_session(ui, sid)
    await expect(page.get_by_test_id("session-error")).to_contain_text(re.compile(r"HTTP (403|404)"))
    await expect(page.get_by_test_id("session-facts")).to_be_hidden()
    assert "7719" not in await page.locator("body").inner_text()
    assert "7719" not in await page.content()
    ui.assert_clean()


async def test_an_unrestricted_token_acts_in_the_tenant_it_names(ui: Ui, daemon: Daemon) -> None:
    """The operator's unrestricted token with a tenant opens that tenant's session by the id the
    tenant knows it by (sent as X-Tenant); without the tenant the same id is not found."""
    sid = await conversation(daemon, EN_TURNS[:2])
    page = ui.page
    await open_inspector(ui, daemon, ADMIN)
    await page.get_by_test_id("session-input").fill(sid)
    await page.get_by_test_id("session-find").click()
    await expect(page.get_by_test_id("session-error")).to_contain_text("HTTP 404")
    await page.get_by_test_id("token-input").fill(ADMIN)
    await page.get_by_test_id("tenant-input").fill("acme")
    await page.get_by_test_id("token-save").click()
    await expect(page.get_by_test_id("token-status")).to_have_text("token set for this tab, tenant acme")
    await open_session(ui, sid)
    await expect(fact(page, "session-facts", "turns")).to_have_text("2")
    ui.assert_clean()


async def test_the_token_lives_in_session_storage_and_goes_as_a_bearer_header(ui: Ui, daemon: Daemon) -> None:
    """The token is kept in sessionStorage only and sent as `Authorization: Bearer`; forgotten,
    it is gone from storage and the next request carries no Authorization header."""
    page = ui.page
    await page.goto(url(daemon, "/ui"))
    await page.get_by_test_id("token-input").fill(ACME)
    async with page.expect_request("**/v1/overview") as sent:
        await page.get_by_test_id("token-save").click()
    assert (await (await sent.value).all_headers()).get("authorization") == f"Bearer {ACME}"
    assert await page.evaluate(f"sessionStorage.getItem({TOKEN_KEY!r})") == ACME
    assert await page.evaluate("localStorage.length") == 0
    assert await page.get_by_test_id("token-input").input_value() == ""
    assert ACME not in await page.content()

    await page.get_by_test_id("token-forget").click()
    await expect(page.get_by_test_id("token-status")).to_have_text("no token")
    assert await page.evaluate(f"sessionStorage.getItem({TOKEN_KEY!r})") is None
    async with page.expect_request("**/v1/overview") as sent:
        await page.get_by_test_id("overview-refresh").click()
    assert "authorization" not in await (await sent.value).all_headers()
    await expect(page.get_by_test_id("overview-error")).to_contain_text("HTTP 401")
    ui.assert_clean()
