"""User middleware without a database: the registries, kind detection, the enqueue chains,
and `UserChain` mixing sync and async steps on a single-thread pool, including cancellation."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest

import shigoto
from shigoto import middleware
from shigoto.client import enqueuing
from shigoto.job import Job, JobState
from shigoto.runtime.user_chain import UserChain

here: contextvars.ContextVar[str] = contextvars.ContextVar("here", default="unset")


def a_job(**args: Any) -> Job:
    return Job(id=1, queue="q", worker="w", args=args, state=JobState.EXECUTING, attempt=1,
               inserted_at=datetime.now(UTC))  # fmt: skip


@pytest.fixture(autouse=True)
def clean_registries() -> Iterator[None]:
    saved = (middleware._execution, middleware._enqueue)
    middleware._execution, middleware._enqueue = (), ()
    yield
    middleware._execution, middleware._enqueue = saved


# -- registries ------------------------------------------------------------------------------


def test_use_appends_once_and_outermost_goes_first() -> None:
    def a(job: Job, call_next: Any) -> Any: ...
    def b(job: Job, call_next: Any) -> Any: ...

    assert shigoto.use_middleware(a) is a
    shigoto.use_middleware(a)
    shigoto.use_middleware(b, outermost=True)
    assert middleware.execution_middleware() == (b, a)
    shigoto.remove_middleware(a)
    assert middleware.execution_middleware() == (b,)


def test_a_non_callable_is_refused() -> None:
    with pytest.raises(shigoto.ValidationError, match="not a callable"):
        shigoto.use_middleware("mod:attr")  # type: ignore[type-var]


def test_kinds_are_told_apart_for_functions_and_objects() -> None:
    class AsyncObject:
        async def __call__(self, job: Job, call_next: Any) -> Any: ...

    class SyncObject:
        def __call__(self, job: Job, call_next: Any) -> Any: ...

    async def f(job: Job, call_next: Any) -> Any: ...

    assert middleware.is_async(f) and middleware.is_async(AsyncObject())
    assert not middleware.is_async(SyncObject()) and not middleware.is_async(len)


def test_enqueue_twins_must_differ_in_kind_and_remove_by_either_form() -> None:
    def s(specs: Any, call_next: Any) -> Any: ...
    def s2(specs: Any, call_next: Any) -> Any: ...
    async def a(specs: Any, call_next: Any) -> Any: ...

    with pytest.raises(shigoto.ValidationError, match="both sync"):
        shigoto.use_enqueue_middleware(s, twin=s2)
    shigoto.use_enqueue_middleware(a, twin=s)
    assert middleware.sync_enqueue_chain() == [s] and middleware.async_enqueue_chain() == [a]
    shigoto.remove_enqueue_middleware(s)
    assert middleware.enqueue_middleware() == ()


def test_a_missing_form_is_a_configuration_error_on_that_path_only() -> None:
    async def only_async(specs: Any, call_next: Any) -> Any: ...

    shigoto.use_enqueue_middleware(only_async)
    assert middleware.async_enqueue_chain() == [only_async]
    with pytest.raises(shigoto.ConfigurationError, match="only_async has no sync form"):
        middleware.sync_enqueue_chain()


# -- the enqueue chain -------------------------------------------------------------------------


def test_with_nothing_registered_the_write_is_called_directly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def never() -> Any:
        raise AssertionError("the chain must not be built when nothing is registered")

    monkeypatch.setattr(middleware, "sync_enqueue_chain", never)
    assert enqueuing.through(["spec"], lambda specs: [f"job of {specs[0]}"]) == [  # type: ignore[list-item]
        "job of spec"
    ]


def test_enqueue_chain_runs_outermost_first_and_may_change_the_batch() -> None:
    calls: list[str] = []

    def named(name: str) -> Callable[..., Any]:
        def mw(specs: list[Any], call_next: Callable[..., Any]) -> Any:
            calls.append(name)
            return call_next([*specs, name])

        return mw

    shigoto.use_enqueue_middleware(named("a"))
    shigoto.use_enqueue_middleware(named("b"))
    assert enqueuing.through(["s"], lambda specs: specs) == ["s", "a", "b"]  # type: ignore[list-item]
    assert calls == ["a", "b"]


async def test_the_async_enqueue_chain_awaits_each_step() -> None:
    async def mw(specs: list[Any], call_next: Any) -> Any:
        return [*await call_next(specs), "after"]

    async def write(specs: list[Any]) -> list[Any]:
        return specs

    shigoto.use_enqueue_middleware(mw)
    assert await enqueuing.athrough(["s"], write) == ["s", "after"]  # type: ignore[list-item]


# -- UserChain ---------------------------------------------------------------------------------


class Harness:
    """`UserChain` as the executor drives it, over a pool of ONE thread (like drain_queue)."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="job")
        self.log: list[tuple[str, str]] = []

    def note(self, what: str) -> None:
        self.log.append((what, threading.current_thread().name))

    async def on_thread(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.wrap_future(self.pool.submit(contextvars.copy_context().run, fn))

    def chain(self, middlewares: list[Any], *, sync_perform: bool = True) -> UserChain:
        def perform(job: Job) -> Any:
            self.note("perform")
            return {"args": job.args, "here": here.get()}

        async def aperform(job: Job) -> Any:
            return perform(job)

        return UserChain(middlewares, perform=aperform, on_thread=self.on_thread,
                         sync_perform=perform if sync_perform else None)  # fmt: skip


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    h.pool.shutdown(wait=False, cancel_futures=True)


async def test_sync_async_sync_alternation_on_one_thread(harness: Harness) -> None:
    def s1(job: Job, call_next: Any) -> Any:
        harness.note("s1")
        here.set("from s1")
        return call_next(job)

    async def a1(job: Job, call_next: Any) -> Any:
        harness.note("a1")
        assert here.get() == "from s1"  # the thread's context crossed to the loop
        here.set("from a1")
        return await call_next(job)

    def s2(job: Job, call_next: Any) -> Any:
        harness.note("s2")
        return call_next(dataclasses.replace(job, args={"n": 2}))

    result = await harness.chain([s1, a1, s2])(a_job(n=1))
    assert result == {"args": {"n": 2}, "here": "from a1"}  # the loop's context came back
    names = [w for w, _ in harness.log]
    assert names == ["s1", "a1", "s2", "perform"]
    threads = {t for w, t in harness.log if w != "a1"}
    assert len(threads) == 1 and threads.pop().startswith("job")
    assert dict(harness.log)["a1"] == threading.current_thread().name


async def test_an_async_perform_after_sync_middleware_runs_on_the_loop(harness: Harness) -> None:
    def s1(job: Job, call_next: Any) -> Any:
        harness.note("s1")
        return call_next(job)

    await harness.chain([s1], sync_perform=False)(a_job())
    assert dict(harness.log)["perform"] == threading.current_thread().name
    assert dict(harness.log)["s1"].startswith("job")


async def test_exceptions_cross_both_ways_unchanged(harness: Harness) -> None:
    async def a1(job: Job, call_next: Any) -> Any:
        raise shigoto.Snooze(5)

    def s1(job: Job, call_next: Any) -> Any:
        with pytest.raises(shigoto.Snooze):
            call_next(job)
        raise KeyError("from the thread")

    with pytest.raises(KeyError, match="from the thread"):
        await harness.chain([s1, a1])(a_job())


async def test_cancelling_the_chain_cancels_the_steps_bridged_to_the_loop(
    harness: Harness,
) -> None:
    cancelled = asyncio.Event()
    thread_done = threading.Event()
    waiting = asyncio.Event()

    def s1(job: Job, call_next: Any) -> Any:
        try:
            return call_next(job)
        finally:
            thread_done.set()

    async def a1(job: Job, call_next: Any) -> Any:
        waiting.set()
        try:
            await asyncio.Event().wait()  # never set: only a cancel ends it
        except asyncio.CancelledError:
            cancelled.set()
            raise

    chain = harness.chain([s1, a1])
    task = asyncio.create_task(chain(a_job()))
    await asyncio.wait_for(waiting.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(cancelled.wait(), 10)
    assert await asyncio.to_thread(thread_done.wait, 10)  # the parked thread was let go


# -- the testing modes run both chains ---------------------------------------------------------


def test_inline_mode_runs_enqueue_and_execution_middleware() -> None:
    from shigoto import testing
    from shigoto.middleware import with_meta
    from tests.support import middleware_workers as mw

    def tenant(specs: list[Any], call_next: Any) -> Any:
        return call_next([with_meta(s, {"tenant": "acme"}) for s in specs])

    shigoto.use_enqueue_middleware(tenant)
    shigoto.use_middleware(mw.sync_mw("g"))
    mw.trail.clear()
    with testing.inline():
        job = shigoto.enqueue(mw.doubled, {"n": 4})
    assert job.meta == {"tenant": "acme"}
    assert job.result == 8  # the worker's own middleware ran too
    assert mw.trail.names() == ["g>", "<g"]
