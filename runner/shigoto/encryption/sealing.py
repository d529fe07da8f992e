"""The process's key ring, and encryption's place in the insert path.

Why a process-wide ring: every part of a process that seals or opens (the client's enqueue,
cron, the runner's executor) must agree on the keys, and `SHIGOTO_ENCRYPTION_KEYS` is one per
process anyway. It is read once, on first use (`process_ring`); `use_keys` replaces it for
code that keeps its keys elsewhere (a secret manager) and for tests. The runner reads it at
start, so a malformed variable stops it before it claims anything.

What this module gives `db.inserts` (which sits below this layer and cannot import it):

* `mark`: called with every batch after the insert hooks, before the unique resolver. It turns
  on `encrypted` for specs of queues this process knows to be encrypted (`shigoto_queues.
  encrypted`, learned from `set_queue` in this process or from the database refusing plaintext
  args, see migration 0018), and checks that a ring exists for every spec that will be sealed,
  so a missing key fails before a byte is written;
* `seal_args`: the args of one spec as the envelope bound to the id the insert reserved for
  it. The returned `Job` keeps its plaintext args: only the row is sealed.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from shigoto.db import inserts
from shigoto.encryption.envelope import (
    DecryptionError,
    Field,
    JobBinding,
    envelope_kid,
    is_envelope,
    seal,
    unseal,
)
from shigoto.encryption.forwarding import binding_for
from shigoto.encryption.keys import ENV_VAR, KeyRing, keys_from_env
from shigoto.errors import ConfigurationError

_UNSET: Any = object()
_ring: Any = _UNSET


def process_ring() -> KeyRing | None:
    """The ring of this process: `use_keys`'s, else `SHIGOTO_ENCRYPTION_KEYS` read once (None
    when it is unset: encryption off). A malformed variable raises ConfigurationError naming
    the position of the bad key."""
    global _ring
    if _ring is _UNSET:
        _ring = keys_from_env()
    return _ring  # type: ignore[no-any-return]


def use_keys(ring: KeyRing | None) -> None:
    """Make `ring` this process's ring (None: no keys, encrypted jobs are refused)."""
    global _ring
    _ring = ring


def reload_keys() -> None:
    """Forget the ring so the next use reads `SHIGOTO_ENCRYPTION_KEYS` again."""
    global _ring
    _ring = _UNSET


def require_ring(worker: str, queue: str) -> KeyRing:
    """The process ring, or ConfigurationError naming the variable, the worker and the queue:
    an encrypted job is never written in plaintext."""
    ring = process_ring()
    if ring is None:
        raise ConfigurationError(
            f"jobs of worker {worker} (queue {queue}) are stored encrypted, but no encryption "
            f"key is configured in this process; set {ENV_VAR} to one or more base64 keys, "
            "newest first (`shigoto keys generate` prints one), the same list as the runners"
        )
    return ring


def mark(specs: list[Any], context: inserts.InsertContext) -> list[Any]:
    """`specs` with `encrypted` on for those of known encrypted queues; every spec to seal
    has a ring. Costs a set lookup per batch when no queue of the schema is encrypted."""
    known = inserts.encrypted_queues(context.schema)
    out = specs
    if known:
        out = [dataclasses.replace(s, encrypted=True)
               if not s.encrypted and s.queue in known else s for s in specs]  # fmt: skip
    for spec in out:
        if spec.encrypted:
            require_ring(spec.worker, spec.queue)
    return out


def seal_args(spec: Any, job_id: int, schema: str) -> str:
    """The JSON text stored in `args` for `spec` as job `job_id`: its sealed envelope."""
    ring = require_ring(spec.worker, spec.queue)
    binding = JobBinding(schema=schema, queue=spec.queue, worker=spec.worker, job_id=job_id)
    envelope = seal(json.loads(spec.args_json), binding, "args", ring)
    return json.dumps(envelope, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class SealedValue:
    """A sealed value read from the database with the binding that opens it: what the
    runner's middleware hands on (a parent's result) for the executor to open, so a value that
    does not open fails the attempt the way sealed args do."""

    envelope: Any
    binding: JobBinding
    field: Field

    def open(self, ring: KeyRing | None) -> Any:
        """The plaintext; DecryptionError (naming the key id) when it cannot be opened."""
        if ring is None:
            raise no_ring_error(self.envelope, self.binding, self.field)
        return unseal(self.envelope, self.binding, self.field, ring)


def no_ring_error(envelope: Any, binding: JobBinding, field: str) -> DecryptionError:
    return DecryptionError(
        binding, field, envelope_kid(envelope),
        f"no encryption keys are configured in this process; set {ENV_VAR} (the key with "
        "this id among them) and restart it",
    )  # fmt: skip


def sealed_or_plain(value: Any, own: JobBinding, meta: Any, field: Field) -> Any:
    """`value` as read from a row of `own`: a `SealedValue` bound by the forwarding rule when
    it is an envelope, else unchanged."""
    if not is_envelope(value):
        return value
    return SealedValue(value, binding_for(own, meta, value), field)


inserts.set_encryption(mark, seal_args)
