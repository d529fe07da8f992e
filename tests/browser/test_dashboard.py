"""The dashboard in a real browser: Debian's chromium, driven by Playwright, on a real
`shigoto dashboard` and a real PostgreSQL, with real runners where a job must run.

Every test checks the page and the database: what the page shows is what the rows hold, and an
action clicked on the page is the change found in the rows (or, when refused, no change at all).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from playwright.sync_api import Page, expect

import shigoto
import shigoto.cron
from shigoto.dashboard.app import ARGS_SCAN
from tests.browser import pages
from tests.browser.dashboard_process import DashboardProcess
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import count, row, state, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]

Dashboards = Callable[..., DashboardProcess]
Runners = Callable[..., RunnerProcess]
TOKEN = "right-token-0123456789abcdef"
WORKERS = "tests.browser.workers"


def _paused(conn: psycopg.Connection[Any], queue: str) -> bool:
    found = conn.execute("SELECT paused FROM shigoto_queues WHERE name = %s", (queue,)).fetchone()
    return bool(found and found[0])


def test_retry_a_discarded_job_and_see_it_complete(
    page: Page, dashboards: Dashboards, runner_processes: Runners, conn: psycopg.Connection[Any],
    queue_name: str,
) -> None:  # fmt: skip
    runner_processes(workers=WORKERS, queue=f"{queue_name}=2")
    job = shigoto.enqueue("tests.browser.workers.charge_once", {"order_id": 7}, queue=queue_name,
                          max_attempts=1)  # fmt: skip
    wait_until(lambda: state(conn, job.id) == "discarded", message="the first attempt fails")
    dashboard = dashboards(token=TOKEN)

    pages.open_page(page, dashboard, f"jobs/{job.id}")
    assert pages.detail_state(page) == "discarded"
    errors = page.locator('[data-view="job"] [data-field="errors"]')
    # Without the token: the error's class, never its message (issue 24).
    expect(errors).to_contain_text("ConnectionError")
    expect(errors).not_to_contain_text("payment gateway timed out")
    expect(errors.locator("pre.traceback")).to_have_count(0)

    pages.sign_in(page, TOKEN)
    pages.signed_in(page)
    expect(errors).to_contain_text("payment gateway timed out for order 7")
    expect(errors.locator("pre.traceback")).to_contain_text("Traceback (most recent call last)")
    page.click('button[data-action="retry"]')
    pages.expect_flash(page, error=False, containing=f"Job {job.id}: retried")
    # The runner takes the retried job; the page follows by itself (live updates), no reload.
    expect(page.locator('[data-view="job"] [data-field="state"]')).to_have_text("completed")
    expect(page.locator('[data-view="job"] [data-field="result"]')).to_contain_text(
        '"charged_on_attempt": 2'
    )

    done = row(conn, job.id)
    assert (done["state"], done["attempt"]) == ("completed", 2)
    assert done["result"] == {"order_id": 7, "charged_on_attempt": 2}

    # Finished, it may be deleted: the page asks twice, then the row is gone.
    delete = page.locator('button[data-action="delete"]')
    delete.click()
    expect(delete).to_have_text("Delete for good?")
    assert count(conn, "id = %s", job.id) == 1
    delete.click()
    pages.expect_flash(page, error=False, containing=f"Job {job.id}: deleted")
    expect(page.locator('[data-view="jobs"][data-loaded="true"]')).to_be_visible()
    assert count(conn, "id = %s", job.id) == 0


def test_cancel_a_scheduled_job(
    page: Page, dashboards: Dashboards, conn: psycopg.Connection[Any], queue_name: str
) -> None:
    keep = shigoto.enqueue("tests.browser.workers.note", {"n": 1}, queue=queue_name,
                           schedule_in=3600)  # fmt: skip
    hostile = "<img src=x onerror=window.pwned=1>"
    job = shigoto.enqueue("tests.browser.workers.note", {"n": 2, "note": hostile},
                          queue=queue_name, schedule_in=3600)  # fmt: skip
    dashboard = dashboards(token=TOKEN)

    pages.open_page(page, dashboard, f"jobs?queue={queue_name}")
    assert pages.job_ids(page) == [job.id, keep.id]
    assert pages.row_state(page, job.id) == "scheduled"
    # Args are for signed-in viewers (the default --show-args token).
    expect(page.locator(f'tr[data-job-id="{job.id}"] .args-cell')).to_have_text(
        "\u2039sign in to see\u203a"
    )
    pages.sign_in(page, TOKEN)
    pages.signed_in(page)
    # Signed in, the args show, as text: markup in them is never parsed.
    expect(page.locator(f'tr[data-job-id="{job.id}"] .args-cell')).to_contain_text(hostile)
    assert page.locator("table.jobs img").count() == 0
    assert page.evaluate("window.pwned") is None
    page.click(f'tr[data-job-id="{job.id}"] a')
    expect(page.locator(f'[data-view="job"][data-job="{job.id}"]')).to_be_visible()
    assert pages.detail_state(page) == "scheduled"
    page.click('button[data-action="cancel"]')
    pages.expect_flash(page, error=False, containing=f"Job {job.id}: cancelled")
    expect(page.locator('[data-view="job"] [data-field="state"]')).to_have_text("cancelled")
    expect(page.locator('button[data-action="cancel"]')).to_be_disabled()

    assert state(conn, job.id) == "cancelled"
    assert state(conn, keep.id) == "scheduled"
    page.go_back()
    expect(page.locator(f'tr[data-job-id="{job.id}"] td[data-field="state"]')).to_have_text(
        "cancelled"
    )
    assert pages.row_state(page, keep.id) == "scheduled"


# A bound on a hang, not a measure: twenty pages of 500 rows on a busy two-core machine.
@pytest.mark.timeout(300)
def test_page_through_ten_thousand_jobs(
    page: Page, dashboards: Dashboards, conn: psycopg.Connection[Any], queue_name: str
) -> None:
    total = 10_000
    shigoto.enqueue_many(
        {"worker": "tests.browser.workers.note", "args": {"n": i}, "queue": queue_name}
        for i in range(total)
    )
    listed = conn.execute(
        "SELECT id FROM shigoto_jobs WHERE queue = %s ORDER BY id DESC", (queue_name,)
    )
    expected = [r[0] for r in listed]
    assert len(expected) == total
    dashboard = dashboards(token=TOKEN)

    pages.open_page(page, dashboard, "jobs")
    form = page.locator("form[data-filter]")
    form.locator('input[name="queue"]').fill(queue_name)
    form.locator('select[name="limit"]').select_option("500")
    form.locator('button[type="submit"]').click()
    expect(page.locator(".job-list")).to_have_attribute("data-count", "500")

    seen: list[int] = []
    first_page = pages.job_ids(page)
    while True:
        shown = pages.job_ids(page)
        seen += shown
        next_button = page.locator('button[data-page="next"]')
        if next_button.is_disabled():
            break
        cursor = next_button.get_attribute("data-cursor")
        assert cursor
        next_button.click()
        # Each page is drawn under the cursor it was fetched with.
        expect(page.locator(".job-list")).to_have_attribute("data-after", cursor)

    assert len(seen) == len(set(seen)) == total, "each job once, none repeated or skipped"
    assert seen == expected, "newest first, in id order, across every page"
    expect(page.locator(".page-number")).to_have_text(f"Page {total // 500}")
    page.click('button[data-page="first"]')
    expect(page.locator("tr[data-job-id]").first).to_have_attribute(
        "data-job-id", str(first_page[0])
    )
    assert pages.job_ids(page) == first_page

    pages.open_page(page, dashboard, "queues")
    expect(page.locator(f'tr[data-queue="{queue_name}"] td[data-state="available"]')).to_have_text(
        "10,000"
    )
    assert count(conn, "queue = %s AND state = 'available'", queue_name) == total


def test_a_wrong_token_is_refused_and_changes_nothing(
    page: Page, dashboards: Dashboards, conn: psycopg.Connection[Any], queue_name: str
) -> None:
    job = shigoto.enqueue("tests.browser.workers.note", {"n": 3}, queue=queue_name,
                          schedule_in=3600)  # fmt: skip
    before = row(conn, job.id)
    dashboard = dashboards(token=TOKEN)
    pages.open_page(page, dashboard, f"jobs/{job.id}")

    # Not signed in: the action is refused (401) and the page says to sign in.
    page.click('button[data-action="cancel"]')
    pages.expect_flash(page, error=True, containing="Sign in first")

    # A wrong token does not sign in.
    pages.sign_in(page, "wrong-token-0123456789abcdef")
    pages.expect_flash(page, error=True, containing="refused this token")
    expect(page.locator('button[data-action="sign-out"]')).to_be_hidden()
    assert page.evaluate("sessionStorage.length") == 0

    # A token the server no longer takes (rotated after sign-in) is refused at the action (403).
    pages.sign_in(page, TOKEN)
    pages.signed_in(page)
    page.evaluate("sessionStorage.setItem('shigoto.dashboard.token', 'rotated-token-0123456789')")
    page.click('button[data-action="cancel"]')
    pages.expect_flash(page, error=True, containing="Not allowed")
    expect(page.locator('[data-view="job"] [data-field="state"]')).to_have_text("scheduled")

    assert row(conn, job.id) == before, "a refused action writes nothing"


def test_a_dashboard_without_a_token_is_read_only(
    page: Page, dashboards: Dashboards, conn: psycopg.Connection[Any], queue_name: str
) -> None:
    job = shigoto.enqueue("tests.browser.workers.note", {"n": 4}, queue=queue_name)
    dashboard = dashboards(token=None)
    pages.open_page(page, dashboard, f"jobs/{job.id}")

    expect(page.locator('input[name="token"]')).to_be_hidden()
    expect(page.locator("[data-mode]")).to_contain_text("Read-only")
    expect(page.locator('button[data-action="cancel"]')).to_be_disabled()
    # Args are for signed-in viewers by default; nobody can sign in here.
    expect(page.locator('[data-view="job"] [data-field="args"]')).to_contain_text("Hidden")
    # The server refuses the action itself, whatever the page would allow.
    status = page.evaluate(
        "async (id) => (await fetch(`/api/jobs/${id}/cancel`, {method: 'POST'})).status", job.id
    )
    assert status in (401, 403)
    assert state(conn, job.id) == "available"


def test_pause_and_resume_a_queue(
    page: Page, dashboards: Dashboards, runner_processes: Runners, conn: psycopg.Connection[Any],
    queue_name: str,
) -> None:  # fmt: skip
    dashboard = dashboards(token=TOKEN)
    shigoto.enqueue_many(
        {"worker": "tests.browser.workers.note", "args": {"n": i}, "queue": queue_name}
        for i in range(3)
    )
    pages.open_page(page, dashboard, "queues")
    pages.sign_in(page, TOKEN)
    pages.signed_in(page)
    queue_row = page.locator(f'tr[data-queue="{queue_name}"]')
    expect(queue_row.locator('td[data-state="available"]')).to_have_text("3")

    queue_row.locator('button[data-action="pause"]').click()
    pages.expect_flash(page, error=False, containing=f"Queue {queue_name}: paused")
    expect(queue_row).to_have_attribute("data-paused", "true")
    expect(queue_row.locator('button[data-action="resume"]')).to_be_visible()
    assert _paused(conn, queue_name)

    queue_row.locator('button[data-action="resume"]').click()
    pages.expect_flash(page, error=False, containing=f"Queue {queue_name}: resumed")
    expect(queue_row).to_have_attribute("data-paused", "false")
    assert not _paused(conn, queue_name)

    # Resumed, the queue's jobs run, and the page follows without a reload.
    runner_processes(workers=WORKERS, queue=f"{queue_name}=2")
    expect(queue_row.locator('td[data-state="completed"]')).to_have_text("3")
    assert count(conn, "queue = %s AND state = 'completed'", queue_name) == 3


def test_overview_draws_the_last_hour(
    page: Page, dashboards: Dashboards, conn: psycopg.Connection[Any], queue_name: str
) -> None:
    # An hour of per-minute samples, as the leading runner's sampler writes them; minutes 2 to
    # 49 ago, so none leaves the chart's hour while the test runs.
    minutes = range(49, 1, -1)
    for ago in minutes:
        conn.execute(
            "INSERT INTO shigoto_stats (at, queue, available, scheduled, executing, retryable,"
            " completed, discarded, cancelled) VALUES (date_trunc('minute', now())"
            " - make_interval(mins => %s), %s, %s, %s, %s, %s, %s, %s, %s)",
            (ago, queue_name, 40 + ago % 7, 5, 3, ago % 3, 20 + ago % 11, int(ago % 5 == 0), 0),
        )
    shigoto.enqueue_many(
        {"worker": "tests.browser.workers.note", "args": {"n": i}, "queue": queue_name}
        for i in range(5)
    )
    dashboard = dashboards(token=TOKEN)
    pages.open_page(page, dashboard, "overview")
    pages.Screenshots(page).take("overview")

    throughput = page.locator('svg[data-chart="throughput"]')
    depth = page.locator('svg[data-chart="depth"]')
    expect(throughput).to_have_attribute("data-points", str(len(minutes)))
    expect(depth).to_have_attribute("data-points", str(len(minutes)))
    series = "els => els.map(e => e.dataset.series)"
    assert throughput.locator("path.series").evaluate_all(series) == [
        "completed", "discarded", "cancelled"]  # fmt: skip
    assert depth.locator("path.series").evaluate_all(series) == [
        "available", "scheduled", "executing", "retryable"]  # fmt: skip
    latest = conn.execute(
        "SELECT completed, available FROM shigoto_stats ORDER BY at DESC LIMIT 1"
    ).fetchone()
    assert latest is not None
    legend = page.locator('[data-view="overview"] .legend li')
    expect(legend.filter(has_text="completed")).to_contain_text(str(latest[0]))
    expect(legend.filter(has_text="available")).to_contain_text(str(latest[1]))
    expect(page.locator('[data-count="available"] .tile-value')).to_have_text(
        str(count(conn, "state = 'available'"))
    )


# A bound on a hang, not a measure: the demo runs first, then every page.
@pytest.mark.timeout(300)
def test_every_page_shows_the_demo(
    page: Page, dashboards: Dashboards, runner_processes: Runners, db_url: str,
    conn: psycopg.Connection[Any], tmp_path: Any,
) -> None:  # fmt: skip
    """`shigoto demo` on the test database, then each page of the dashboard on its schema."""
    import subprocess
    import sys

    from tests.support.runner_process import ROOT

    demo = subprocess.run(
        [sys.executable, "-m", "shigoto.cli", "demo", "--database-url", db_url],
        cwd=ROOT, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stdout + demo.stderr
    schema = "shigoto_demo"
    conn.execute(f"SET search_path TO {schema}")
    shigoto.cron.schedule("nightly-report", "0 3 * * *", "shigoto.cli.demo_workers.generate_report",
                          {"report": "nightly", "pages": 3}, queue="demo-reports",
                          timezone="Europe/Oslo", schema=schema)  # fmt: skip
    runner_processes("--schema", schema, "--cron", workers="shigoto.cli.demo_workers",
                     queue="demo=4")  # fmt: skip
    wait_until(lambda: conn.execute("SELECT count(*) FROM shigoto_nodes").fetchone()[0] == 1,
               message="the runner registers its node")  # fmt: skip
    jobs = {r[0]: r[1] for r in conn.execute("SELECT id, state FROM shigoto_jobs ORDER BY id")}
    dashboard = dashboards(token=TOKEN, schema=schema, show_args="always")
    shots = pages.Screenshots(page)

    pages.open_page(page, dashboard, "overview")
    for name in ("completed", "discarded", "cancelled"):
        expect(page.locator(f'[data-count="{name}"] .tile-value')).to_have_text(
            str(sum(1 for s in jobs.values() if s == name))
        )

    pages.open_page(page, dashboard, "jobs")
    assert sorted(pages.job_ids(page)) == sorted(jobs)
    for job_id, job_state in jobs.items():
        assert pages.row_state(page, job_id) == job_state
    shots.take("jobs")

    failed = [i for i, s in jobs.items() if s in ("discarded", "retryable")]
    pages.open_page(page, dashboard, "failures")
    assert sorted(pages.job_ids(page)) == sorted(failed)
    shots.take("failures")

    webhook = conn.execute(
        "SELECT id, args, errors FROM shigoto_jobs WHERE worker LIKE '%.parse_webhook'"
    ).fetchone()
    assert webhook is not None
    pages.sign_in(page, TOKEN)  # error messages and tracebacks are for signed-in viewers
    pages.signed_in(page)
    pages.open_page(page, dashboard, f"jobs/{webhook[0]}")
    assert pages.detail_state(page) == "discarded"
    shown_args = page.locator('[data-view="job"] [data-field="args"] pre').inner_text()
    assert json.loads(shown_args) == webhook[1]
    traceback = page.locator('[data-view="job"] [data-field="errors"] pre.traceback')
    expect(traceback).to_have_text(webhook[2][-1]["traceback"])
    shots.take("job")

    # The workflow's last step lists the two steps it ran after, and the first step its children.
    ship = conn.execute(
        "SELECT id, depends_on FROM shigoto_jobs WHERE worker LIKE '%.ship_order'"
    ).fetchone()
    assert ship is not None
    pages.open_page(page, dashboard, f"jobs/{ship[0]}")
    parents = page.locator('[data-view="job"] [data-field="parents"] tr[data-job-id]')
    expect(parents).to_have_count(len(ship[1]))
    assert sorted(pages.ids_in(parents)) == sorted(ship[1])

    pages.open_page(page, dashboard, "queues")
    for queue, completed in conn.execute(
        "SELECT queue, count(*) FROM shigoto_jobs WHERE state = 'completed' GROUP BY queue"
    ):
        expect(page.locator(f'tr[data-queue="{queue}"] td[data-state="completed"]')).to_have_text(
            str(completed)
        )
    shots.take("queues")

    pages.open_page(page, dashboard, "cron")
    cron = page.locator('tr[data-cron="nightly-report"]')
    expect(cron.locator('[data-field="expression"]')).to_have_text("0 3 * * *")
    expect(cron.locator('[data-field="worker"] .worker')).to_have_attribute(
        "title", "shigoto.cli.demo_workers.generate_report"
    )
    expect(cron.locator('[data-field="queue"]')).to_have_text("demo-reports")
    expect(cron.locator('[data-field="timezone"]')).to_have_text("Europe/Oslo")
    expect(cron.locator('[data-field="next"]')).to_contain_text("in ")  # the next 03:00, ahead
    shots.take("cron")

    node = conn.execute("SELECT id, hostname FROM shigoto_nodes").fetchone()
    assert node is not None
    pages.open_page(page, dashboard, "nodes")
    expect(page.locator(f'tr[data-node="{node[0]}"]')).to_contain_text(node[1])
    shots.take("nodes")


def test_without_server_sent_events_the_page_polls(
    page: Page, dashboards: Dashboards, conn: psycopg.Connection[Any], queue_name: str
) -> None:
    """A browser (or a proxy) without a working event stream still sees changes: the page polls
    every five seconds."""
    job = shigoto.enqueue("tests.browser.workers.note", {"n": 5}, queue=queue_name,
                          schedule_in=3600)  # fmt: skip
    dashboard = dashboards(token=TOKEN)
    page.add_init_script("delete window.EventSource")
    pages.open_page(page, dashboard, f"jobs?queue={queue_name}")
    expect(page.locator("[data-live]")).to_have_attribute("data-live", "polling")
    assert pages.row_state(page, job.id) == "scheduled"

    # Someone else cancels it (the CLI, another dashboard): the page shows it without a reload.
    assert shigoto.cancel_by(ids=[job.id]) == [job.id]
    expect(page.locator(f'tr[data-job-id="{job.id}"] td[data-field="state"]')).to_have_text(
        "cancelled"
    )
    assert state(conn, job.id) == "cancelled"


def test_filters_find_jobs_and_a_bad_one_is_marked(
    page: Page, dashboards: Dashboards, conn: psycopg.Connection[Any], queue_name: str
) -> None:
    wanted = shigoto.enqueue("tests.browser.workers.note", {"n": 42}, queue=queue_name,
                             tags=["vip"])  # fmt: skip
    shigoto.enqueue("tests.browser.workers.note", {"n": 43}, queue=queue_name)
    dashboard = dashboards(token=TOKEN, show_args="always")
    pages.open_page(page, dashboard, "jobs")
    pages.sign_in(page, TOKEN)  # tags are for signed-in viewers, and so is a filter on them
    pages.signed_in(page)
    form = page.locator("form[data-filter]")

    form.locator('input[name="queue"]').fill(queue_name)
    form.locator('input[name="args"]').fill('{"n": 42}')
    form.locator('button[type="submit"]').click()
    expect(page.locator(".job-list")).to_have_attribute("data-count", "1")
    assert pages.job_ids(page) == [wanted.id]
    assert "args=" in page.url, "the filter is in the link, so it survives a reload"
    page.reload()
    expect(page.locator('[data-view="jobs"][data-loaded="true"]')).to_be_visible()
    assert pages.job_ids(page) == [wanted.id]
    expect(form.locator('input[name="args"]')).to_have_value('{"n": 42}')

    form.locator('input[name="args"]').fill("[1, 2]")
    form.locator('button[type="submit"]').click()
    expect(form.locator('input[name="args"]')).to_have_attribute("aria-invalid", "true")
    expect(page.locator("[data-filter-error]")).to_contain_text("Args contain: ")
    expect(page.locator("tr[data-job-id]")).to_have_count(0)

    form.locator('input[name="args"]').fill("")
    form.locator('input[name="tag"]').fill("vip")
    form.locator('button[type="submit"]').click()
    expect(form.locator('input[name="args"]')).not_to_have_attribute("aria-invalid", "true")
    expect(page.locator(".job-list")).to_have_attribute("data-count", "1")
    assert pages.job_ids(page) == [wanted.id]
    tagged = conn.execute("SELECT id FROM shigoto_jobs WHERE 'vip' = ANY(tags)").fetchall()
    assert [r[0] for r in tagged] == [wanted.id]

    # An args filter searches ARGS_SCAN ids per page. With the newest match twice that far
    # above the wanted one, a page comes back short and one empty, each saying how far it
    # searched, and "next" still leads on to the wanted job.
    conn.execute("SELECT setval(pg_get_serial_sequence('shigoto_jobs', 'id'), "
                 "(SELECT max(id) FROM shigoto_jobs) + %s)", (2 * ARGS_SCAN,))  # fmt: skip
    newer = shigoto.enqueue("tests.browser.workers.note", {"n": 42}, queue=queue_name)
    form.locator('input[name="tag"]').fill("")
    form.locator('input[name="args"]').fill('{"n": 42}')
    form.locator('button[type="submit"]').click()
    note = page.locator("[data-scan-note]")
    expect(note).to_be_visible()
    expect(page.locator(".job-list")).to_have_attribute("data-count", "1")
    assert pages.job_ids(page) == [newer.id]
    expect(note).to_contain_text(f"Searched jobs down to #{newer.id + 1 - ARGS_SCAN}")
    found: list[int] = []
    empty_pages = 0
    for _ in range(4):  # the wanted job is at most three pages further down
        cursor = page.locator('button[data-page="next"]').get_attribute("data-cursor")
        assert cursor, "a short or empty page is not the end"
        page.click('button[data-page="next"]')
        expect(page.locator(".job-list")).to_have_attribute("data-after", cursor)
        found = pages.job_ids(page)
        if found:
            break
        expect(page.locator("[data-empty]")).to_contain_text("No matches among the jobs searched")
        expect(note).to_contain_text("Searched jobs down to #")
        empty_pages += 1
    assert found == [wanted.id] and empty_pages >= 1


def test_encrypted_args_stay_hidden_from_everyone(
    page: Page, dashboards: Dashboards, conn: psycopg.Connection[Any]
) -> None:
    """Even with --show-args always and a signed-in viewer, sealed args are never opened."""
    from shigoto.db import insert_encryption
    from shigoto.encryption import Key, KeyRing, sealing
    from tests.support import encryption_workers
    from tests.support.encryption_workers import SECRET

    sealing.use_keys(KeyRing([Key.from_secret(b"k" * 32)]))
    try:
        job = shigoto.enqueue(encryption_workers.charge, {"card": SECRET})
    finally:
        sealing.reload_keys()
        insert_encryption._ENCRYPTED_QUEUES.clear()  # as the encryption tests do: no state left
    assert SECRET not in json.dumps(row(conn, job.id)["args"]), "sealed in the database"
    dashboard = dashboards(token=TOKEN, show_args="always")
    pages.open_page(page, dashboard, f"jobs/{job.id}")
    pages.sign_in(page, TOKEN)
    pages.signed_in(page)

    args = page.locator('[data-view="job"] [data-field="args"]')
    expect(args.locator('[data-hidden="encrypted"]')).to_contain_text("Encrypted")
    pages.open_page(page, dashboard, "jobs")
    expect(page.locator(f'tr[data-job-id="{job.id}"] .args-cell')).to_have_text(
        "\u2039encrypted\u203a"
    )
    assert SECRET not in page.content()
