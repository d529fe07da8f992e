"""Fixtures of the browser tests: Debian's chromium driven by Playwright, a real `shigoto
dashboard` subprocess on the test's own database, and real runners (tests/conftest.py).

The browser is the system one (`chromium` on PATH, from Debian's package), never one that
Playwright downloads. Without it the tests fail, saying how to install it: `make test` installs
it, and a skipped browser test would let a broken dashboard pass unnoticed.

Each test gets its own Playwright instance and browser: the sync API runs an event loop of its
own, which must not outlive the test (the async tests that follow on the same xdist worker run
theirs).
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.browser.dashboard_process import DashboardProcess, started_dashboards
from tests.support.system_tools import missing

try:  # the test extra brings it; say so instead of failing at collection with a bare ImportError
    from playwright.sync_api import Browser, Page, expect, sync_playwright
except ImportError:  # pragma: no cover - environment problem, reported by the fixture
    sync_playwright = None
else:
    # A deadline for conditions, not a measure: on a loaded two-core machine a page of 500
    # rows may take seconds to fetch and draw, and a passing check returns as soon as it holds.
    expect.set_options(timeout=30_000)

VIEWPORT = {"width": 1280, "height": 800}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "browser: drives the dashboard in Debian's chromium through Playwright"
    )


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = shutil.which("chromium")
    if path is None:
        missing(
            "the browser tests need Debian's chromium on PATH: run `apt-get install chromium` "
            "(make test installs it when missing); Playwright's own browser download is not used"
        )
    if sync_playwright is None:
        pytest.fail("the browser tests need Playwright: pip install -e '.[test]'")
    return path


@pytest.fixture(scope="module")
def browser(chromium_path: str) -> Iterator[Browser]:
    """One chromium for a run of the module's tests: each test's page has a context of its own
    (its own cookies, storage and cache), so sharing the browser process only saves starting
    Playwright's driver and chromium for every test. Module-scoped, so it is stopped before a
    test of another module runs (Playwright's sync API keeps an event loop of its own)."""
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium_path, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh page (its own context, so its own sessionStorage); a JavaScript error on it fails
    the test."""
    context = browser.new_context(viewport=VIEWPORT, color_scheme="light")
    context.set_default_timeout(30_000)
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


@pytest.fixture
def dashboards(db_url: str, tmp_path: Path) -> Iterator[Callable[..., DashboardProcess]]:
    """`start(token=..., schema=..., show_args=...)`: a real `shigoto dashboard` on the test's
    database; stopped afterwards."""
    yield from started_dashboards(db_url, tmp_path / "dashboards")


@pytest.fixture
def queue_name() -> str:
    """A queue name of this test's own."""
    return f"browser-{uuid.uuid4().hex[:8]}"
