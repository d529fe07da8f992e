"""A runner's liveness, as the other runners see it: what keeps its jobs counting against
global limits (`shigoto.runtime.global_limits`) while it lives, and no longer.

The rows of a runner that really died must stop counting, or its slots would be lost until the
rescuer returns its jobs (90 s by default). A row counts while its node *may be alive*:

- the node holds its liveness lock, a session advisory lock on the limiter's connection
  (released the instant the process dies), or
- the node proved itself (`shigoto_nodes.last_seen_at`, refreshed every `PROVE_INTERVAL`)
  within the last `GRACE` seconds: its lease, or
- the server itself started less than `RESTART_GRACE` seconds ago (every lock went with the
  restart; each runner gets that long to take its lock again).

A runner whose limiter connection was killed proves itself through its pool in the same tick
and takes its lock again on reconnect. A SIGKILLed runner's rows stop counting at most `GRACE`
seconds after its last proof, so its share of the limit is soon free again.

The fence. A runner cut off from the database (a network partition, or all its sessions killed
and not back) also loses its lock (at once, or whenever the server notices), and its lease
runs out `GRACE` seconds after its last proof, while its jobs would still run: the others would
start jobs in slots that are still busy. So a runner fences itself first (`Fence`): once its
last *successful* proof was *sent* more than `FENCE_AFTER` seconds ago, it claims and starts no
limited job (a queue with a global limit or a cap per partition, or a worker with a global
limit) and cancels those it runs: an async perform at its await, a sync one through
`current_job().cancelled`, an `isolation="process"` child killed. Why that is soon enough: a
proof sent at t commits at t or later on the database's clock, so the lease it gives lasts at
least until t + `GRACE`, while the fence closes at t + `FENCE_AFTER` on this runner's monotonic
clock; the `GRACE - FENCE_AFTER` seconds between are for the cancels to take effect. Only a
sync perform that ignores `current_job().cancelled` runs on past the fence: a thread cannot be
stopped.

What happens to a job the fence stopped: no outcome is written (it did not fail), and its row
stays `executing` (the runner cannot reach the database anyway). The first proof that gets
through again lifts the fence and puts the job back, `available` with its attempt given back,
like a shutdown's put-back; only the attempt that was stopped, still executing on this node,
so a job the rescuer returned meanwhile (and maybe this runner claimed again) is left alone. A
sync perform still on its thread is put back once it has left it. A runner that never comes
back has its jobs returned by the rescuer once its node is dead.

The numbers: proofs every second; `FENCE_AFTER` 3 s, so two proofs in a row may fail or be slow
before a runner stops its limited jobs (a single killed session costs none: the pool proves in
the same tick); `GRACE` 6 s, twice that, leaving 3 s for the cancels. A longer lease only
delays the moment the slots of a runner that died (SIGKILLed, or partitioned for good) are free
again: at most `GRACE` after its last proof. Every connect and statement of a proof has a
deadline (`PROVE_TIMEOUT`), so a hung connection is a failed proof, not a hung limiter; the
fence itself is a timer on the event loop, independent of any proof in flight.

A blocked event loop (a worker that blocks it) sends no proofs either, but its session, and so
its liveness lock, lives on: its rows never stopped counting. Its fence timer then fires late,
which a partition never makes it do, and the fence waits `STALL_RECHECK` more for the proof
the limiter sends as the loop resumes before it stops any job; new limited jobs wait meanwhile.

Without a session (the database URL is a transaction pooler and no direct URL was given,
docs/connections.md) there is no liveness lock: a session advisory lock taken through the
pooler would stay on whichever server session ran it, long after this runner. The runner then
counts by its lease alone, proving itself through the pool, and the fence gives a stall the
benefit of the doubt only while the lease still covers it (`Fence.lease`). What that costs: a
loop blocked for longer than `GRACE` lets the others start limited jobs in its slots until it
resumes and fences itself, and one blocked for longer than `rescue_after` has its jobs rescued
while they still run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from shigoto._service import Service
from shigoto.clock import SYSTEM, Clock, database_now
from shigoto.db import runtime_statements as statements
from shigoto.job import Job
from shigoto.runtime.put_back import put_back_on

log = logging.getLogger("shigoto.liveness")

#: How often (seconds) a runner proves it is alive: liveness lock held, `last_seen_at` fresh.
PROVE_INTERVAL = 1.0
#: T: seconds after the last successful proof was sent at which a runner stops its limited
#: jobs (the fence). Above two proof intervals, so one slow or lost proof never fences.
FENCE_AFTER = 3.0
#: L: how long (seconds) the rows of a runner that holds no liveness lock still count after its
#: last proof (its lease). Longer than `FENCE_AFTER` by the time its cancels may take; short,
#: since it is how long a dead runner's share of a limit stays taken.
GRACE = 6.0
#: How long (seconds) after the server started every executing row counts.
RESTART_GRACE = 15.0
#: Seconds a connect or a statement of the limiter may take before it counts as failed.
PROVE_TIMEOUT = 2.0
#: A fence timer that fires this late (seconds) found the event loop blocked (a worker that
#: blocks it): no proof could be sent meanwhile, yet the session, and so the liveness lock,
#: most likely outlived the stall.
STALL_SLACK = 0.25
#: How long (seconds) the fence then waits for the proof the limiter sends as the loop resumes,
#: before it closes. Safe while the stall ended `STALL_RECHECK` before the lease (a stall
#: longer than the lease on a session that died cannot be made up for by anything).
STALL_RECHECK = 0.5
#: Past the deadline of a timer, so that it never fires a hair before the fence closes.
_TIMER_SLACK = 0.001


def _nothing() -> None:
    """The default hook: a fence nobody acts on (a limiter outside a runner)."""


@dataclass(frozen=True, slots=True)
class _Stopped:
    """A limited job the fence stopped, or refused to start (`task` None)."""

    job: Job
    task: asyncio.Task[Any] | None


class Fence:
    """Whether this runner may run limited jobs now, and the jobs it stopped meanwhile.

    Closed until the first proof, and again once the last successful proof was sent more than
    `after` seconds ago (see the module docstring); a timer on the event loop calls `on_fence`
    at that moment, and a proof that gets through calls `on_lift`. The runner stops its limited
    jobs in `on_fence` and hands them here (`hold`); the limiter puts back those whose perform
    has stopped (`stopped`) once it proves itself again.
    """

    def __init__(self, clock: Clock = SYSTEM, after: float = FENCE_AFTER) -> None:
        self.clock = clock
        self.after = after
        #: Set when no liveness lock holds the rows while proofs stall (no session): how long
        #: a proof keeps them counting. A late timer then waits for a proof only within it.
        self.lease: float | None = None
        #: Called when the fence closes: stop the limited jobs running here.
        self.on_fence: Callable[[], None] = _nothing
        #: Called when a proof opens the fence again: claim limited jobs again.
        self.on_lift: Callable[[], object] = _nothing
        #: Whether a thread still runs the perform of a job (a sync perform that ignores its
        #: cancel): such a job is put back only once it has stopped.
        self.still_running: Callable[[int], bool] = lambda _job_id: False
        self._proved_at: float | None = None
        self._closed = True  # as `on_fence` and `on_lift` last left it
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0  # the loop time the timer is due at
        self._rechecking = False  # the timer fired late once: the next firing closes
        self._held: dict[int, _Stopped] = {}

    @property
    def fenced(self) -> bool:
        """Whether limited jobs must neither be claimed nor run here now."""
        proved = self._proved_at
        return proved is None or self.clock.monotonic() - proved > self.after

    def holding(self) -> set[int]:
        """Ids of the jobs stopped by the fence and not put back yet: their rows are this
        runner's to return, nobody else's."""
        return set(self._held)

    def proved(self, sent: float) -> None:
        """A proof sent at `sent` (this clock's monotonic time) succeeded."""
        before = self._proved_at
        if before is not None and sent <= before:
            return  # an older proof that was slow to return proves nothing new
        self._proved_at = sent
        if self.fenced:
            return  # sent too long ago to open anything: the timer in flight closes, if due
        self._arm()
        if self._closed:
            self._closed = False
            if before is not None:
                log.info("proved alive again: the fence is lifted (%d stopped jobs to put "
                         "back)", len(self._held))  # fmt: skip
            self.on_lift()

    def check(self) -> None:
        """Close the fence (calling `on_fence` once) if its time has come."""
        if self._closed or not self.fenced:
            return
        self._closed = True
        since = self.clock.monotonic() - (self._proved_at or 0.0)
        log.warning("no proof of this runner reached the database for %.1f s: fenced, "
                    "stopping its limited jobs until one does", since)  # fmt: skip
        self.on_fence()

    def _arm(self) -> None:
        """(Re)start the timer that closes the fence `after` seconds past the last proof."""
        if self._timer is not None:
            self._timer.cancel()
        assert self._proved_at is not None
        left = self._proved_at + self.after - self.clock.monotonic()
        self._set_timer(max(left, 0.0) + _TIMER_SLACK)
        self._rechecking = False

    def _set_timer(self, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self._due = loop.time() + delay
        self._timer = loop.call_later(delay, self._expire)

    def _expire(self) -> None:
        self._timer = None
        late = asyncio.get_running_loop().time() - self._due
        if (late > STALL_SLACK and not self._rechecking and not self._closed and self.fenced
                and self._lease_covers_recheck()):
            # The loop was blocked, not the network (a partition fires the timer on time):
            # the proof due meanwhile goes out now; give it a moment before stopping jobs.
            log.info("the event loop was blocked for %.1f s: waiting %.1f s for a proof "
                     "before fencing", late, STALL_RECHECK)  # fmt: skip
            self._rechecking = True
            self._set_timer(STALL_RECHECK)
            return
        self.check()
        if not self._closed:  # a clock that did not move with the loop's (a ManualClock)
            self._arm()

    def _lease_covers_recheck(self) -> bool:
        """Whether this runner's rows surely still count until a proof sent now could land:
        always while the liveness lock holds them; by the lease alone, only before it ends."""
        if self.lease is None:
            return True
        since = self.clock.monotonic() - (self._proved_at or 0.0)
        return since + STALL_RECHECK < self.lease

    def cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- the jobs it stopped --------------------------------------------------------------

    def hold(self, job: Job, task: asyncio.Task[Any] | None = None) -> None:
        """`job` was stopped by the fence (its task cancelled), or not started (no task): it
        stays executing until it is put back."""
        self._held[job.id] = _Stopped(job, task)

    def holds(self, job_id: int) -> bool:
        return job_id in self._held

    def stopped(self) -> list[Job]:
        """Held jobs that may be put back now: never started, or their task ended cancelled
        and no thread runs their perform any more. A task that ended otherwise had its
        outcome recorded after all (the perform ended as the cancel came, or an operator
        cancelled it too): that job is not held any more."""
        ready = []
        for job_id, held in list(self._held.items()):
            task = held.task
            if task is not None and not task.done():
                continue
            if task is not None and not task.cancelled():
                del self._held[job_id]
            elif not self.still_running(job_id):
                ready.append(held.job)
        return ready

    def forget(self, job_ids: list[int]) -> None:
        """These jobs were put back (or were no longer this runner's to put back)."""
        for job_id in job_ids:
            self._held.pop(job_id, None)


class Liveness(Service):
    """Keeps this runner provably alive for the limit counts of every runner, and fences it
    when it cannot (see the module docstring).

    Holds the liveness lock on a dedicated connection (application_name `shigoto-limiter`),
    takes it again after a reconnect, refreshes the node's `last_seen_at` every tick (through
    the pool when its own connection fails), tells `fence` when each successful proof was
    sent, and puts back the jobs the fence stopped once proofs get through again.

    `url` None: no session to hold a lock on (see the module docstring); every proof goes
    through the pool, and the fence trusts a stall only while the lease covers it.
    """

    name = "liveness"

    def __init__(
        self,
        url: str | None,
        schema: str,
        node: str,
        pool: AsyncConnectionPool | None = None,
        *,
        clock: Clock = SYSTEM,
        connect_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(PROVE_INTERVAL, clock=clock)
        self.url = url
        self.connect_kwargs = dict(connect_kwargs or {
            "autocommit": True, "application_name": f"shigoto-limiter:{node}"[:63]})  # fmt: skip
        self.schema = schema
        self.node = node
        self.pool = pool
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self.stmts = statements.statements(schema)
        self.fence = Fence(clock)
        #: Set once this runner's liveness lock is held (at once without a session: there is
        #: no lock to wait for). The runner claims nothing before: a job started before the
        #: lock, whose perform then blocks the loop, would look abandoned to the rescuer.
        self.locked = asyncio.Event()
        if url is None:
            self.fence.lease = GRACE
            self.locked.set()

    def retry_wait(self, failures: int) -> float:
        """A failed proof is retried on the next beat, never later: the fence lifts only when
        one gets through."""
        return self.interval

    async def run_once(self) -> None:
        try:
            await self._prove()
        except Exception:
            self.fence.check()  # the timer does it too; this covers a clock it does not follow
            raise
        await self._put_back_stopped()

    async def _prove(self) -> None:
        if self.url is None:  # no session, no lock: the lease is the proof
            await self._prove_through_pool()
            return
        try:
            await self._prove_on_own_connection()
            return
        except (psycopg.Error, OSError, TimeoutError) as exc:
            lost = self._conn is not None
            await self._drop()
            if self.pool is None:
                raise
            log.log(logging.WARNING if lost else logging.DEBUG,
                    "limiter connection %s, proving through the pool: %s",
                    "lost" if lost else "not back yet", str(exc) or type(exc).__name__)  # fmt: skip
        # Prove through the pool meanwhile: a killed limiter session must not make this
        # runner's jobs look abandoned while it reconnects.
        await self._prove_through_pool()

    async def _prove_through_pool(self) -> None:
        if self.pool is None:
            raise RuntimeError("no session URL and no pool: nothing to prove this runner on")
        async with self.pool.connection(timeout=PROVE_TIMEOUT) as conn:
            await self._prove_on(conn)

    async def _prove_on_own_connection(self) -> None:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            conn = await self._connect()
        await self._prove_on(conn)

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        """A new limiter session, holding the liveness lock (unless a session of this node
        that the server has not noticed is dead yet still does: it counts all the same)."""
        await self._drop()
        assert self.url is not None  # a lockless limiter never connects on its own
        # asyncio.timeout, never wait_for: on Python 3.11 wait_for can swallow a cancel that
        # lands as the inner call completes, and the runner's shutdown cancels this service.
        async with asyncio.timeout(PROVE_TIMEOUT):
            conn = await psycopg.AsyncConnection.connect(
                self.url, **self.connect_kwargs, connect_timeout=max(int(PROVE_TIMEOUT), 2),
            )  # fmt: skip
        self._conn = conn
        async with asyncio.timeout(PROVE_TIMEOUT):
            cur = await conn.execute(self.stmts.take_liveness, {"node": self.node})
        row = await cur.fetchone()
        if not (row and row[0]):
            log.warning("liveness lock of node %s is held by another session", self.node)
        self.locked.set()  # held here, or by a session of this node not yet noticed dead
        return conn

    async def wait_locked(self, timeout: float) -> bool:
        """Wait until the liveness lock is first held, at most `timeout` seconds; whether it
        is. Proofs go through the pool meanwhile (`_prove`), so the node stays fresh."""
        try:
            async with asyncio.timeout(timeout):
                await self.locked.wait()
        except TimeoutError:
            return False
        return True

    async def _prove_on(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Refresh `last_seen_at`; a proof counts from the moment it was sent, and only if it
        found the node's row (a node forgotten as dead is proved by its next heartbeat)."""
        sent = self.clock.monotonic()
        async with asyncio.timeout(PROVE_TIMEOUT):
            cur = await conn.execute(self.stmts.prove, self._params())
        if cur.rowcount == 1:
            self.fence.proved(sent)

    def _params(self) -> dict[str, Any]:
        return {"node": self.node, "now": database_now(self.clock)}

    async def _put_back_stopped(self) -> None:
        """Put back the jobs the fence stopped whose perform has ended: `available`, attempt
        given back. On failure they stay held, for the next tick."""
        jobs = self.fence.stopped()
        if not jobs or self.fence.fenced:
            return
        try:
            async with asyncio.timeout(PROVE_TIMEOUT):
                back = await self._put_back(jobs)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning("could not put back the %d jobs the fence stopped yet: %s", len(jobs),
                        str(exc) or type(exc).__name__)  # fmt: skip
            return
        self.fence.forget([job.id for job in jobs])
        log.info("put back %d limited jobs the fence had stopped", len(back),
                 extra={"node": self.node, "job_ids": back})  # fmt: skip

    async def _put_back(self, jobs: list[Job]) -> list[int]:
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return await self._put_back_on(conn, jobs)
        assert self.pool is not None, "no connection to put jobs back through"
        async with self.pool.connection(timeout=PROVE_TIMEOUT) as pooled:
            return await self._put_back_on(pooled, jobs)

    async def _put_back_on(self, conn: psycopg.AsyncConnection[Any], jobs: list[Job]) -> list[int]:
        """Lock the rows still executing the very attempts that were stopped, then put those
        back (the shutdown's put-back, which also honours a cancel asked meanwhile) and wake
        the runners of their queues."""
        params = {"ids": [j.id for j in jobs], "attempts": [j.attempt for j in jobs],
                  "node": self.node}  # fmt: skip
        async with conn.transaction():
            cur = await conn.execute(self.stmts.lock_stopped_attempts, params)
            ids = [int(r[0]) for r in await cur.fetchall()]
            if not ids:
                return []
            rows = await put_back_on(conn, self.stmts, self.node, ids, wake=True)
        return [job_id for job_id, _ in rows]

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()

    async def on_stop(self) -> None:
        self.fence.cancel_timer()
        await self._drop()

    async def close(self) -> None:
        """At the runner's exit: a last try at putting back what the fence stopped (the
        rescuer returns what is left once this node is gone), then the session ends."""
        self.stop()  # not awaited: a tick stuck connecting must not hold the shutdown up
        self.fence.cancel_timer()
        if self.fence.stopped():
            with contextlib.suppress(Exception):
                async with asyncio.timeout(PROVE_TIMEOUT):
                    await self._put_back_stopped()
        await self._drop()


__all__ = [
    "FENCE_AFTER", "GRACE", "PROVE_INTERVAL", "PROVE_TIMEOUT", "RESTART_GRACE", "Fence",
    "Liveness",
]  # fmt: skip
