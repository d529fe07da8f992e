"""User middleware: code of yours around every job's execution and around every enqueue.

**Execution middleware** is `mw(job, call_next)`, a plain function or an `async def`. It may act
before and after `call_next(job)` (which returns the perform's result), change what the perform
gets (`call_next(dataclasses.replace(job, args=...))`), or not call it at all: its return value
is then the job's result. Raising `Snooze`, `Cancel` or `Discard` ends the attempt with that
outcome; any other exception is the job's failure, recorded exactly as if the perform had raised
it (same error entry, backoff, telemetry, `on_discard` after the last attempt).

Two places register it, one chain per job, outermost first:

- runner-wide: `use_middleware(mw)`, in a module the runner imports (`shigoto run --import`), so
  a runner and `drain_queue` in the same process run the same chain;
- per worker: `@shigoto.worker(middleware=[...])` (or the class attribute `middleware`).

Runner-wide middleware is a process-wide registry, not a `Runner(...)` option, for the same
reason workers are: `shigoto run` builds its runner from imported modules, and the testing
helpers (`drain_queue`, inline mode) have no runner object to configure, yet must run the same
chain as production.

**Enqueue middleware** is `mw(specs, call_next)` over the list of validated `JobSpec`s about to
be written (one for `enqueue`, the whole batch for `enqueue_many`, one level at a time for a
workflow): it returns `call_next(specs)`'s jobs, may pass changed specs on (`with_meta`,
`dataclasses.replace`), or refuse the write by raising, in which case nothing is written and the
caller gets the exception. `enqueue` runs sync middleware and `aenqueue` async middleware, so
one registered for both paths comes as twins: `use_enqueue_middleware(sync_mw, twin=async_mw)`.
A path that meets a middleware without its twin raises `ConfigurationError` before writing
anything: a middleware that enforces a rule must never be skipped silently.

Both registries are tuples replaced whole on change, so the hot paths read them without a lock
and an empty registry costs one truth test.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from shigoto.errors import ConfigurationError, ValidationError

if TYPE_CHECKING:
    from shigoto.job import Job
    from shigoto.jobspec import JobSpec

#: What an execution middleware is handed as `call_next` (sync middleware gets a plain
#: function, async middleware a coroutine function).
ExecutionMiddleware = Callable[..., Any]
#: Sync enqueue middleware: `mw(specs, call_next) -> list[Job]`.
EnqueueMiddleware = Callable[["list[JobSpec]", Callable[["list[JobSpec]"], "list[Job]"]], Any]
#: Async enqueue middleware: `async mw(specs, call_next) -> list[Job]`.
AsyncEnqueueMiddleware = Callable[
    ["list[JobSpec]", Callable[["list[JobSpec]"], Awaitable["list[Job]"]]], Awaitable[Any]
]

M = TypeVar("M", bound=Callable[..., Any])

_execution: tuple[ExecutionMiddleware, ...] = ()


@dataclass(frozen=True, slots=True)
class EnqueueTwins:
    """One registered enqueue middleware: its sync and async forms (either may be missing)."""

    sync: EnqueueMiddleware | None
    asynchronous: AsyncEnqueueMiddleware | None

    def name(self) -> str:
        return _name(self.sync or self.asynchronous)

    def holds(self, mw: Any) -> bool:
        """Whether `mw` is one of the forms (`==`: a bound method is a new object each time
        it is read, equal to the others)."""
        return mw is not None and mw in (self.sync, self.asynchronous)


_enqueue: tuple[EnqueueTwins, ...] = ()


def is_async(mw: Any) -> bool:
    """Whether `mw` is an `async def` function or an object with an `async def __call__`."""
    if inspect.iscoroutinefunction(mw):
        return True
    call = next((vars(k)["__call__"] for k in type(mw).__mro__ if "__call__" in vars(k)), None)
    return not inspect.isroutine(mw) and inspect.iscoroutinefunction(call)


def _name(mw: Any) -> str:
    return getattr(mw, "__qualname__", None) or type(mw).__qualname__


def _check_callable(field: str, mw: Any, shape: str) -> None:
    if not callable(mw):
        raise ValidationError(field, f"{mw!r} is not a callable {shape}")


# -- execution --------------------------------------------------------------------------------


def use_middleware(mw: M, *, outermost: bool = False) -> M:
    """Run `mw(job, call_next)` around every job this process executes, inside the middleware
    registered before it (outside all of it with `outermost=True`: tracing that should time
    the whole chain). Registering it again changes nothing. Returns `mw`, for decorators."""
    global _execution
    _check_callable("middleware", mw, "mw(job, call_next)")
    if mw not in _execution:
        _execution = (mw, *_execution) if outermost else (*_execution, mw)
    return mw


def remove_middleware(mw: Any) -> None:
    """Stop running `mw` around jobs; jobs already running keep the chain they started with."""
    global _execution
    _execution = tuple(m for m in _execution if m != mw)


def execution_middleware() -> tuple[ExecutionMiddleware, ...]:
    """The runner-wide execution middleware, outermost first."""
    return _execution


# -- enqueue ----------------------------------------------------------------------------------


def use_enqueue_middleware(mw: Any, *, twin: Any = None, outermost: bool = False) -> Any:
    """Run `mw(specs, call_next)` around every enqueue, inside those registered before it
    (outside them with `outermost=True`); `twin` is its other form (sync for an async `mw`,
    or async for a sync one) so both `enqueue` and `aenqueue` run it. Returns `mw`, so a
    middleware needing no twin works as a decorator."""
    global _enqueue
    _check_callable("mw", mw, "mw(specs, call_next)")
    if twin is not None:
        _check_callable("twin", twin, "mw(specs, call_next)")
        if is_async(twin) == is_async(mw):
            kind = "async" if is_async(mw) else "sync"
            raise ValidationError(
                "twin", f"{_name(mw)} and {_name(twin)} are both {kind}; the twin of a sync "
                "middleware is its async form, and the other way round",
            )  # fmt: skip
    sync, asynchronous = (twin, mw) if is_async(mw) else (mw, twin)
    if not any(t.holds(mw) for t in _enqueue):
        twins = EnqueueTwins(sync, asynchronous)
        _enqueue = (twins, *_enqueue) if outermost else (*_enqueue, twins)
    return mw


def remove_enqueue_middleware(mw: Any) -> None:
    """Stop running `mw` (either of its forms) around enqueues."""
    global _enqueue
    _enqueue = tuple(t for t in _enqueue if not t.holds(mw))


def enqueue_middleware() -> tuple[EnqueueTwins, ...]:
    """The registered enqueue middleware, outermost first."""
    return _enqueue


def sync_enqueue_chain() -> list[EnqueueMiddleware]:
    """The sync forms, for `enqueue`; ConfigurationError if one has only an async form."""
    missing = [t.name() for t in _enqueue if t.sync is None]
    if missing:
        raise ConfigurationError(
            f"enqueue middleware {', '.join(missing)} has no sync form, so enqueue() cannot "
            "run it; use aenqueue(), or register it with twin=<a sync form>"
        )
    return [t.sync for t in _enqueue if t.sync is not None]


def async_enqueue_chain() -> list[AsyncEnqueueMiddleware]:
    """The async forms, for `aenqueue`; ConfigurationError if one has only a sync form."""
    missing = [t.name() for t in _enqueue if t.asynchronous is None]
    if missing:
        raise ConfigurationError(
            f"enqueue middleware {', '.join(missing)} has no async form, so aenqueue() cannot "
            "run it; use enqueue(), or register it with twin=<an async form>"
        )
    return [t.asynchronous for t in _enqueue if t.asynchronous is not None]


# -- helpers for enqueue middleware -----------------------------------------------------------


def spec_meta(spec: JobSpec) -> dict[str, Any]:
    """A spec's meta as a dict (specs carry it serialised)."""
    meta = json.loads(spec.meta_json)
    return meta if isinstance(meta, dict) else {}


def with_meta(spec: JobSpec, values: dict[str, Any]) -> JobSpec:
    """`spec` with `values` merged into its meta (they win). Values must be plain JSON."""
    try:
        text = json.dumps({**spec_meta(spec), **values}, allow_nan=False, ensure_ascii=False,
                          separators=(",", ":"))  # fmt: skip
    except (TypeError, ValueError) as exc:
        raise ValidationError("meta", f"enqueue middleware added a value that is not JSON: "
                                      f"{exc}") from None  # fmt: skip
    return replace(spec, meta_json=text)


# The shipped middlewares (log context, deadlines), registered like any other.
from shigoto.middleware.shipped import deadline, log_context  # noqa: E402

__all__ = [
    "AsyncEnqueueMiddleware",
    "EnqueueMiddleware",
    "EnqueueTwins",
    "ExecutionMiddleware",
    "deadline",
    "enqueue_middleware",
    "execution_middleware",
    "is_async",
    "log_context",
    "remove_enqueue_middleware",
    "remove_middleware",
    "spec_meta",
    "use_enqueue_middleware",
    "use_middleware",
    "with_meta",
]  # fmt: skip
