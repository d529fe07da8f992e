"""One Queue resource per queue and database: who owns a queue, recorded in the database.

Two Queues naming one queue on one database would each rewrite its settings on every pass
(pause, limits, encryption would flap) and both scale runners on the same counts. So the first
Queue to reach a queue records itself in `shigoto_queues.owner` (migration 0025) as
`namespace/name/uid`, and every later one finds it owned, reports `QueueNameConflict` and
changes nothing. The record lives in the database, not in the operator's memory, so it holds
across operator restarts and between two operator replicas, and a claim is one atomic
statement that never replaces another owner.

The owner clears it when its Queue is deleted (`release`). A record can still outlive its
Queue: the object force-deleted past its finalizer, the database unreachable while it went, or
the Queue now naming another queue after an operator restart. Such a record is *stale* and is
taken over: when it names this very Queue's namespace and name (a deleted and re-created
object), or a Queue the API server says is gone, has another uid, or names another queue now
(`is_stale`, in `reconcile`, which may call the API). A Queue the operator may not read (403,
another team's namespace in a namespaced install) counts as alive.

One cluster per database and queue: a Queue in another cluster looks gone from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from shigoto_operator import k8s
from shigoto_operator.databases import Database
from shigoto_operator.dbcounts import QUERY_TIMEOUT
from shigoto_operator.spec import QueueSpec, SpecError, parse_queue
from shigoto_operator.status import QUEUE_NAME_CONFLICT, Problem

log = logging.getLogger("shigoto.operator.ownership")

Emit = Callable[[str, str, str], None]
#: (url, schema, queue): a queue on a database, as a Queue owns it.
Target = tuple[str, str, str]

_DB_ERRORS = (psycopg.Error, PoolTimeout, OSError, TimeoutError)

_READ = "SELECT owner FROM {queues} WHERE name = %(name)s"

# Inserts the queue's row, or fills its owner, only while the owner is the one expected (NULL
# for a free queue, the stale record being replaced): a concurrent claim by another Queue or
# another operator replica makes this return no row instead of overwriting it.
_CLAIM = """
INSERT INTO {queues} (name, owner) VALUES (%(name)s, %(owner)s)
ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner
    WHERE {queues}.owner IS NOT DISTINCT FROM %(expected)s::text
RETURNING owner
"""

# Only the owner lets go: a Queue that lost a race (or never owned it) clears nothing.
_RELEASE = "UPDATE {queues} SET owner = NULL WHERE name = %(name)s AND owner = %(owner)s"


def _compose(template: str, schema: str) -> sql.Composed:
    return sql.SQL(template).format(queues=sql.Identifier(schema, "shigoto_queues"))


def owner_of(namespace: str, name: str, uid: str) -> str:
    """The record of a Queue: `namespace/name/uid` (the uid tells a re-created object apart)."""
    return f"{namespace}/{name}/{uid}"


def parse_owner(owner: str) -> tuple[str, str, str] | None:
    """(namespace, name, uid) of a record, or None when it is not one this operator wrote."""
    parts = owner.split("/")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 and all(parts) else None


def describe_owner(owner: str) -> str:
    """`Queue namespace/name` for messages."""
    parsed = parse_owner(owner)
    return f"Queue {parsed[0]}/{parsed[1]}" if parsed else repr(owner)


@dataclass(frozen=True, slots=True)
class Claim:
    """The outcome of claiming a queue.

    `owned`: this Queue owns it (or ownership cannot be recorded: `unavailable`, a schema
    without the column); else `owner` is the record of the Queue that does. `replaced` is the
    stale record this claim took over, for an Event.
    """

    owned: bool
    owner: str | None = None
    replaced: str | None = None
    unavailable: bool = False


#: `is_stale(record)`: whether the Queue a record names is gone (see the module docstring).
StaleCheck = Callable[[str], Awaitable[bool]]


async def claim(
    pool: AsyncConnectionPool, schema: str, queue: str, me: str, is_stale: StaleCheck
) -> Claim:
    """Own `queue` as `me`, unless another live Queue does. One read when already owned."""
    try:
        async with pool.connection(timeout=QUERY_TIMEOUT) as conn:
            current = await _one(conn, _compose(_READ, schema), {"name": queue})
            if current == me:
                return Claim(owned=True)
            replaced = None
            if current is not None:
                if not await is_stale(current):
                    return Claim(owned=False, owner=current)
                replaced = current
            params = {"name": queue, "owner": me, "expected": replaced}
            taken = await _one(conn, _compose(_CLAIM, schema), params)
            if taken == me:
                return Claim(owned=True, replaced=replaced)
            # someone else claimed it between the read and the claim
            current = await _one(conn, _compose(_READ, schema), {"name": queue})
    except psycopg.errors.UndefinedColumn:
        log.warning("%s: shigoto_queues.owner is missing (migration 0025): queue %s is not "
                    "guarded against a second Queue", schema, queue)  # fmt: skip
        return Claim(owned=True, unavailable=True)
    return Claim(owned=current == me, owner=None if current == me else current)


async def release(conn: psycopg.AsyncConnection, schema: str, queue: str, me: str) -> bool:
    """Let go of `queue` if `me` owns it; whether it did. A schema without the column has
    nothing to release."""
    try:
        cur = await asyncio.wait_for(
            conn.execute(_compose(_RELEASE, schema), {"name": queue, "owner": me}),
            QUERY_TIMEOUT,
        )
    except psycopg.errors.UndefinedColumn:
        return False
    return cur.rowcount > 0


async def _one(
    conn: psycopg.AsyncConnection, stmt: sql.Composed, params: dict[str, object]
) -> str | None:
    cur = await asyncio.wait_for(conn.execute(stmt, params), QUERY_TIMEOUT)
    row = await cur.fetchone()
    return None if row is None else row[0]


def stale_check(namespace: str, name: str, queue: str) -> StaleCheck:
    """`is_stale` for the Queue `namespace/name` claiming `queue`: a record is stale when it
    names this Queue's predecessor (same namespace and name, another uid: the object was
    deleted and created again), or a Queue the API server says is gone, has another uid, or
    names another queue now. A record not in this operator's shape, or a Queue it may not
    read, is left alone."""

    async def is_stale(record: str) -> bool:
        parsed = parse_owner(record)
        if parsed is None:
            return False
        ns, owner_name, uid = parsed
        if (ns, owner_name) == (namespace, name):
            return True
        try:
            live = await k8s.get(k8s.QUEUES, ns, owner_name)
        except k8s.ApiError:
            return False
        if live is None or (live.get("metadata") or {}).get("uid") != uid:
            return True
        return ((live.get("spec") or {}).get("queueName") or owner_name) != queue

    return is_stale


# --- the reconciler's side ---------------------------------------------------------------------


async def own(
    spec: QueueSpec,
    db: Database,
    url: str,
    body: Mapping[str, Any],
    previously: Target | None,
    emit: Emit,
) -> tuple[Problem | None, Target | None]:
    """Claim the Queue's queue on its database: (problem, what it owns now). The problem is
    a QueueNameConflict when another Queue owns it. A queue this Queue owned before (renamed,
    or moved to another database) is let go once the new one is owned."""
    me = body_owner(body)
    is_stale = stale_check(spec.namespace, spec.name, spec.queue_name)
    try:
        result = await claim(db.pool, db.schema, spec.queue_name, me, is_stale)
    except _DB_ERRORS as exc:
        message = f"{db.name}: claiming queue {spec.queue_name}: {exc}"
        return Problem("DatabaseUnreachable", message), previously
    if not result.owned:
        return Problem(
            QUEUE_NAME_CONFLICT,
            f"queue {spec.queue_name} on {db.name} belongs to "
            f"{describe_owner(result.owner or '')}: this Queue changes nothing (no settings, "
            "no runner Deployment) while it does. Name another queue in spec.queueName, or "
            "delete the other Queue",
            reachable=True,
        ), previously
    if result.replaced is not None:
        emit("Normal", "QueueOwned", f"queue {spec.queue_name}: took over from "
             f"{describe_owner(result.replaced)}, which no longer owns it")  # fmt: skip
    target = (url, db.schema, spec.queue_name)
    if previously is not None and previously != target:
        with contextlib.suppress(*_DB_ERRORS):
            await release_target(previously, me)
    return None, target


def body_owner(body: Mapping[str, Any]) -> str:
    """The record of the Queue object `body`."""
    meta = body.get("metadata") or {}
    return owner_of(meta["namespace"], meta["name"], str(meta.get("uid") or ""))


async def release_target(target: Target, me: str) -> bool:
    """Let go of a queue through a short-lived connection (the database may be one the
    operator no longer keeps a pool for, or one behind a transaction pooler)."""
    url, schema, queue = target
    conn = await psycopg.AsyncConnection.connect(
        url, autocommit=True, connect_timeout=int(QUERY_TIMEOUT), prepare_threshold=None
    )
    async with conn:
        return await release(conn, schema, queue, me)


async def owned_target(body: Mapping[str, Any]) -> Target | None:
    """The queue a Queue would own, from its spec and Secret, when its reconciler left no
    memory of it (an operator restarted just before the deletion); None when the spec or the
    Secret is gone."""
    meta = body.get("metadata") or {}
    try:
        spec = parse_queue(meta["name"], meta["namespace"], body.get("spec"))
        ref = spec.database
        url = await k8s.secret_value(spec.namespace, ref.secret_name, ref.secret_key)
    except (SpecError, k8s.SecretError):
        return None
    return url, ref.schema, spec.queue_name
