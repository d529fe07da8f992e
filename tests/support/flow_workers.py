"""Workers for the rate-limit, circuit-breaker and load-shedding tests, in runner subprocesses
and in-process.

Start times come from the jobs' own `attempted_at`, so most performs do nothing. The breaker's
worker fails while a flag row says so, which every runner process reads from the database.
The shedding workers record each attempt's start and end (tests/support/attempts.py); with
`SHIGOTO_TEST_SHED_LOG` set, the runner process importing this module also writes its load
shedding decisions and claims, in the order they happened, to a file in that folder (see
`record_shedding`).
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg

import shigoto
from shigoto import telemetry
from shigoto.flow.rate_limit import ALGORITHMS
from tests.support.attempts import recorded

#: Five per second (one window of 1 s), for every algorithm: `fast_<algorithm>`.
FAST = {alg: shigoto.RateLimit(5, 1.0, algorithm=alg) for alg in ALGORITHMS}


def _noop() -> None:
    return None


def _define_fast(algorithm: str) -> object:
    name = f"{__name__}.fast_{algorithm}"
    return shigoto.worker(_noop, name=name, queue="flow", max_attempts=1,
                          rate_limit=FAST[algorithm])  # fmt: skip


fast_gcra = _define_fast("gcra")
fast_token_bucket = _define_fast("token_bucket")
fast_sliding_window = _define_fast("sliding_window")
fast_leaky_bucket = _define_fast("leaky_bucket")


@shigoto.worker(queue="flow", max_attempts=1, rate_limit=shigoto.RateLimit(50, per=10.0))
def fifty_per_ten_seconds() -> None:
    """The issue's case: 50 per 10 s (gcra), across every runner."""


@shigoto.worker(queue="flow", max_attempts=1, rate_limit=shigoto.RateLimit(1, per=60.0))
def one_a_minute() -> None:
    """At its limit after its first job: the rest wait their turns, a minute apart."""


@shigoto.worker(queue="flow", max_attempts=1)
def unlimited() -> None:
    """Shares the queue with limited workers; must never wait for them."""


@shigoto.worker(queue="flow", max_attempts=1, rate_limit=shigoto.RateLimit(
    1, per=2.0, algorithm="sliding_window", by_partition=True))  # fmt: skip
def per_tenant() -> None:
    """One start per 2 s per partition key."""


FLAG_TABLE = "CREATE TABLE IF NOT EXISTS flow_flags (name text PRIMARY KEY)"


def _flag_set(name: str) -> bool:
    with psycopg.connect(os.environ["SHIGOTO_DATABASE_URL"], autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM flow_flags WHERE name = %s", (name,)).fetchone() \
            is not None  # fmt: skip


@shigoto.worker(queue="flow", max_attempts=1, circuit_breaker=shigoto.CircuitBreaker(
    failure_rate=0.5, min_calls=3, window=60.0, open_for=2.0, probes=1, close_after=2))  # fmt: skip
def flaky() -> None:
    """Fails while the flag `down` is set: its dependency is down."""
    if _flag_set("down"):
        raise ConnectionError("the dependency is down")


class NotOurFault(Exception):
    """A failure of the job's own input: the dependency is fine."""


def _dependency_errors(error: BaseException) -> bool:
    return isinstance(error, ConnectionError)


#: In-process tests make this worker fail with what they put here.
RAISE: list[BaseException] = []


@shigoto.worker(queue="flow", max_attempts=1, circuit_breaker=shigoto.CircuitBreaker(
    failure_rate=0.5, min_calls=2, window=60.0, open_for=0.5, close_after=1,
    classify=_dependency_errors))  # fmt: skip
def classified() -> None:
    """Fails with `RAISE[0]` when set; only ConnectionError counts against its breaker."""
    if RAISE:
        raise RAISE[0]


@shigoto.worker(queue="shed", max_attempts=1)
@recorded
async def loop_hog(ms: int = 20) -> None:
    """A real overload: an `async` perform that computes (here: sleeps) without awaiting holds
    the runner's event loop, so every job claimed behind it waits to start; a handful of them
    at once keeps claim-to-start latency above any small target for as long as they come."""
    time.sleep(ms / 1000)


@shigoto.worker(queue="shed", max_attempts=1)
@recorded
async def urgent() -> None:
    """The high-priority work a shedding runner keeps claiming; costs nothing itself."""


SHED_LOG = "SHIGOTO_TEST_SHED_LOG"


def _shed_line(event: str, meta: dict[str, Any]) -> str:
    if event == "shed.change":
        return f"shed {meta['min_priority']}"
    if event == "producer.claim":
        return "claim"
    return f"job {meta['job'].priority}"


def record_shedding(folder: str) -> None:
    """Append this process's `shed.change` events (`shed <floor>`), claims (`claim`) and the
    priority of each job claimed (`job <priority>`, after its claim's line) to one file, in
    the order the runner's loop emitted them: which floor every claim was made under is then
    read from the runner itself, with no clocks to compare."""
    path = os.path.join(folder, f"{os.getpid()}.shed")

    def write(event: str, _measurements: dict[str, Any], meta: dict[str, Any]) -> None:
        with open(path, "a", encoding="ascii") as fh:
            fh.write(_shed_line(event, meta) + "\n")

    telemetry.attach(write, ["shed.change", "producer.claim", "job.claim"])


if os.environ.get(SHED_LOG):
    record_shedding(os.environ[SHED_LOG])
