"""The executor's side of encryption at rest (docs/encryption.md): one job's values opened
before its perform and sealed before its outcome leaves.

Sealed args, and sealed results of parents, are opened before the perform, so the perform,
`current_job()` and `on_discard` see plaintext (a child process of `isolation="process"` gets
the plaintext through its pipe, never the keys). A value that does not open (a missing key, an
altered or misplaced ciphertext) raises a `DecryptionError` naming the key id; the executor
fails the attempt with it, retried with backoff like any failure, so a key put back later lets
the job run; the perform never sees the envelope. The result of an `encrypted_result` worker
is sealed before the completion leaves. For a job whose args were sealed or whose worker is
encrypted (`confidential`), an exception's message and traceback may quote its args: its
`errors` entry keeps only the exception type in `error` and seals message and traceback in
`sealed` (`{"error": ..., "traceback": ...}`, field "error"); a `DecryptionError`, which names
key id and job only, is kept whole.

Every value is bound to its job (`JobBinding`: schema, queue, worker, id), so a ciphertext
copied onto another job does not open there. No I/O: the keys are a ring held in memory.
"""

from __future__ import annotations

import contextvars
import json
from dataclasses import replace
from typing import Any

from shigoto.context import _loaded_parent_results as loaded_parent_results
from shigoto.context import set_parent_results
from shigoto.encryption import DecryptionError, JobBinding, KeyRing, is_envelope, seal
from shigoto.encryption.sealing import SealedValue, sealed_or_plain
from shigoto.job import Job
from shigoto.runtime.outcome import storable_problem
from shigoto.worker import Worker


def confidential(job: Job, worker: Worker | None = None) -> bool:
    """Whether `job`'s error messages and tracebacks must stay out of its row and the log in
    plaintext: its args were sealed, or its worker is encrypted."""
    return is_envelope(job.args) or getattr(worker, "encrypted", False) is True


class JobEncryption:
    """Opens and seals the values of the jobs of one schema with one key ring (None: no keys,
    so sealed values do not open and results of `encrypted_result` workers are not stored)."""

    def __init__(self, schema: str, keys: KeyRing | None) -> None:
        self.schema = schema
        self.keys = keys

    def binding(self, job: Job) -> JobBinding:
        """What every value of `job` is sealed to."""
        return JobBinding(schema=self.schema, queue=job.queue, worker=job.worker, job_id=job.id)

    def open_args(self, job: Job) -> Job:
        """`job` with its args opened (a forwarded copy's by the forwarding rule), or
        DecryptionError naming the key id: the perform never runs on an envelope."""
        if not is_envelope(job.args):
            return job
        value = sealed_or_plain(job.args, self.binding(job), job.meta, "args")
        args = value.open(self.keys)
        if not isinstance(args, dict):  # sealed from a JSON object, so never for a real job
            raise DecryptionError(self.binding(job), "args", value.envelope.get("kid"),
                                  "the opened args are not a JSON object")  # fmt: skip
        return replace(job, args=args)

    def open_parents(self) -> contextvars.Token[dict[int, Any]] | None:
        """Open the sealed parents' results `ParentResults` handed on, for this task's
        `current_job().parent_results`; None when there was nothing to open."""
        results = loaded_parent_results()
        if not any(isinstance(v, SealedValue) for v in results.values()):
            return None
        opened = {k: v.open(self.keys) if isinstance(v, SealedValue) else v
                  for k, v in results.items()}  # fmt: skip
        return set_parent_results(opened)

    def seal_result(self, job: Job, result_json: str) -> tuple[str | None, str | None]:
        """An `encrypted_result` worker's result as its envelope; never stored in plaintext:
        without a ring the result is dropped with an error entry saying why."""
        if self.keys is None:
            return None, ("result not stored: the worker encrypts its results and this runner "
                          "has no encryption keys (SHIGOTO_ENCRYPTION_KEYS)")  # fmt: skip
        envelope = seal(json.loads(result_json), self.binding(job), "result", self.keys)
        text = json.dumps(envelope, separators=(",", ":"))
        problem = storable_problem(text)
        return (None, f"result not storable: {problem}") if problem else (text, None)

    def stored_error(self, job: Job, entry: dict[str, Any], sealed: bool) -> dict[str, Any]:
        """The error entry as written: an encrypted job's keeps only the exception type, its
        message and traceback sealed in `sealed` (dropped when this runner has no key)."""
        if not sealed or entry["error"].startswith(DecryptionError.__name__ + ":"):
            return entry
        kind = entry["error"].split(":", 1)[0]
        stored = {"attempt": entry["attempt"], "error": kind, "traceback": ""}
        if self.keys is not None:
            detail = {"error": entry["error"], "traceback": entry["traceback"]}
            stored["sealed"] = seal(detail, self.binding(job), "error", self.keys)
        return stored

    def opened_errors(self, job: Job) -> list[dict[str, Any]]:
        """`job.errors` with each sealed detail opened where this runner can (an entry that
        does not open stays as stored: it only describes a past attempt)."""
        out = []
        for entry in job.errors or []:
            envelope = entry.get("sealed") if isinstance(entry, dict) else None
            if is_envelope(envelope):
                try:
                    value = sealed_or_plain(envelope, self.binding(job), job.meta, "error")
                    detail = value.open(self.keys)
                    entry = {k: v for k, v in entry.items() if k != "sealed"} | detail
                except DecryptionError:
                    pass
            out.append(entry)
        return out


__all__ = ["JobEncryption", "confidential"]
