"""Unique keys over encrypted args: a keyed HMAC of the plaintext instead of a bare hash.

`relations.unique` stores a hash of the chosen fields in the clear. For encrypted args that
would leak them: args are often guessable (an invoice id, an e-mail address), and a bare hash
of a guessable value is the value. So an encrypted job's unique key is HMAC-SHA256 of the same
canonical JSON, under a key that only holders of the encryption keys can compute.

Which key: an HMAC key derived with HKDF-SHA256 from a ring key (never the AES key itself, so
the two uses cannot interact), with a fixed label; the digest names the ring key's id.

On rotation: new jobs get digests under the new newest key, so equal args enqueued before and
after the rotation have different digests and the unique index alone no longer sees them as
equal. `unique_digests` therefore gives the digest under every key of the ring, newest first:
the unique resolver looks for a holder under any of them (the old ones only matter until the
unique periods that began before the rotation have passed) and stores the newest. Rekey leaves
stored digests alone: a holder's digest matters only within its unique period, and lookups
under every ring key find it until then. Dropping a key from the ring ends that; drop it only
after rekey has finished and the longest unique period has passed.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from shigoto.encryption.envelope import canonical_json
from shigoto.encryption.keys import Key, KeyRing

_HKDF_INFO = b"shigoto unique key hmac v1"

#: 16 bytes of the HMAC, as `relations.unique` keeps 16 bytes of its hash: collisions stay
#: out of reach (2**64 keys for a birthday collision) and the key stays short.
_DIGEST_BYTES = 16


def hmac_key(key: Key) -> bytes:
    """The HMAC key derived from a ring key (HKDF-SHA256, no salt, a fixed label)."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_HKDF_INFO).derive(key.secret)


def unique_digest(material: Mapping[str, Any], key: Key) -> str:
    """`<kid>.<hex>`: the keyed digest of the chosen fields (`{"args.x": 1, "worker": ...}`).

    Equal fields give equal digests whatever order dicts were built in, and an integral float
    counts as the integer (1.0 == 1), as jsonb compares them."""
    mac = hmac.new(hmac_key(key), canonical_json(_folded(dict(material))), hashlib.sha256)
    return f"{key.kid}.{mac.hexdigest()[: 2 * _DIGEST_BYTES]}"


def unique_digests(material: Mapping[str, Any], ring: KeyRing) -> tuple[str, ...]:
    """The digest under every key of the ring, newest first: the first is the one to store,
    all of them are the ones to look up while an old key's unique periods may still run."""
    return tuple(unique_digest(material, key) for key in ring)


def _folded(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {k: _folded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_folded(v) for v in value]
    return value
