"""Defining workers: the `@worker` decorator, the `Worker` base class, and the registry.

Both forms end up as a `Worker` instance in the registry under their name, so the runner treats
them alike. Services enqueue by name and never need to import worker code.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import logging
import warnings
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, ClassVar, overload

from shigoto import flow, jobspec, registry
from shigoto.backoff import default_backoff
from shigoto.config import normalise_prefixes
from shigoto.errors import Discard, UnknownWorkerError, ValidationError
from shigoto.flow import CircuitBreaker, RateLimit
from shigoto.relations import unique as unique_jobs
from shigoto.signatures import args_misfit

log = logging.getLogger("shigoto.worker")

DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_TIMEOUT = 300.0
#: Where a sync perform runs: a thread of the runner, or a child process killed at its deadline.
ISOLATIONS = ("thread", "process")


def _validate_defaults(
    name: str, max_attempts: int | None, timeout: float | None, global_concurrency: int | None
) -> None:
    if global_concurrency is not None and (
        isinstance(global_concurrency, bool) or not isinstance(global_concurrency, int)
        or global_concurrency < 1
    ):  # fmt: skip
        raise ValidationError(
            "global_concurrency", f"worker {name} needs a whole number >= 1 (or None: no limit)"
        )
    if max_attempts is not None and (not isinstance(max_attempts, int) or max_attempts < 1):
        raise ValidationError("max_attempts", f"worker {name} needs max_attempts >= 1")
    if timeout is not None and (not isinstance(timeout, int | float) or timeout <= 0):
        raise ValidationError("timeout", f"worker {name} needs a positive timeout in seconds")


def _check_unique(name: str, unique: Any) -> None:
    """A worker's `unique=` default, checked when the worker is defined rather than at its
    first enqueue (dotted key paths into args are checked per job)."""
    try:
        unique_jobs.parse(unique)
    except ValidationError as exc:
        raise ValidationError(exc.field, f"worker {name}: {exc.message}") from None


def _check_extras(name: str, encrypted: Any, encrypted_result: Any, middleware: Any) -> None:
    """Encryption and middleware options, checked when the worker is defined."""
    for field, value in (("encrypted", encrypted), ("encrypted_result", encrypted_result)):
        if not isinstance(value, bool):
            raise ValidationError(field, f"worker {name} needs true or false, got {value!r}")
    if isinstance(middleware, str | bytes) or not isinstance(middleware, Sequence | tuple):
        raise ValidationError(
            "middleware", f"worker {name} needs a list of callables mw(job, call_next)"
        )
    for i, mw in enumerate(middleware):
        if not callable(mw):
            raise ValidationError(
                f"middleware[{i}]", f"worker {name}: {mw!r} is not a callable mw(job, call_next)"
            )


def _check_definition(name: str, module: str, named: bool, isolation: str) -> None:
    """Reject an unknown isolation; warn about a name no runner can import."""
    if isolation not in ISOLATIONS:
        raise ValidationError(
            "isolation", f"worker {name} needs one of {', '.join(ISOLATIONS)}, got {isolation!r}"
        )
    if module == "__main__" and not named:
        warnings.warn(
            f"worker {name} is defined in __main__, so its jobs are enqueued as {name!r}, a "
            "name no runner can import: move it into a module that runners import "
            "(--import) or give it an explicit name= that a runner registers",
            stacklevel=_outside_this_module(),
        )


def _outside_this_module() -> int:
    """The `stacklevel` of the first frame outside this module: the worker's definition."""
    frame, level = inspect.currentframe(), 0
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame, level = frame.f_back, level + 1
    return level


class Worker:
    """Base for class workers: override `perform(self, args)` and any callback.

    Subclasses register themselves under `name` (default `module.qualname`) when defined.
    """

    name: ClassVar[str] = ""
    queue: ClassVar[str | None] = None
    priority: ClassVar[int | None] = None
    max_attempts: ClassVar[int | None] = None
    timeout: ClassVar[float | None] = None
    tags: ClassVar[list[str] | None] = None
    #: At most this many of this worker's jobs execute at once across every runner.
    global_concurrency: ClassVar[int | None] = None
    #: "process": the sync perform runs in a child process, killed at its timeout or cancel.
    isolation: ClassVar[str] = "thread"
    #: Default `unique=` options of this worker's jobs (see `shigoto.enqueue`); an enqueue's
    #: own `unique=` replaces them, `unique=False` turns them off.
    unique: ClassVar[Mapping[str, Any] | bool | None] = None
    #: At most this many job starts per period across every runner (docs/flow-control.md).
    rate_limit: ClassVar[RateLimit | None] = None
    #: At most this many of this worker's jobs at once on one runner (a bulkhead), so a slow
    #: worker cannot take every slot of a queue it shares.
    concurrency: ClassVar[int | None] = None
    #: Stops running this worker's jobs while its failures pass a threshold.
    circuit_breaker: ClassVar[CircuitBreaker | None] = None
    #: Args stored encrypted (AES-256-GCM, keys from SHIGOTO_ENCRYPTION_KEYS); with
    #: `encrypted_result`, the result too (docs/encryption.md).
    encrypted: ClassVar[bool] = False
    encrypted_result: ClassVar[bool] = False
    #: This worker's own execution middleware, outermost first, inside the runner-wide chain:
    #: callables `mw(job, call_next)`, sync or async (docs/middleware.md).
    middleware: ClassVar[Sequence[Callable[..., Any]]] = ()

    def __init_subclass__(cls, template: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if template:
            return  # a base for other workers (FunctionWorker), not a worker itself
        named = bool(cls.__dict__.get("name"))
        if not named:
            cls.name = f"{cls.__module__}.{cls.__qualname__}"
        _check_definition(cls.name, cls.__module__, named, cls.isolation)
        _validate_defaults(cls.name, cls.max_attempts, cls.timeout, cls.global_concurrency)
        _check_unique(cls.name, cls.unique)
        flow.check_worker_options(cls.name, cls.rate_limit, cls.concurrency, cls.circuit_breaker)
        _check_extras(cls.name, cls.encrypted, cls.encrypted_result, cls.middleware)
        if not inspect.isabstract(cls) and cls.perform is not Worker.perform:
            register(cls())

    def perform(self, args: dict[str, Any]) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.perform is not implemented")

    def backoff(self, attempt: int, error: BaseException) -> float:
        """Seconds to wait before the next attempt after `attempt` failed with `error`."""
        return default_backoff(attempt)

    @property
    def sets_backoff(self) -> bool:
        """Whether this worker chose its own backoff: only then does it beat its queue's
        default backoff (`set_queue(..., backoff=...)`), as its other options do."""
        return type(self).backoff is not Worker.backoff

    def on_discard(self, args: dict[str, Any], errors: list[dict[str, Any]]) -> None:
        """Called once when the job is discarded for good, with every recorded error."""

    # -- what the runner needs; subclasses rarely override these --------------------------

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.perform)

    @property
    def on_discard_is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.on_discard)

    def call(self, args: dict[str, Any]) -> Any:
        """Invoke the perform in this worker's calling convention."""
        return self.perform(args)

    def resolved_max_attempts(self) -> int:
        return self.max_attempts or DEFAULT_MAX_ATTEMPTS

    def resolved_timeout(self) -> float:
        return self.timeout or DEFAULT_TIMEOUT

    def defaults(self) -> dict[str, Any]:
        """The enqueue defaults this worker supplies when enqueued as an object."""
        defaults = {
            "queue": self.queue,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "timeout": self.timeout,
            "tags": list(self.tags) if self.tags is not None else None,
        }
        if self.unique is not None:  # only when set: most workers have no unique default
            defaults["unique"] = self.unique
        return defaults

    @classmethod
    def new(cls, args: dict[str, Any] | None = None, **options: Any) -> jobspec.JobSpec:
        """This worker's job as a validated spec, with its defaults; pure, nothing is written.
        What `enqueue` would insert, for code that builds jobs before writing them."""
        return jobspec.build(cls, args, **options)

    @classmethod
    def enqueue(cls, args: dict[str, Any] | None = None, **options: Any) -> Any:
        """Enqueue a job for this worker with its defaults; set options with `options()`.

        Options passed here (`enqueue({...}, priority=5)`, the old way) still apply, with a
        DeprecationWarning: function workers cannot take options beside their args, so both
        kinds share the one way, `W.options(priority=5).enqueue({...})`.
        """
        from shigoto.client.enqueuing import enqueue

        if options:
            _warn_mixed_options(cls.name, options)
        return enqueue(lookup(cls.name), args, **options)

    @classmethod
    async def aenqueue(cls, args: dict[str, Any] | None = None) -> Any:
        """`enqueue` for asyncio; options come from `options()` as well."""
        from shigoto.client.enqueuing import aenqueue

        return await aenqueue(lookup(cls.name), args)

    @classmethod
    def options(cls, **options: Any) -> ClassEnqueueOptions:
        """Enqueue options (priority, schedule_in, conn, ...), as for a function worker:
        `ImportContacts.options(priority=5).enqueue({"file": "contacts.csv"})`. The names are
        checked here, before anything is written."""
        return ClassEnqueueOptions(lookup(cls.name), options)


def _warn_mixed_options(name: str, options: Mapping[str, Any]) -> None:
    """The DeprecationWarning of `W.enqueue(args, priority=...)`, naming the caller's line."""
    keys = sorted(options)
    warnings.warn(
        f"{name}.enqueue(args, {', '.join(f'{k}=...' for k in keys)}): options passed to a "
        f"class worker's enqueue are deprecated; write {name.rpartition('.')[2]}.options("
        f"{', '.join(f'{k}=...' for k in keys)}).enqueue(args) instead",
        DeprecationWarning,
        stacklevel=3,  # past this helper and Worker.enqueue
    )


class ClassEnqueueOptions:
    """A class worker with its enqueue options fixed; `.enqueue(args)` takes the args dict,
    as the worker's own `enqueue` does (a function worker's `options()` takes keywords,
    as its `enqueue` does)."""

    __slots__ = ("_options", "worker")

    def __init__(self, worker: Worker, options: Mapping[str, Any]) -> None:
        from shigoto.client.enqueue_plan import check_option_names

        check_option_names(options)
        self.worker = worker
        self._options = dict(options)

    def options(self, **more: Any) -> ClassEnqueueOptions:
        """These options plus `more` (which win)."""
        return ClassEnqueueOptions(self.worker, {**self._options, **more})

    def new(self, args: dict[str, Any] | None = None) -> jobspec.JobSpec:
        """The job as a validated spec with these options; pure, nothing is written."""
        return jobspec.build(self.worker, args, **self._options)

    def enqueue(self, args: dict[str, Any] | None = None) -> Any:
        from shigoto.client.enqueuing import enqueue

        return enqueue(self.worker, args, **self._options)

    async def aenqueue(self, args: dict[str, Any] | None = None) -> Any:
        from shigoto.client.enqueuing import aenqueue

        return await aenqueue(self.worker, args, **self._options)

    def __repr__(self) -> str:
        return f"<{self.worker.name} with {self._options!r}>"


class FunctionWorker(Worker, template=True):
    """A plain function (sync or async) promoted to a worker; called with args as kwargs."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        tags: list[str] | None = None,
        global_concurrency: int | None = None,
        backoff: Callable[[int, BaseException], float] | None = None,
        on_discard: Callable[[dict[str, Any], list[dict[str, Any]]], Any] | None = None,
        isolation: str = "thread",
        unique: Mapping[str, Any] | bool | None = None,
        rate_limit: RateLimit | None = None,
        concurrency: int | None = None,
        circuit_breaker: CircuitBreaker | None = None,
        encrypted: bool = False,
        encrypted_result: bool = False,
        middleware: Sequence[Callable[..., Any]] = (),
    ) -> None:
        self.fn = fn
        self.name = name or f"{fn.__module__}.{fn.__qualname__}"  # type: ignore[misc]
        _check_definition(self.name, fn.__module__, bool(name), isolation)
        self.isolation = isolation  # type: ignore[misc]
        _validate_defaults(self.name, max_attempts, timeout, global_concurrency)
        self.global_concurrency = global_concurrency  # type: ignore[misc]
        _check_unique(self.name, unique)
        self.unique = unique  # type: ignore[misc]
        flow.check_worker_options(self.name, rate_limit, concurrency, circuit_breaker)
        self.rate_limit = rate_limit  # type: ignore[misc]
        self.concurrency = concurrency  # type: ignore[misc]
        self.circuit_breaker = circuit_breaker  # type: ignore[misc]
        _check_extras(self.name, encrypted, encrypted_result, middleware)
        self.encrypted = encrypted  # type: ignore[misc]
        self.encrypted_result = encrypted_result  # type: ignore[misc]
        self.middleware = tuple(middleware)  # type: ignore[misc]
        self.queue = queue  # type: ignore[misc]
        self.priority = priority  # type: ignore[misc]
        self.max_attempts = max_attempts  # type: ignore[misc]
        self.timeout = timeout  # type: ignore[misc]
        self.tags = tags  # type: ignore[misc]
        self._backoff = backoff
        self._on_discard = on_discard
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    @property
    def on_discard_is_async(self) -> bool:
        return inspect.iscoroutinefunction(self._on_discard)

    def perform(self, args: dict[str, Any]) -> Any:
        try:
            return self.fn(**args)
        except TypeError as exc:
            misfit = args_misfit(self.fn, args)
            if misfit is None:
                raise  # raised inside the function: an ordinary failure, retried
            # Args that do not fit the signature fail the same way on every attempt.
            raise Discard(f"args do not fit {self.name}: {misfit}") from exc

    def backoff(self, attempt: int, error: BaseException) -> float:
        if self._backoff is not None:
            return self._backoff(attempt, error)
        return default_backoff(attempt)

    @property
    def sets_backoff(self) -> bool:
        return self._backoff is not None

    def on_discard(self, args: dict[str, Any], errors: list[dict[str, Any]]) -> Any:
        if self._on_discard is not None:
            return self._on_discard(args, errors)
        return None

    def new(  # type: ignore[override]
        self, args: dict[str, Any] | None = None, **options: Any
    ) -> jobspec.JobSpec:
        """The function's job as a validated spec (args checked against its signature); pure."""
        return jobspec.build(self, args, **options)

    def enqueue(self, **args: Any) -> Any:  # type: ignore[override]
        """Enqueue with the function's keyword arguments as the job's args."""
        from shigoto.client.enqueuing import enqueue_kwargs

        return enqueue_kwargs(self, args)

    async def aenqueue(self, **args: Any) -> Any:  # type: ignore[override]
        from shigoto.client.enqueuing import aenqueue_kwargs

        return await aenqueue_kwargs(self, args)

    def options(self, **options: Any) -> Any:  # type: ignore[override]
        """Enqueue options (priority, schedule_in, conn, ...) kept apart from the job's args:
        `w.options(priority=5).enqueue(user_id=1)`."""
        from shigoto.client.enqueuing import EnqueueOptions

        return EnqueueOptions(self, options)

    def __repr__(self) -> str:
        return f"<shigoto worker {self.name}>"


@overload
def worker(fn: Callable[..., Any], /) -> FunctionWorker: ...
@overload
def worker(
    *,
    name: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    timeout: float | None = None,
    tags: list[str] | None = None,
    global_concurrency: int | None = None,
    backoff: Callable[[int, BaseException], float] | None = None,
    on_discard: Callable[[dict[str, Any], list[dict[str, Any]]], Any] | None = None,
    isolation: str = "thread",
    unique: Mapping[str, Any] | bool | None = None,
    rate_limit: RateLimit | None = None,
    concurrency: int | None = None,
    circuit_breaker: CircuitBreaker | None = None,
    encrypted: bool = False,
    encrypted_result: bool = False,
    middleware: Sequence[Callable[..., Any]] = (),
) -> Callable[[Callable[..., Any]], FunctionWorker]: ...


def worker(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Turn a function into a registered worker: `@shigoto.worker` or `@shigoto.worker(...)`."""

    def wrap(f: Callable[..., Any]) -> FunctionWorker:
        w = FunctionWorker(f, **options)
        register(w)
        return w

    return wrap(fn) if fn is not None else wrap


def register(w: Worker) -> None:
    registry.register(w)


def lookup(name: str, prefixes: Iterable[str] = ()) -> Worker:
    """The registered worker called `name`.

    A job row is data anyone with INSERT on the table can write, so its worker name alone
    never makes this process import anything: workers come from the registry, filled by the
    modules given to `--import` / SHIGOTO_IMPORT (and whatever those import). Only a name under
    one of `prefixes` (packages the operator allowed with `--worker-prefix`) may import its
    module here; this import is blocking, so the runner calls it on a thread
    (`WorkerResolver.prepare`).
    """
    found = registry.get(name)
    if found is not None:
        return found
    allowed = normalise_prefixes(prefixes)
    if allowed and _allowed(name, allowed):
        _import_for(name, allowed)
        found = registry.get(name)
        if found is not None:
            return found
    raise UnknownWorkerError(name)


def _allowed(name: str, prefixes: tuple[str, ...]) -> bool:
    """Whether `name` lies inside one of `prefixes` (by whole dotted parts, never `__main__`)."""
    if "__main__" in name.split("."):
        return False  # running a package's __main__ is never what a worker name means
    return any(name.startswith(prefix + ".") for prefix in prefixes)


def _import_for(name: str, prefixes: tuple[str, ...]) -> None:
    """Import the longest dotted prefix of `name` that is a module inside `prefixes`."""
    module_name, _, _ = name.rpartition(".")
    while module_name and any(
        module_name == p or module_name.startswith(p + ".") for p in prefixes
    ):
        try:
            importlib.import_module(module_name)
        except ImportError as exc:
            if not _is_missing(exc, module_name):
                # The module exists but failed to import: that, not "unknown worker", is what
                # the user needs to see (a missing dependency, a typo in the module).
                raise ImportError(
                    f"worker {name}: importing {module_name} failed: {type(exc).__name__}: {exc}"
                ) from exc
            module_name, _, _ = module_name.rpartition(".")
            continue
        return


class WorkerResolver:
    """The runner's worker resolution: `resolver(name)` answers from the registry only (it
    runs on the event loop), and `await resolver.prepare(name)` first imports the module of a
    name under an allowed prefix on a thread, so import-time code never blocks the loop."""

    def __init__(self, prefixes: Iterable[str] = ()) -> None:
        self.prefixes = normalise_prefixes(prefixes)
        #: The import error of a name under an allowed prefix, reported instead of "unknown
        #: worker" (a missing dependency is what the user needs to see); bounded by real
        #: modules, since a name that imports nothing records nothing.
        self._failures: dict[str, ImportError] = {}

    def __call__(self, name: str) -> Worker:
        found = registry.get(name)
        if found is not None:
            return found
        failure = self._failures.get(name)
        if failure is not None:
            raise failure
        raise UnknownWorkerError(name)

    def may_import(self, name: str) -> bool:
        """Whether `prepare` would import anything for `name`: not registered yet, and under
        an allowed prefix."""
        return not registry.contains(name) and bool(self.prefixes) and _allowed(
            name, self.prefixes)  # fmt: skip

    async def prepare(self, name: str) -> None:
        """Import the module of `name` on a thread if it may be and is not registered yet.

        Failures are left for `__call__` (through the executor) to report as the attempt's
        error, so this never raises for an unknown or broken worker.
        """
        if not self.may_import(name):
            return
        try:
            await asyncio.to_thread(_import_for, name, self.prefixes)
        except ImportError as exc:
            self._failures[name] = exc


def _is_missing(exc: ImportError, module_name: str) -> bool:
    """Whether `exc` says `module_name` itself (or a package above it) does not exist."""
    missing = getattr(exc, "name", None)
    if not isinstance(exc, ModuleNotFoundError) or not missing:
        return False
    return module_name == missing or module_name.startswith(missing + ".")


def registered_names() -> Collection[str]:
    """The registered names, as a live view (no copy: metrics ask on every job event)."""
    return registry.names()


def registered() -> dict[str, Worker]:
    return registry.snapshot()
