"""The worker of the cron leadership tests: a slot's job that does nothing, so the test reads
only which slots were enqueued (tests/integration/test_cron_leadership.py)."""

from __future__ import annotations

from typing import Any

import shigoto


@shigoto.worker
def tick(**args: Any) -> None:
    """A cron slot's job; its row (meta `cron` and `slot`) is what the tests count."""
