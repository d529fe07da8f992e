"""Encryption at rest of job args and results (issue 12): keys, envelopes, keyed unique
digests and the forwarding rule. Pure, apart from `keys_from_env` reading the environment.

`shigoto.encryption.rekey` (re-sealing stored rows under the newest key) does I/O and is not
imported here, so importing the package never pulls in a database driver.
"""

from shigoto.encryption.digests import unique_digest, unique_digests
from shigoto.encryption.envelope import (
    MARKER,
    DecryptionError,
    JobBinding,
    canonical_json,
    envelope_kid,
    is_envelope,
    seal,
    unseal,
)
from shigoto.encryption.forwarding import binding_for
from shigoto.encryption.keys import ENV_VAR, Key, KeyRing, generate_key, keys_from_env, parse_keys

__all__ = [
    "ENV_VAR",
    "MARKER",
    "DecryptionError",
    "JobBinding",
    "Key",
    "KeyRing",
    "binding_for",
    "canonical_json",
    "envelope_kid",
    "generate_key",
    "is_envelope",
    "keys_from_env",
    "parse_keys",
    "seal",
    "unique_digest",
    "unique_digests",
    "unseal",
]
