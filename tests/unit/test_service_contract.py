"""The service contract: start/stop/run_once, leadership in the base, crashes logged."""

from __future__ import annotations

import asyncio
import gc
import logging
import warnings

import pytest

from shigoto._service import Service, stop_all


class Counting(Service):
    name = "counting"

    def __init__(self, **kw: object) -> None:
        super().__init__(0.001, **kw)  # type: ignore[arg-type]
        self.ticks = 0

    async def run_once(self) -> int:
        self.ticks += 1
        return self.ticks


async def until(condition: object, limit: int = 5000) -> None:
    for _ in range(limit):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never held")


async def test_start_ticks_until_stop_and_stop_can_be_awaited() -> None:
    service = Counting()
    task = service.start()
    assert service.start() is task, "started once"
    await until(lambda: service.ticks >= 3)
    await service.stop()
    assert task.done() and service.stopping
    ticks = service.ticks
    await asyncio.sleep(0.01)
    assert service.ticks == ticks


async def test_a_leader_only_service_ticks_only_while_leading_and_asks_every_tick() -> None:
    leads = [False]
    asked = [0]

    def is_leader() -> bool:
        asked[0] += 1
        return leads[0]

    service = Counting(is_leader=is_leader)
    assert service.leader_only
    service.start()
    await until(lambda: asked[0] >= 1)
    assert service.ticks == 0
    leads[0] = True
    await until(lambda: service.ticks >= 2)
    leads[0] = False
    await asyncio.sleep(0.01)
    ticks, asked_before = service.ticks, asked[0]
    await until(lambda: asked[0] > asked_before + 1, limit=3000)
    assert service.ticks == ticks, "no tick after leadership was lost"
    await service.stop()


async def test_a_crashed_task_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Crashing(Counting):
        name = "crashing"

        async def wait_next(self, seconds: float) -> None:
            raise RuntimeError("the loop itself broke")

    caplog.set_level(logging.ERROR, logger="shigoto.crashing")
    service = Crashing()
    task = service.start()
    await asyncio.wait([task])
    [record] = [r for r in caplog.records if r.name == "shigoto.crashing"]
    assert "crashed" in record.getMessage() and "the loop itself broke" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[1] is task.exception()


async def test_a_failing_tick_calls_failed_and_keeps_going() -> None:
    class Failing(Counting):
        name = "failing"
        seen: list[str] = []

        async def run_once(self) -> int:
            await super().run_once()
            if self.ticks < 3:
                raise ValueError(f"bad tick {self.ticks}")
            return self.ticks

        def retry_wait(self, failures: int) -> float:
            return 0.0

        async def failed(self, exc: Exception) -> None:
            self.seen.append(str(exc))

    service = Failing()
    service.start()
    await until(lambda: service.ticks >= 4)
    await service.stop()
    assert service.seen == ["bad tick 1", "bad tick 2"]


async def test_stop_without_await_warns_nothing_and_on_stop_runs_once_the_loop_ends() -> None:
    stopped: list[str] = []

    class Cleaning(Counting):
        async def on_stop(self) -> None:
            stopped.append("done")

    service = Cleaning()
    service.start()
    await until(lambda: service.ticks >= 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        service.stop()  # not awaited
        gc.collect()
    await asyncio.wait([service.task] if service.task else [])
    assert stopped == ["done"]


async def test_stop_all_stops_every_service() -> None:
    services = [Counting(), Counting()]
    for service in services:
        service.start()
    await until(lambda: all(s.ticks for s in services))
    await stop_all(services, timeout=5)
    assert all(s.task is not None and s.task.done() for s in services)
