"""`kf report`: the HTML page of a real search (and of two compared), parsed and rendered in
headless Chromium.

One real search runs once for the module, on a fresh log, the real Temporal dev server and Postgres, with an
in-process worker. A second stream copies its events, after it, with hostile labels, rationales, hints and
sources, as an LLM proposer could write them: a second search for --compare, and one that starts with lessons.
"""

from __future__ import annotations

import json
import resource
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from conftest import database_url
from search_fixtures import QUICK, running_worker, start
from temporalio.testing import WorkflowEnvironment

from cli import main as kf
from engine.evidence.events import NewEvent
from engine.evidence.migrations import migrate
from engine.evidence.projections import checkpoint_of
from engine.evidence.store import EventStore
from engine.search.history import stream_of

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# What an adversarial proposer might write: markup that would run script or load something if it reached the
# page unescaped. Each one sets the title, so a browser that ran it would show it.
HOSTILE = "</script><script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"
HOSTILE_LABEL = "</td></tr></table><svg onload=\"document.title='pwned'\"><b>label"
HOSTILE_SOURCE = '/* </pre><iframe src="https://example.com/"></iframe> */\n'


@dataclass
class Searches:
    url: str
    cold: str
    """A real search on a fresh log."""
    hostile: str
    """A copy of its events under another search id, started after it, with hostile text."""
    candidates: dict[str, list[str]]
    """Candidate ids per search, from the event log."""


@pytest.fixture(scope="module")
async def searches(pg_url: str, temporal_env: WorkflowEnvironment) -> AsyncIterator[Searches]:
    name = f"kf_report_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(pg_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = database_url(pg_url, name)
    await migrate(url)
    store = await EventStore.connect(url, max_size=12)
    client = temporal_env.client
    prefix = f"report-{uuid.uuid4().hex[:6]}"
    try:
        async with running_worker(client, store, prefix):
            handle = await start(
                client,
                prefix,
                {"problem": "softmax", "generations": 1, "candidates_per_generation": 2, **QUICK},
                search_id=f"search-cold-{uuid.uuid4().hex[:6]}",
            )
            await handle.result()
        # A second search in the log, after the first: its copy with hostile text (a second real search would
        # double the module's time on a shared machine).
        hostile = f"search-hostile-{uuid.uuid4().hex[:6]}"
        await store.append(stream_of(hostile), _hostile_copy(await store.read_stream(stream_of(handle.id)), hostile))
        candidates = {}
        for search in (handle.id, hostile):
            events = await store.read_stream(stream_of(search))
            candidates[search] = list(
                dict.fromkeys(e.payload["candidate"]["candidate_id"] for e in events if e.type == "candidate.proposed")
            )
        yield Searches(url, handle.id, hostile, candidates)
    finally:
        await store.close()


def _hostile_copy(events: list[Any], search_id: str) -> list[NewEvent]:
    """The events again, under new ids, with hostile text wherever a proposer or a user writes text."""
    copied = []
    for event in events:
        payload = json.loads(json.dumps(event.payload))
        if event.type == "search.started":
            payload["spec"]["hints"] = [HOSTILE]
        if event.type == "candidate.proposed" and payload["generation"] >= 1:
            payload["candidate"]["label"] = HOSTILE_LABEL
            payload["candidate"]["rationale"] = HOSTILE
            payload["candidate"]["tags"] = [HOSTILE]
            payload["candidate"]["source"] = HOSTILE_SOURCE + payload["candidate"]["source"]
        copied.append(
            NewEvent(
                event_id=f"{search_id}/{event.event_id}",
                type=event.type,
                payload=payload,
                metadata=event.metadata,
                schema_version=event.schema_version,
            )
        )
    return copied


class Page(HTMLParser):
    """The parts of a report page the tests look at."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.open: list[str] = []
        self.svg_in: dict[str, int] = {}
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        if tag == "figure" and attributes.get("id"):
            self.open.append(str(attributes["id"]))
        if tag == "svg" and self.open:
            self.svg_in[self.open[-1]] = self.svg_in.get(self.open[-1], 0) + 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure" and self.open:
            self.open.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    @property
    def all_text(self) -> str:
        return "".join(self.text)

    def named(self, tag: str) -> list[dict[str, str | None]]:
        return [attributes for name, attributes in self.tags if name == tag]


def report(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = kf(["report", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def assert_self_contained(page: Page) -> None:
    """No script, and nothing fetched: every reference stays inside the page."""
    assert not page.named("script") and not page.named("iframe") and not page.named("img")
    assert not page.named("link")
    for _, attributes in page.tags:
        for name, value in attributes.items():
            assert not name.startswith("on"), (name, value)
            if name in ("src", "href", "xlink:href"):
                assert (value or "").startswith(("#", "data:")), (name, value)


def test_report_of_a_real_search_shows_plots_every_candidate_and_lessons(
    searches: Searches, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "cold.html"
    status, out, err = report(capsys, searches.cold, "--output", str(output), "--database-url", searches.url)
    assert status == 0, err
    assert out.strip() == str(output)
    page = Page(output.read_text())
    assert_self_contained(page)
    assert page.svg_in.get("plot-progress") == 1 and page.svg_in.get("plot-roofline") == 1
    text = page.all_text
    for candidate_id in searches.candidates[searches.cold]:
        assert candidate_id[:12] in text
        assert any(attributes.get("title") == candidate_id for attributes in page.named("span"))
    assert "(final incumbent)" in text and "seed" in text
    # A fresh log: the cold search started with no lessons and added some.
    assert "What the search started with" in text and "No lessons yet for softmax" in text
    assert "Evidence the search added, per change" in text


async def test_the_report_leaves_the_lessons_view_alone(searches: Searches) -> None:
    # The lessons are recomputed in the session's temporary tables; the real view and its checkpoint stay put.
    from engine.report.gather import gather_report

    store = await EventStore.connect(searches.url, max_size=2)
    try:
        before = await checkpoint_of(store.pool, "lessons")
        stats = await store.pool.fetch("SELECT * FROM lesson_stats ORDER BY family, problem, target, change")
        report_model = await gather_report(searches.url, searches.cold)
        assert report_model.lessons.available, report_model.lessons.reason
        assert await checkpoint_of(store.pool, "lessons") == before
        assert await store.pool.fetch("SELECT * FROM lesson_stats ORDER BY family, problem, target, change") == stats
    finally:
        await store.close()
    assert [c.candidate_id for c in report_model.candidates if c.evaluation] == [
        p.candidate_id for p in report_model.evaluations
    ]
    assert report_model.incumbents and report_model.incumbents[0].after_evaluation >= 1


def test_hostile_text_is_escaped(searches: Searches, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "hostile.html"
    status, _, err = report(capsys, searches.hostile, "--output", str(output), "--database-url", searches.url)
    assert status == 0, err
    raw = output.read_text()
    page = Page(raw)
    assert_self_contained(page)
    # Every hostile string is there, as text.
    text = page.all_text
    assert HOSTILE in text and HOSTILE_LABEL in text and HOSTILE_SOURCE.strip() in text
    assert "<script>" not in raw and "<img" not in raw and "<iframe" not in raw
    # The only svg elements are the plots' (not the label's), and only the page's own tables.
    assert sum(1 for name, _ in page.tags if name == "svg") == sum(page.svg_in.values())
    for candidate_id in searches.candidates[searches.hostile]:
        assert candidate_id[:12] in text
    # It started after the real search: with that search's lessons.
    started_with = text.split("What the search started with", 1)[1].split("After the search", 1)[0]
    assert "No lessons yet" not in started_with and "Lessons for softmax" in started_with


def test_compare_overlays_two_searches_on_one_plot(
    searches: Searches, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    status, out, err = report(capsys, "--compare", searches.cold, searches.hostile, "--database-url", searches.url)
    assert status == 0, err
    expected = tmp_path / f"report-{searches.cold}-vs-{searches.hostile}.html"
    assert out.strip() == expected.name and expected.is_file()
    page = Page(expected.read_text())
    assert_self_contained(page)
    assert page.svg_in == {"plot-comparison": 1}
    rows = [r for r in page.all_text.splitlines() if r]
    assert any(searches.cold in r for r in rows) and any(searches.hostile in r for r in rows)


def test_output_dash_writes_the_page_to_stdout_and_json_says_where_it_went(
    searches: Searches, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out, err = report(capsys, searches.cold, "--output", "-", "--database-url", searches.url)
    assert status == 0, err
    assert out.startswith("<!DOCTYPE html>") and out.rstrip().endswith("</html>")
    path = tmp_path / "r.html"
    status, out, err = report(capsys, searches.cold, "-o", str(path), "--json", "--database-url", searches.url)
    assert status == 0, err
    assert json.loads(out) == {"path": str(path), "search_ids": [searches.cold], "bytes": path.stat().st_size}


def test_bad_input_exits_2_and_an_unreachable_database_3(
    searches: Searches, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, _, err = report(capsys, "search-no-such-search", "--database-url", searches.url)
    assert status == 2 and "no events for search 'search-no-such-search'" in err and "kf search list" in err
    status, _, err = report(capsys, "--database-url", searches.url)
    assert status == 2 and "needs a search id" in err
    status, _, err = report(capsys, searches.cold, "--compare", searches.cold, searches.hostile)
    assert status == 2 and "not both" in err
    status, _, err = report(capsys, "--compare", searches.cold)
    assert status == 2 and "2 to" in err
    status, _, err = report(
        capsys, searches.cold, "--database-url", searches.url, "--output", str(tmp_path / "missing" / "r.html")
    )
    assert status == 2 and "--output" in err
    # /proc passes os.access for root and refuses every new file: found before the page is rendered, not after.
    status, _, err = report(capsys, searches.cold, "--database-url", searches.url, "--output", "/proc/kf-report.html")
    assert status == 2 and "/proc cannot hold a new file" in err, err
    # Nothing listens on port 1 of the loopback: the machine's failure, not the input.
    status, _, err = report(capsys, searches.cold, "--database-url", "postgresql://kf@127.0.0.1:1/kf")
    assert status == 3 and "kf up" in err


def test_a_report_cut_short_leaves_the_earlier_one_whole(
    searches: Searches, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A write that fails half-way (here the process's file size limit, as a full disk would) is the machine's
    (exit status 3); the report already at that place is kept as it was and no part of the new one is left."""
    path = tmp_path / "r.html"
    status, _, err = report(capsys, searches.cold, "-o", str(path), "--database-url", searches.url)
    assert status == 0, err
    earlier = path.read_bytes()
    assert len(earlier) > 8192
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))  # Python ignores SIGXFSZ: the write fails with EFBIG
    try:
        status, _, err = report(capsys, searches.hostile, "-o", str(path), "--database-url", searches.url)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert status == 3 and "cannot write the report" in err, err
    assert path.read_bytes() == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]


@pytest.mark.skipif(not CHROMIUM.is_file(), reason=f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)")
def test_the_page_renders_in_headless_chromium(
    searches: Searches, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from playwright.sync_api import sync_playwright

    pages = {}
    for name, argv, plots in (
        ("report", [searches.hostile], 2),
        ("comparison", ["--compare", searches.cold, searches.hostile], 1),
    ):
        path = tmp_path / f"{name}.html"
        assert report(capsys, *argv, "--output", str(path), "--database-url", searches.url)[0] == 0
        pages[path] = plots
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            for path, plots in pages.items():
                check_in_browser(browser, path, plots)
        finally:
            browser.close()


def check_in_browser(browser: Any, path: Path, plots: int) -> None:
    """Load ``path`` from its file:// URL: no console or page error, nothing else fetched, no hostile script run,
    ``plots`` SVG figures of real size, and a screenshot that is a real picture."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    fetched: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("request", lambda request: fetched.append(request.url))
    page.goto(path.as_uri(), wait_until="load")
    assert errors == [], f"{path.name}: {errors}"
    assert fetched == [path.as_uri()], f"{path.name} fetched {fetched}"
    assert page.title().startswith("Kernel Factory") and "pwned" not in page.title()
    figures = page.locator("figure.plot > svg")
    assert figures.count() == plots
    for index in range(plots):
        box = figures.nth(index).bounding_box()
        assert box is not None and box["width"] > 200 and box["height"] > 100, box
    shot = path.with_suffix(".png")
    page.screenshot(path=str(shot), full_page=True)
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000
    page.close()
