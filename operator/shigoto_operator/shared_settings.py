"""A queue's shared settings in its database, made to say what the Queue's spec says.

Paused, the global limit, dead-letter forwarding, fan-out, flow control and encryption live
in `shigoto_queues` for every runner (as `shigoto.set_queue` writes them); the operator keeps
them equal to the spec on every pass, and posts an Event only when one really changed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg
from psycopg_pool import PoolTimeout

from shigoto.client import queue_settings
from shigoto.errors import ValidationError
from shigoto_operator.databases import Database
from shigoto_operator.dbcounts import QUERY_TIMEOUT, Reading
from shigoto_operator.spec import JOB_DEFAULT_FIELDS, QueueSpec
from shigoto_operator.status import Problem

Emit = Callable[[str, str, str], None]

_DB_ERRORS = (psycopg.Error, PoolTimeout, OSError)


async def apply(spec: QueueSpec, db: Database, reading: Reading, emit: Emit) -> Problem | None:
    """Make the queue's shared settings (paused, global limit, dead-letter forwarding, fan-out,
    flow control)
    in the database say what the spec says; running runners pick a change up within seconds,
    and the forwarding trigger reads `forward` in each finishing transaction. Written through
    the database's own pool, which goes when the last object using the database does.

    The counts reading carries paused and the limit, so those are written only when they
    differ; `forward` and `fanout` are not in it, so they are written on every pass by
    statements that change the row only when it differs (and say whether it did): drift
    closes on the next poll and an Event reports only real changes."""
    wanted = (spec.paused, spec.global_concurrency)
    limits_differ = reading.paused is None or (reading.paused, reading.global_concurrency) != wanted
    forward = dict(spec.forward) if spec.forward else None
    try:
        async with db.pool.connection(timeout=QUERY_TIMEOUT) as conn:
            write = queue_settings.write_settings(
                conn,
                spec.database.schema,
                spec.queue_name,
                paused=spec.paused if limits_differ else None,
                global_concurrency=(
                    spec.global_concurrency if limits_differ else queue_settings.UNSET
                ),
                forward=forward,
                fanout=spec.fanout,
                fair=spec.fair,
                weight=spec.weight,
                partition_concurrency=spec.partition_concurrency,
                rate_limit=dict(spec.rate_limit) if spec.rate_limit else None,
                encrypted=spec.encrypt_queue,
                **(spec.job_defaults or {}),
            )
            changed = await asyncio.wait_for(write, QUERY_TIMEOUT)
    except _DB_ERRORS as exc:
        return Problem("DatabaseUnreachable", f"{db.name}: writing queue settings: {exc}")
    except ValidationError as exc:  # parse_queue checked it already; a guard, not a path
        return Problem("InvalidSpec", f"spec.{exc.field}: {exc.message}", reachable=True)
    if limits_differ:
        limit = spec.global_concurrency if spec.global_concurrency is not None else "none"
        emit(
            "Normal",
            "SettingsApplied",
            f"queue {spec.queue_name}: paused={str(spec.paused).lower()}, "
            f"globalConcurrency={limit}",
        )
    if "forward" in changed:
        described = ", ".join(f"{k} -> {v}" for k, v in (forward or {}).items()) or "none"
        emit("Normal", "ForwardApplied", f"queue {spec.queue_name}: forward {described}")
    if "fanout" in changed:
        emit(
            "Normal",
            "FanoutApplied",
            f"queue {spec.queue_name}: fanout={str(spec.fanout).lower()}",
        )
    if "encrypted" in changed:
        emit("Normal", "EncryptionApplied",
             f"queue {spec.queue_name}: encrypted={str(spec.encrypt_queue).lower()}")  # fmt: skip
    if changed & JOB_DEFAULT_COLUMNS:
        emit("Normal", "JobDefaultsApplied",
             f"queue {spec.queue_name}: {_describe_defaults(spec)}")  # fmt: skip
    flow = sorted(changed & FLOW_SETTINGS)
    if flow:
        emit("Normal", "FlowControlApplied",
             f"queue {spec.queue_name}: {_describe_flow(spec, flow)}")  # fmt: skip
    return None


#: The job defaults (`spec.jobDefaults`) as `write_settings` reports them changed.
JOB_DEFAULT_COLUMNS = frozenset(
    {"default_max_attempts", "default_priority", "default_timeout", "default_backoff"})  # fmt: skip


def _describe_defaults(spec: QueueSpec) -> str:
    """The queue's job defaults as the Queue spells them, for the Event."""
    names = {v: k for k, v in JOB_DEFAULT_FIELDS.items()}
    shown = [f"{names[key]}={value}" for key, value in (spec.job_defaults or {}).items()
             if value is not None]  # fmt: skip
    return "jobDefaults " + (", ".join(shown) or "none")


#: The flow-control settings (docs/flow-control.md) `write_settings` reports as changed.
FLOW_SETTINGS = frozenset({"fair", "weight", "partition_concurrency", "rate_limit"})


def _describe_flow(spec: QueueSpec, changed: list[str]) -> str:
    """The changed flow settings as the Queue spells them, for the Event."""
    values = {
        "fair": str(spec.fair).lower(),
        "weight": str(spec.weight),
        "partition_concurrency": str(spec.partition_concurrency or "none"),
        "rate_limit": (
            "none" if not spec.rate_limit
            else "{limit}/{per}s {algorithm} burst {burst}".format(**spec.rate_limit)
            + (" per partition" if spec.rate_limit["by_partition"] else "")
        ),
    }  # fmt: skip
    names = {"partition_concurrency": "partitionConcurrency", "rate_limit": "rateLimit"}
    return ", ".join(f"{names.get(key, key)}={values[key]}" for key in changed)
