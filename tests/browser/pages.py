"""What the browser tests do on the dashboard's pages, named for the user's steps.

Waiting uses Playwright's `expect`, which retries until the page shows the condition (bounded
by a deadline); nothing here sleeps.
"""

from __future__ import annotations

import os
from pathlib import Path

from playwright.sync_api import Locator, Page, expect

from tests.browser.dashboard_process import DashboardProcess


def open_page(page: Page, dashboard: DashboardProcess, route: str) -> None:
    """Go to `#/<route>` and wait until its view is drawn from the server's data."""
    page.goto(f"{dashboard.url}/#/{route}")
    view = route.split("?", 1)[0].split("/", 1)[0]
    name = "job" if route.startswith("jobs/") else view
    expect(page.locator(f'[data-view="{name}"][data-loaded="true"]')).to_be_visible()


def sign_in(page: Page, token: str) -> None:
    page.fill('input[name="token"]', token)
    page.click('button[data-action="sign-in"]')


def signed_in(page: Page) -> None:
    expect(page.locator('button[data-action="sign-out"]')).to_be_visible()
    expect(page.locator('input[name="token"]')).to_be_hidden()


def flash(page: Page) -> str:
    box = page.locator("[data-flash]")
    expect(box).to_be_visible()
    return box.inner_text().strip()


def expect_flash(page: Page, *, error: bool, containing: str) -> None:
    box = page.locator("[data-flash]")
    expect(box).to_be_visible()
    expect(box).to_contain_text(containing)
    expect(box).to_have_attribute("data-kind", "error" if error else "ok")


def job_ids(page: Page) -> list[int]:
    """The ids of the job rows shown, top to bottom."""
    values = page.locator("tr[data-job-id]").evaluate_all(
        "rows => rows.map(row => row.dataset.jobId)"
    )
    return [int(v) for v in values]


def ids_in(rows: Locator) -> list[int]:
    """The job ids of the rows a locator finds."""
    return [int(v) for v in rows.evaluate_all("rows => rows.map(row => row.dataset.jobId)")]


def row_state(page: Page, job_id: int) -> str:
    return page.locator(f'tr[data-job-id="{job_id}"] td[data-field="state"]').inner_text().strip()


def detail_state(page: Page) -> str:
    return page.locator('[data-view="job"] [data-field="state"]').inner_text().strip()


class Screenshots:
    """PNGs of the pages for docs/dashboard.md, taken only when SHIGOTO_DASHBOARD_SCREENSHOTS
    names a directory (`make`-free: `SHIGOTO_DASHBOARD_SCREENSHOTS=docs/images pytest
    tests/browser -n 0`); files are `dashboard-<name>.png`, one viewport (1280x800) each."""

    def __init__(self, page: Page) -> None:
        target = os.environ.get("SHIGOTO_DASHBOARD_SCREENSHOTS")
        self.page = page
        self.directory = Path(target) if target else None

    def take(self, name: str) -> None:
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        # The live badge is still connecting on the first page; wait for the settled state.
        expect(self.page.locator('[data-live="live"]')).to_be_visible()
        self.page.screenshot(path=str(self.directory / f"dashboard-{name}.png"))
