"""Which job a sealed value of a forwarded copy belongs to.

A forwarded job (migration 0011) is a new row, with another id and queue, whose `args` are the
original's `args` copied verbatim by a trigger, and whose `meta["forwarded_from"]["result"]` is
the previous row's `result`. Those envelopes are bound to the row that sealed them, so opening
them with the copy's own binding fails, by design. The database cannot re-seal them (it holds
no key), so the opener accepts the binding the envelope names under this rule:

* the envelope's `for` is the copy's own (queue, id): the ordinary case; or
* the row says it is a forwarded copy (`meta.forwarded_from` is an object), the queue the value
  was sealed for is on `meta.forward_chain` (the trigger lists there every queue the job has
  left, the first one included, across any number of hops), that queue is not the row's own,
  and the id it was sealed for is smaller than the row's (the original existed before its copy
  and both ids come from the table's one sequence).

Schema and worker always stay the row's own: forwarding changes neither, so a ciphertext moved
to another worker or schema still fails, as does any altered byte, and a `result` never opens
as `args` (the column is bound).

Why accepting this is safe: the rule only ever lets a row open a genuine value sealed for the
same worker in the same schema. Forging `meta` to pass it needs write access to the table, and
with that an attacker can already re-run the original with its genuine args by setting its
state back to `available` (what `shigoto retry` does). The rule grants nothing beyond that,
and it never lets one worker read what was sealed for another.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shigoto.encryption.envelope import JobBinding, is_envelope


def binding_for(own: JobBinding, meta: Any, envelope: Any) -> JobBinding:
    """The binding to open `envelope` (found in the row `own`, whose meta is `meta`) with.

    Returns `own` whenever the forwarding rule does not apply, so `unseal` reports the envelope
    as sealed for another job rather than this function guessing."""
    sealed_for = envelope.get("for") if is_envelope(envelope) else None
    if not _is_target(sealed_for):
        return own
    queue, job_id = sealed_for["queue"], sealed_for["id"]
    if (queue, job_id) == (own.queue, own.job_id):
        return own
    if not _forwarded_from(meta, queue) or queue == own.queue or job_id >= own.job_id:
        return own
    return JobBinding(schema=own.schema, queue=queue, worker=own.worker, job_id=job_id)


def _is_target(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and isinstance(value.get("queue"), str)
        and isinstance(value.get("id"), int)
        and not isinstance(value.get("id"), bool)
    )


def _forwarded_from(meta: Any, queue: str) -> bool:
    """Whether `meta` is a forwarded copy's and its chain of left queues holds `queue`."""
    if not isinstance(meta, Mapping) or not isinstance(meta.get("forwarded_from"), Mapping):
        return False
    chain = meta.get("forward_chain")
    return isinstance(chain, list) and queue in chain
