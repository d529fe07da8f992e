"""Failing background ticks back off, within a bound that keeps heartbeats meaningful."""

from __future__ import annotations

import pytest

from shigoto._service import FAILURE_BACKOFF_INTERVALS, failure_wait


def test_first_failure_waits_one_interval_then_doubles() -> None:
    assert [failure_wait(1.0, n) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]


@pytest.mark.parametrize("interval", [0.5, 1.0, 5.0, 60.0, 3600.0])
def test_wait_is_capped(interval: float) -> None:
    waits = [failure_wait(interval, n) for n in range(1, 40)]
    assert max(waits) <= interval * FAILURE_BACKOFF_INTERVALS
    assert max(waits) <= interval + 30.0
    assert min(waits) == interval


async def test_a_lasting_error_is_logged_once_and_recovery_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from shigoto._service import Service

    class Flaky(Service):
        name = "flaky"

        def __init__(self) -> None:
            super().__init__(interval=0.001)
            self.calls = 0

        async def run_once(self) -> None:
            self.calls += 1
            if self.calls <= 5:
                raise RuntimeError("relation shigoto_cron does not exist")
            self.stop()

    caplog.set_level("DEBUG", logger="shigoto.flaky")
    service = Flaky()
    await service.run()
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "does not exist" in warnings[0].getMessage()
    assert [r.getMessage() for r in caplog.records if r.levelname == "INFO"] == [
        "flaky recovered after 5 failed ticks"
    ]
