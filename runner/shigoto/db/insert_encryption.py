"""Encryption's place in the insert path, registered from above (`shigoto.encryption.sealing`).

`db` sits below `encryption` and cannot import it, yet an encrypted job's args must be sealed
for its id as it is written. So the insert path calls two steps that start as refusals and
that `encryption.sealing` replaces on import (`set_encryption`): `mark` flags the specs to
seal after the hooks ran, `seal` turns a spec's args into the envelope stored for its id.

Migration 0018's trigger refuses plaintext args for an encrypted queue; the insert path then
learns the queue here (`refused`) and, when nothing of the caller's is at stake, runs again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from shigoto.db.insert_hooks import InsertContext
from shigoto.errors import ConfigurationError

#: Marks a batch's specs to seal and checks a ring exists; runs after the hooks.
Mark = Callable[[list[Any], InsertContext], list[Any]]
#: The args text stored for a spec as job `id` in `schema`: the sealed envelope.
Seal = Callable[[Any, int, str], str]

#: The constraint name migration 0018's trigger raises with; its DETAIL is the queue.
ENCRYPTED_QUEUE_CHECK = "shigoto_jobs_encrypted_queue"


def _no_mark(specs: list[Any], context: InsertContext) -> list[Any]:
    return specs


def _no_seal(spec: Any, job_id: int, schema: str) -> str:
    raise ConfigurationError(
        f"worker {spec.worker} (queue {spec.queue}) is encrypted but shigoto.encryption is "
        "not loaded; import shigoto.encryption.sealing (jobspec does) before enqueueing"
    )


_mark: Mark = _no_mark
_seal: Seal = _no_seal

#: Queues known to be encrypted, by schema: set by `set_queue(encrypted=True)` in this process
#: and learned when migration 0018's trigger refuses plaintext args. Never emptied: a queue
#: that stops being encrypted still gets sealed args from this process, which is harmless.
_ENCRYPTED_QUEUES: dict[str, set[str]] = {}


def set_encryption(mark: Mark, seal: Seal) -> None:
    """Register encryption's marking and sealing steps (one registration per process)."""
    global _mark, _seal
    _mark, _seal = mark, seal


def mark(specs: list[Any], context: InsertContext) -> list[Any]:
    """The registered marking step: `specs` with those to seal flagged."""
    return _mark(specs, context)


def seal(spec: Any, job_id: int, schema: str) -> str:
    """The registered sealing step: the args stored for `spec` as job `job_id`."""
    return _seal(spec, job_id, schema)


def encrypted_queues(schema: str) -> frozenset[str]:
    return frozenset(_ENCRYPTED_QUEUES.get(schema, ()))


def know_encrypted(schema: str, queue: str) -> None:
    """Remember that `queue` of `schema` is encrypted: its next jobs are sealed."""
    _ENCRYPTED_QUEUES.setdefault(schema, set()).add(queue)


class EncryptedQueueError(ConfigurationError):
    """Migration 0018's trigger refused plaintext args for an encrypted queue. This process
    now knows the queue is encrypted; on an autocommit connection the insert is retried once,
    sealed; inside the caller's transaction the caller retries the transaction."""

    def __init__(self, queue: str, retried: bool) -> None:
        hint = "" if retried else "; this process now seals its jobs: retry the transaction"
        super().__init__(
            f"queue {queue} is encrypted (set_queue(..., encrypted=True)) and refuses plaintext "
            f"args{hint}; the enqueuing process needs SHIGOTO_ENCRYPTION_KEYS"
        )
        self.queue = queue


def retryable(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether a refused insert left nothing of the caller's behind, so it may run again."""
    return conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE


def refused(refusal: EncryptedQueueError, schema: str, retry: bool) -> bool:
    """Learn the encrypted queue the database named; re-raise unless the insert may run once
    more (its specs are then sealed). Returns whether a further refusal may still retry."""
    know_encrypted(schema, refusal.queue)
    if not retry:
        raise refusal
    return False
