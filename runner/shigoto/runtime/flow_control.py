"""Rate limits and circuit breakers of workers and queues, held in PostgreSQL for the fleet.

One `FlowControl` per runner plays three parts:

- an admission (`shigoto.runtime.admission`): a claimed job whose rate limit or circuit
  breaker does not admit it now is handed back, to wait without consuming an attempt, and the
  chain ends with `None`; an admitted job's outcome is handed to its `done` step and feeds its
  breaker;
- a claim plugin (`fragment`, over `excluded(conn, queue)`): the workers the next claim of
  `queue` should leave out (an open breaker), so the runner keeps executing other workers'
  jobs meanwhile;
- nothing else: the policies themselves are pure (`shigoto.flow`).

Rate limits reserve. Admitting a job locks its limiters' rows (worker, queue, per partition
when asked), asks the pure algorithm for the earliest start that keeps every bound, and
records that start in each limiter, in one transaction on the database clock. A start due now
runs; one due within the lead (`Lead`: at most `HOLD` seconds) waits in the runner (its
`attempted_at` is the reserved start); one further ahead goes back `scheduled` to be claimed
again that lead before its turn, its attempt given back and its reservation in `meta`, and the
claim that finds the
reservation starts it at its time without asking again. So a job waits exactly until its
turn, is never counted twice, and the runner keeps claiming other jobs meanwhile.

Reservations are taken in batches (`_Reservations`): the jobs admitted while one reservation
transaction is in flight all go in the next, which locks their limiters once and takes their
turns in arrival order (`shigoto.flow.rate_limit.reserve_in_order`, the same turns as one by
one). One transaction per job on a limiter's row serialised a whole fleet behind that row's
commits: about 4 ms each, 250 jobs a second whatever the concurrency (issue 26).

Breakers count outcomes. Each finished attempt of a worker with a breaker is recorded in its
row (a failure when the perform raised or timed out and `classify` agrees; a success when it
completed; a snooze, a cancel or a discard by intent counts as neither). While a breaker
blocks, `excluded` keeps its worker's jobs out of every claim; a job claimed anyway goes back
with its attempt given back. Workers and queues without limits pay nothing: no query at all.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from shigoto import registry, telemetry
from shigoto.clock import SYSTEM, Clock
from shigoto.db import flow_statements as fs
from shigoto.db import runtime_statements as statements
from shigoto.flow import CircuitBreaker, RateLimit
from shigoto.flow import circuit_breaker as machine
from shigoto.flow.rate_limit import reserve_in_order
from shigoto.job import Job, JobState
from shigoto.runtime.admission import RUN, Admitted, Done
from shigoto.runtime.outcome import Completion
from shigoto.runtime.plugins import ClaimAsk, Connection, Fragment
from shigoto.runtime.put_back import PutBack, put_back_on
from shigoto.runtime.runner_pool import RunnerPool

log = logging.getLogger("shigoto.flow")


#: Seconds: a job whose turn is at most this far ahead waits in its runner; one further ahead
#: is handed back and claimed again this long before its turn (more than the stager's default
#: half second, so it is back in a runner in time to start on the dot).
HOLD = 0.75
#: The shortest lead: what a claim takes even when the stager runs often.
MIN_LEAD = 0.25
#: Added to the slowest recent return of a handed-back job to make the lead.
LEAD_MARGIN = 0.15


class Lead:
    """How long before its turn a handed-back job should be made claimable again.

    A waiting job holds a slot of its runner, so the lead should be short; but a job claimed
    after its turn loses it (it takes a new one), so the lead must cover the stager's interval
    and the claim. Runners learn it: each reserved job claimed again tells how long after its
    wake-up time it was claimed; the lead is the slowest of the last `SAMPLES` such delays plus
    a margin, between `MIN_LEAD` and `HOLD` (the latter until anything is known).
    """

    SAMPLES = 64

    def __init__(self) -> None:
        self._delays: deque[float] = deque(maxlen=self.SAMPLES)

    def seen(self, delay: float) -> None:
        self._delays.append(max(0.0, delay))

    @property
    def seconds(self) -> float:
        if not self._delays:
            return HOLD
        return min(HOLD, max(MIN_LEAD, max(self._delays) + LEAD_MARGIN))


#: Seconds a job of a partition whose breaker blocks waits when no end is known (every probe
#: slot is taken): long enough not to spin, short enough to be the next probe.
PROBE_RETRY = 1.0


def limit_key(scope: str, name: str, partition: str | None, by_partition: bool) -> str:
    """`worker:<name>`, `queue:<name>`, or with `:<partition>` for a per-partition limit (jobs
    without a partition key share the unsuffixed one)."""
    if by_partition and partition is not None:
        return f"{scope}:{name}:{partition}"
    return f"{scope}:{name}"


@dataclass(frozen=True, slots=True)
class _Guard:
    """A job's breaker and what its admission decided."""

    breaker: CircuitBreaker
    key: str
    probe_started: float | None = None


class FlowControl:
    """Rate limits and circuit breakers of one runner (see the module's docstring)."""

    name = "flow_control"

    def __init__(
        self,
        pool: Callable[[], AsyncConnectionPool | None],
        stmts: statements.Statements,
        node: str,
        *,
        queue_rate_limit: Callable[[str], RateLimit | None],
        clock: Clock = SYSTEM,
    ) -> None:
        self._pool = RunnerPool(pool)
        self.put_back = PutBack(self._pool, stmts, node)
        self.stmts = stmts
        self.schema = stmts.schema
        self.node = node
        self.queue_rate_limit = queue_rate_limit
        self.clock = clock
        self._sql = {name: fs.compose(getattr(fs, name), self.schema) for name in (
            "LOCK_LIMITERS", "SAVE_LIMITERS", "HOLD_JOB", "HOLD_JOBS", "DEFER_RESERVED", "DEFER",
            "READ_BREAKER", "LOCK_BREAKER", "SAVE_BREAKER", "BLOCKED_WORKERS")}  # fmt: skip
        #: Jobs of breaker workers running now, and the error of a failed attempt among them
        #: (the completion carries the error's text; `classify` needs the exception itself).
        self._watching: set[int] = set()
        self._errors: dict[int, BaseException] = {}
        self._sink: int | None = None
        self.lead = Lead()
        self._reservations = _Reservations(self._reserve)

    @property
    def pool(self) -> AsyncConnectionPool:
        return self._pool()

    # --- the admission -------------------------------------------------------------------

    def applies(self, job: Job) -> bool:
        """Whether `admit` has anything to do: a breaker, or a rate limit of the worker or
        the queue, over the job (the limiter keys are left for `admit` to build)."""
        worker = registry.get(job.worker)
        return (getattr(worker, "circuit_breaker", None) is not None
                or getattr(worker, "rate_limit", None) is not None
                or self._queue_limit(job.queue) is not None)  # fmt: skip

    async def admit(self, job: Job) -> Admitted:
        """The admission: a breaker that refuses, or a rate limit whose turn is later, keeps
        the job (deferred to its turn, or handed back); an admitted job of a worker with a
        breaker has its outcome recorded once it ends (`done`)."""
        worker = registry.get(job.worker)
        limits = self._rate_limits(job, worker)
        breaker: CircuitBreaker | None = getattr(worker, "circuit_breaker", None)
        if not limits and breaker is None:
            return RUN
        guard = None
        if breaker is not None:
            guard = await self._breaker_admit(job, breaker)
            if guard is None:
                return Admitted.kept("its circuit breaker does not admit it now")
        if limits and not await self._rate_admit(job, limits):
            if guard is not None and guard.probe_started is not None:
                await self._record(job, guard, None)  # the probe slot goes to another job
            return Admitted.kept("its rate limit's turn is later")
        if guard is None:
            return RUN
        return Admitted.run(done=self._guarded(job, guard))

    def _rate_limits(self, job: Job, worker: Any) -> list[tuple[str, RateLimit]]:
        """The limits a job of `worker` in its queue is under, by limiter key."""
        found: list[tuple[str, RateLimit]] = []
        own: RateLimit | None = getattr(worker, "rate_limit", None)
        if own is not None:
            found.append((limit_key("worker", job.worker, job.partition_key, own.by_partition),
                          own))  # fmt: skip
        shared = self._queue_limit(job.queue)
        if shared is not None:
            found.append((limit_key("queue", job.queue, job.partition_key,
                                    shared.by_partition), shared))  # fmt: skip
        return found

    def _queue_limit(self, queue: str) -> RateLimit | None:
        """The queue's shared limit; one stored as JSON is read as such, and a setting that is
        not a valid limit is ignored (logged) rather than failing every job of the queue."""
        shared: Any = self.queue_rate_limit(queue)
        if shared is None or isinstance(shared, RateLimit):
            return shared
        try:
            return RateLimit.from_json(shared)
        except Exception as exc:
            log.warning("queue %s has an invalid rate limit, ignored: %s", queue, exc)
            return None

    # --- rate limits ---------------------------------------------------------------------

    async def _rate_admit(self, job: Job, limits: list[tuple[str, RateLimit]]) -> bool:
        """Whether `job` starts now (after waiting in place for a turn a moment ahead); if not,
        it was handed back to wait for its reserved turn."""
        reserved = self._reserved_start(job)
        claimed = job_claimed_at(job)
        if reserved is not None:
            self.lead.seen(claimed - job.scheduled_at.timestamp())  # type: ignore[union-attr]
        if reserved is not None and claimed <= reserved:
            await self._write_start(job, reserved)
            await self._sleep(reserved - claimed)
            return True
        # No reservation, or claimed after its reserved time: starting it now could put one
        # start too many in a window with the starts reserved after it, so it takes a turn
        # like any other job (its old slot stays unused: the bound errs on the safe side).
        lead = self.lead.seconds
        try:
            at, now, key = await self._reservations.ask(_TurnAsk(job, limits, claimed, lead))
        except Exception as exc:
            log.warning("could not check the rate limits of job %s: %s; handing it back",
                        job.id, exc, extra=_fields(job))  # fmt: skip
            await self.put_back([job.id], why="its rate limits could not be checked")
            return False
        if at - now > lead:
            self._deferred(job, at - now, "rate_limit", key)
            return False
        await self._sleep(at - now)
        return True

    async def _reserve(self, asks: list[_TurnAsk]) -> list[tuple[float, float, str]]:
        """One transaction for a batch of jobs: lock their limiters, take their turns in
        order, save the limiters, and record each job's fate (deferred to its turn, or held
        for a start a moment ahead). Each job's (turn, now, binding key)."""
        async with self.pool.connection() as conn, conn.transaction():
            keys = sorted({key for ask in asks for key, _ in ask.limits})
            cur = await conn.execute(self._sql["LOCK_LIMITERS"], {"keys": keys})
            rows = {key: (state, now) for key, state, now in await cur.fetchall()}
            now = max(now for _, now in rows.values())
            turns, states, booked = reserve_in_order(
                [ask.limits for ask in asks], {k: state for k, (state, _) in rows.items()}, now)
            await conn.execute(self._sql["SAVE_LIMITERS"], {
                "keys": list(states), "states": [Jsonb(s) for s in states.values()],
                "ats": [booked[key] for key in states]})  # fmt: skip
            held: list[tuple[int, float]] = []
            for ask, (at, _) in zip(asks, turns, strict=True):
                if at - now > ask.lead:
                    await conn.execute(self._sql["DEFER_RESERVED"], {
                        "id": ask.job.id, "node": self.node, "at": at,
                        "wake": at - ask.lead})  # fmt: skip
                elif at > ask.claimed:
                    # Its recorded start is its turn, not the claim that came before it.
                    held.append((ask.job.id, at))
            if held:
                await conn.execute(self._sql["HOLD_JOBS"], {
                    "ids": [i for i, _ in held], "ats": [at for _, at in held],
                    "node": self.node})  # fmt: skip
        return [(at, now, key) for at, key in turns]

    @staticmethod
    def _reserved_start(job: Job) -> float | None:
        """The start reserved for this very attempt by an earlier claim, if any: written with
        the attempt and the wake-up time it was handed back with, so a reservation never
        outlives a retry or a snooze."""
        slot = job.meta.get(fs.SLOT_META) if isinstance(job.meta, dict) else None
        if not isinstance(slot, dict) or slot.get("attempt") != job.attempt:
            return None
        try:
            at, wake = float(slot["at"]), float(slot["wake"])
        except (KeyError, TypeError, ValueError):
            return None
        if job.scheduled_at is None or abs(job.scheduled_at.timestamp() - wake) > 0.001:
            return None
        return at

    async def _write_start(self, job: Job, at: float) -> None:
        """Record `at`, the reserved turn, as the job's start (it starts then, not when it was
        claimed a moment before)."""
        try:
            async with self.pool.connection() as conn:
                await conn.execute(self._sql["HOLD_JOB"],
                                   {"id": job.id, "node": self.node, "at": at})  # fmt: skip
        except Exception as exc:  # the start shown is the claim's; the job still waits
            log.debug("could not record the reserved start of job %s: %s", job.id, exc)

    async def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds)

    # --- circuit breakers ----------------------------------------------------------------

    async def _breaker_admit(self, job: Job, breaker: CircuitBreaker) -> _Guard | None:
        """The job's guard if its breaker admits it; None if it was handed back."""
        key = limit_key("worker", job.worker, job.partition_key, breaker.by_partition)
        try:
            async with self.pool.connection() as conn:
                cur = await conn.execute(self._sql["READ_BREAKER"], {"key": key})
                row = await cur.fetchone()
                if row is None or row[0] == machine.CLOSED:
                    return _Guard(breaker, key)
                async with conn.transaction():
                    state, now = await self._lock_breaker(conn, job, key)
                    step = machine.admit(breaker, state, now)
                    if step.state != state:
                        await self._save_breaker(conn, key, step)
        except Exception as exc:
            log.warning("could not check the circuit breaker of job %s: %s; handing it back",
                        job.id, exc, extra=_fields(job))  # fmt: skip
            await self.put_back([job.id], why="its circuit breaker could not be checked")
            return None
        self._transitions(job, key, step.transitions)
        if step.admitted:
            return _Guard(breaker, key, now if step.probe else None)
        await self._wait_breaker(job, key, breaker, step.blocked_until, now)
        return None

    async def _wait_breaker(
        self, job: Job, key: str, breaker: CircuitBreaker, until: float | None, now: float
    ) -> None:
        """Hand back a job its breaker did not admit. A whole-worker breaker keeps the job
        available (the claim leaves it in place while the breaker blocks); one partition's
        breaker cannot be seen by the claim, so the job waits scheduled until it may run."""
        wake = until if until is not None else now + PROBE_RETRY
        try:
            async with self.pool.connection() as conn:
                if breaker.by_partition and job.partition_key is not None:
                    await conn.execute(self._sql["DEFER"],
                                       {"id": job.id, "node": self.node, "wake": wake})  # fmt: skip
                else:
                    await put_back_on(conn, self.stmts, self.node, [job.id])
        except Exception as exc:  # the rescuer returns it once its deadline has passed
            log.warning("could not hand job %s back: %s", job.id, exc, extra=_fields(job))
        self._deferred(job, max(0.0, wake - now), "circuit_open", key)

    def _guarded(self, job: Job, guard: _Guard) -> Done:
        """Watch the job's failures from now on; the returned step records its outcome in the
        breaker once the attempt has ended (an attempt that raised counts for nothing, but
        frees its probe slot)."""
        self._watch()
        self._watching.add(job.id)

        async def done(completion: Completion | None, raised: BaseException | None) -> None:
            self._watching.discard(job.id)
            error = self._errors.pop(job.id, None)
            if raised is not None:
                if guard.probe_started is not None:
                    await self._record(job, guard, None)
                return
            await self._record(job, guard, self._outcome(guard.breaker, completion, error))

        return done

    @staticmethod
    def _outcome(
        breaker: CircuitBreaker, completion: Completion | None, error: BaseException | None
    ) -> bool | None:
        """True for a failure the breaker counts, False for a success, None for neither."""
        if completion is None:
            return None
        if completion.state == JobState.COMPLETED:
            return False
        if completion.state in (JobState.RETRYABLE, JobState.DISCARDED) and not completion.snooze:
            return machine.is_failure(breaker, error)  # no error seen: a discard by intent
        return None

    async def _record(self, job: Job, guard: _Guard, failed: bool | None) -> None:
        """Record one finished call in the breaker's row; never fails the job."""
        if failed is None and guard.probe_started is None:
            return  # counts for nothing, frees nothing
        try:
            async with self.pool.connection() as conn, conn.transaction():
                state, now = await self._lock_breaker(conn, job, guard.key)
                step = machine.record(guard.breaker, state, now, failed,
                                      probe=guard.probe_started is not None,
                                      started=guard.probe_started)  # fmt: skip
                if step.state != state:
                    await self._save_breaker(conn, guard.key, step)
        except Exception as exc:
            log.warning("could not record the outcome of job %s in its circuit breaker: %s",
                        job.id, exc, extra=_fields(job))  # fmt: skip
            return
        self._transitions(job, guard.key, step.transitions)

    async def _lock_breaker(self, conn: Any, job: Job, key: str) -> tuple[dict[str, Any], float]:
        partition = job.partition_key if key != f"worker:{job.worker}" else None
        params = {"key": key, "worker": job.worker, "partition": partition}
        cur = await conn.execute(self._sql["LOCK_BREAKER"], params)
        state, now = await cur.fetchone()
        return dict(state or {}), float(now)

    async def _save_breaker(self, conn: Any, key: str, step: machine.Step) -> None:
        await conn.execute(self._sql["SAVE_BREAKER"], {
            "key": key, "status": machine.status(step.state), "state": Jsonb(step.state),
            "blocked": step.blocked_until})  # fmt: skip

    def _transitions(self, job: Job, key: str, moves: tuple[machine.Transition, ...]) -> None:
        partition = job.partition_key if key != f"worker:{job.worker}" else None
        for move in moves:
            telemetry.emit(
                "breaker.transition", {"calls": move.calls, "failures": move.failures},
                {"key": key, "worker": job.worker, "partition": partition,
                 "from": move.before, "to": move.after, "node": self.node},
            )  # fmt: skip
            log.info("circuit breaker %s: %s -> %s (%d calls, %d failures)", key, move.before,
                     move.after, move.calls, move.failures,
                     extra={"worker": job.worker, "breaker": key})  # fmt: skip

    def _watch(self) -> None:
        """Subscribe (once) to failed attempts, to keep the exception of a watched job. The
        subscription holds this object weakly and ends with it."""
        if self._sink is not None:
            return
        ref = weakref.ref(self)
        handle: list[int] = []

        def on_exception(_event: str, _measurements: dict[str, Any], meta: dict[str, Any]) -> None:
            flow = ref()
            if flow is None:
                telemetry.detach(handle[0])
                return
            job = meta.get("job")
            if meta.get("node") == flow.node and job is not None and job.id in flow._watching:
                flow._errors[job.id] = meta["error"]

        handle.append(telemetry.attach(on_exception, ["job.exception"]))
        self._sink = handle[0]

    # --- the claim -----------------------------------------------------------------------

    async def fragment(self, ask: ClaimAsk, conn: Connection) -> Fragment | None:
        """The claim plugin: leave out the workers whose breaker blocks."""
        blocked = await self.excluded(conn, ask.queue)
        return Fragment(leave_out=blocked) if blocked else None

    async def excluded(self, conn: Any, queue: str) -> list[str]:
        """Workers whose jobs the next claim of `queue` leaves where they are: those whose
        whole-worker breaker blocks (open, or every probe slot taken). No query when no
        registered worker has such a breaker."""
        keys = [f"worker:{w.name}" for w in registry.snapshot().values()
                if (b := getattr(w, "circuit_breaker", None)) is not None
                and not b.by_partition]  # fmt: skip
        if not keys:
            return []
        cur = await conn.execute(self._sql["BLOCKED_WORKERS"], {"keys": keys})
        return [row[0] for row in await cur.fetchall()]

    # --- shared --------------------------------------------------------------------------

    def _deferred(self, job: Job, wait: float, reason: str, key: str) -> None:
        telemetry.emit("flow.defer", {"wait": wait},
                       {"job": job, "node": self.node, "reason": reason, "key": key})  # fmt: skip
        log.debug("job %s (%s) waits %.3fs: %s %s", job.id, job.worker, wait, reason, key,
                  extra=_fields(job))  # fmt: skip


@dataclass(frozen=True)
class _TurnAsk:
    """One job waiting for its rate limits' turn: its limits by key, when it was claimed (a
    start after that is recorded as its start) and the lead (a turn further ahead defers it)."""

    job: Job
    limits: list[tuple[str, RateLimit]]
    claimed: float
    lead: float


class _Reservations:
    """Gathers the turn asks of the jobs admitted meanwhile and reserves them together: one
    batch in flight at a time, the next made of everything that arrived during it, in arrival
    order. A failed batch fails every ask in it (each job is then handed back)."""

    def __init__(
        self, reserve: Callable[[list[_TurnAsk]], Any]
    ) -> None:
        self._reserve = reserve
        self._waiting: list[tuple[_TurnAsk, asyncio.Future[tuple[float, float, str]]]] = []
        self._task: asyncio.Task[None] | None = None

    async def ask(self, turn: _TurnAsk) -> tuple[float, float, str]:
        future: asyncio.Future[tuple[float, float, str]] = (
            asyncio.get_running_loop().create_future())  # fmt: skip
        self._waiting.append((turn, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._serve())
        return await future

    async def _serve(self) -> None:
        while self._waiting:
            await asyncio.sleep(0)  # the admissions of this turn of the loop join the batch
            batch, self._waiting = self._waiting, []
            try:
                answers = await self._reserve([turn for turn, _ in batch])
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), answer in zip(batch, answers, strict=True):
                if not future.done():  # an ask cancelled meanwhile: its slot stays unused
                    future.set_result(answer)


def job_claimed_at(job: Job) -> float:
    """When the job was claimed, on the database clock (the claim stamps `attempted_at`)."""
    return job.attempted_at.timestamp() if job.attempted_at is not None else float("inf")


def _fields(job: Job) -> dict[str, Any]:
    return {"job_id": job.id, "worker": job.worker, "queue": job.queue}


__all__ = ["HOLD", "FlowControl", "Lead", "limit_key"]
