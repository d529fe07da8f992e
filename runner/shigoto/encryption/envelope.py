"""Sealed values: AES-256-GCM envelopes for the jsonb columns `args` and `result`.

An envelope is a JSON object, so it fits the columns as they are:

    {"$shigoto_enc": 1, "kid": "<key id>", "for": {"queue": "<queue>", "id": <job id>},
     "nonce": "<base64url, 12 bytes>", "ct": "<base64url: ciphertext and 16-byte tag>"}

The plaintext is the canonical JSON of the value (sorted keys, no spaces, UTF-8). The nonce is
96 random bits per sealed value: never reused under one key with overwhelming probability as
long as a key seals fewer than about 2**32 values (rotate well before that).

What the associated data binds, and why (the tag covers it; none of it is encrypted):

* a version label: a later format can never be confused with this one;
* the schema: job ids are per schema, so without it a ciphertext could move to the job with the
  same id in another tenant's schema on the same database and keys;
* the queue and the job id the value was sealed for (also written, in the clear, as `for`):
  a ciphertext copied to another row fails, which is the point of the binding. `for` lets the
  opener say exactly which job a misplaced ciphertext belongs to, and lets a forwarded copy
  (same args, another row) name its original (see `forwarding`);
* the worker: the code that will read the value; never changes for a job, and a ciphertext
  copied into a row of another worker would hand one worker's input to another;
* the column (`args` or `result`): a result can never be swapped in as args.

Not bound: the table (the pruner moves rows to the archive unchanged), the state, attempt,
priority and schedule (they change over a job's life; none changes what the value means).
Renaming the schema therefore needs the values re-sealed under the new name.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from shigoto.encryption.keys import ENV_VAR, KeyRing
from shigoto.errors import Error, ValidationError

#: The key that marks a jsonb value as an envelope; its value is the format version.
MARKER = "$shigoto_enc"
VERSION = 1
_AAD_LABEL = "shigoto/enc/v1"
_NONCE_BYTES = 12
_ENVELOPE_KEYS = frozenset({MARKER, "kid", "for", "nonce", "ct"})

#: Where a sealed value lives: the `args` or `result` column, or the detail (message and
#: traceback) of an `errors` entry of an encrypted job (`error`).
Field = Literal["args", "result", "error"]


@dataclass(frozen=True)
class JobBinding:
    """Who a sealed value belongs to: the job's schema, queue, worker and id."""

    schema: str
    queue: str
    worker: str
    job_id: int

    def aad(self, field: Field) -> bytes:
        """The associated data: a JSON array, so no two bindings can encode alike."""
        parts = [_AAD_LABEL, self.schema, self.queue, self.worker, self.job_id, field]
        return json.dumps(parts, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    def describe(self) -> str:
        """How errors name the job: id, worker and queue, never a value."""
        return f"job {self.job_id} (worker {self.worker}, queue {self.queue})"


class DecryptionError(Error):
    """A sealed value cannot be opened: its key is missing from the ring, it was altered or
    copied from another job, or it is not an envelope at all. The job must not run on it.

    The message names the key id, the job and the column, never the plaintext or a key."""

    def __init__(self, binding: JobBinding, field: str, kid: str | None, reason: str) -> None:
        super().__init__(
            f"cannot decrypt the {field} of {binding.describe()}, "
            f"sealed with key id {kid or '?'}: {reason}"
        )
        self.binding = binding
        self.field = field
        self.kid = kid
        self.reason = reason


def canonical_json(value: Any) -> bytes:
    """The one byte form of a JSON value: sorted keys, no spaces, UTF-8, no NaN."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)  # fmt: skip
    return text.encode("utf-8")


def is_envelope(value: Any) -> bool:
    """Whether a column value is an envelope (by its marker; the shape is checked on open)."""
    return isinstance(value, Mapping) and MARKER in value


def envelope_kid(value: Any) -> str | None:
    """The key id an envelope names, or None for a plain value or a malformed kid."""
    if not is_envelope(value):
        return None
    kid = value.get("kid")
    return kid if isinstance(kid, str) else None


def seal(value: Any, binding: JobBinding, field: Field, ring: KeyRing) -> dict[str, Any]:
    """The envelope of `value`, sealed with the ring's newest key for `binding`'s job."""
    try:
        plaintext = canonical_json(value)
    except (TypeError, ValueError):
        # Not the cause's text: it may quote the value.
        raise ValidationError(
            field, "cannot be encrypted: it is not JSON (a non-JSON type, NaN or Infinity)"
        ) from None
    key = ring.newest
    nonce = os.urandom(_NONCE_BYTES)
    ciphertext = AESGCM(key.secret).encrypt(nonce, plaintext, binding.aad(field))
    return {
        MARKER: VERSION,
        "kid": key.kid,
        "for": {"queue": binding.queue, "id": binding.job_id},
        "nonce": _b64(nonce),
        "ct": _b64(ciphertext),
    }


def unseal(envelope: Any, binding: JobBinding, field: Field, ring: KeyRing) -> Any:
    """The value sealed in `envelope` for `binding`'s job, opened with the key its kid names.

    Only that key is tried: trying every key would cost time per key and hide which one is
    missing. Raises `DecryptionError` on any failure; never returns a partial value."""
    kid = envelope_kid(envelope)
    nonce, ciphertext = _parts(envelope, binding, field, kid)
    sealed_for = envelope["for"]
    if sealed_for != {"queue": binding.queue, "id": binding.job_id}:
        raise DecryptionError(
            binding, field, kid,
            f"it was sealed for job {sealed_for['id']} in queue {sealed_for['queue']}: a "
            "ciphertext copied to another row never opens; enqueue the job again instead",
        )  # fmt: skip
    key = ring.get(kid) if kid else None
    if key is None:
        raise DecryptionError(
            binding, field, kid,
            f"the key is not in {ENV_VAR} (it holds key ids {', '.join(ring.kids)}); put "
            "that key back in the list (after the newest) and keep it there until "
            "`shigoto rekey` has re-encrypted every row",
        )  # fmt: skip
    try:
        plaintext = AESGCM(key.secret).decrypt(nonce, ciphertext, binding.aad(field))
    except InvalidTag:
        raise DecryptionError(
            binding,
            field,
            kid,
            "the ciphertext does not authenticate: it was altered, or moved from another "
            "job, schema or worker; the job must not run on it",
        ) from None
    return json.loads(plaintext)


def _parts(envelope: Any, binding: JobBinding, field: str, kid: str | None) -> tuple[bytes, bytes]:
    """The nonce and ciphertext of a well-formed envelope, or a `DecryptionError` saying which
    part is wrong (never echoing the part: a malformed value may be plaintext)."""

    def bad(what: str) -> DecryptionError:
        return DecryptionError(binding, field, kid, f"malformed envelope: {what}")

    if not is_envelope(envelope):
        raise bad(f"the value is not an object with {MARKER!r}")
    if envelope[MARKER] != VERSION or isinstance(envelope[MARKER], bool):
        raise bad(f"unknown version (this Shigoto reads version {VERSION})")
    if set(envelope) != _ENVELOPE_KEYS:
        raise bad(f"expected exactly the keys {sorted(_ENVELOPE_KEYS)}")
    if kid is None:
        raise bad("kid is not a string")
    sealed_for = envelope["for"]
    if not (
        isinstance(sealed_for, Mapping) and set(sealed_for) == {"queue", "id"}
        and isinstance(sealed_for["queue"], str)
        and isinstance(sealed_for["id"], int) and not isinstance(sealed_for["id"], bool)
    ):  # fmt: skip
        raise bad("`for` is not {queue: text, id: integer}")
    nonce = _unb64(envelope["nonce"])
    ciphertext = _unb64(envelope["ct"])
    if nonce is None or len(nonce) != _NONCE_BYTES:
        raise bad(f"nonce is not {_NONCE_BYTES} bytes of base64url")
    if ciphertext is None or len(ciphertext) < 16:
        raise bad("ct is not base64url of a ciphertext with its 16-byte tag")
    return nonce, ciphertext


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii")


def _unb64(text: Any) -> bytes | None:
    if not isinstance(text, str):
        return None
    try:
        return base64.urlsafe_b64decode(text.encode("ascii"))
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return None
