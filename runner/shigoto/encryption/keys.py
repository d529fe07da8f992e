"""The key ring: the AES-256 keys a process may seal and open with, newest first.

Keys come from `SHIGOTO_ENCRYPTION_KEYS` (comma-separated base64 of 32 random bytes, newest
first) or are given explicitly. Each key has a key id (kid) derived from the key by a one-way
hash, so an envelope can name the key that sealed it without revealing anything about the key.
Nothing here ever puts key material into a message, a repr or a log record: a configuration
error names the variable and the position of the bad entry, never its text.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from shigoto.errors import ConfigurationError

#: The env var the CONTRACT fixes for the keys.
ENV_VAR = "SHIGOTO_ENCRYPTION_KEYS"

#: AES-256: 32 bytes of key.
KEY_BYTES = 32

#: Domain separation: the kid is a hash of the key under this label, never the bare key hash
#: another tool might also publish.
_KID_LABEL = b"shigoto key id v1\x00"

#: 6 bytes of SHA-256 = 8 base64url characters: short enough for logs and envelopes, and a
#: collision between two keys of one ring (checked at load) is a 1 in 2**48 event.
_KID_BYTES = 6

_HINT = (
    'generate a key with `python -c "import base64, os; '
    'print(base64.b64encode(os.urandom(32)).decode())"`'
)


def key_id(secret: bytes) -> str:
    """The public, stable id of a key: base64url of the first bytes of a labelled SHA-256."""
    digest = hashlib.sha256(_KID_LABEL + secret).digest()[:_KID_BYTES]
    return base64.urlsafe_b64encode(digest).decode("ascii")


def generate_key() -> str:
    """A new random key, base64 encoded, ready to put first in `SHIGOTO_ENCRYPTION_KEYS`."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii")


@dataclass(frozen=True, repr=False, eq=False)
class Key:
    """One key and its id. The repr shows only the id, so a key in a traceback's locals or a
    debug print never leaks; equality is by id (ids of one ring are distinct)."""

    kid: str
    secret: bytes

    def __repr__(self) -> str:
        return f"Key(kid={self.kid!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and other.kid == self.kid

    def __hash__(self) -> int:
        return hash(self.kid)

    @classmethod
    def from_secret(cls, secret: bytes) -> Key:
        if len(secret) != KEY_BYTES:
            raise ConfigurationError(
                f"an encryption key must be {KEY_BYTES} bytes, got {len(secret)}; {_HINT}"
            )
        return cls(key_id(secret), bytes(secret))


class KeyRing:
    """The keys of a process, newest first: the newest seals, any of them opens (by kid)."""

    def __init__(self, keys: Iterable[Key | bytes], *, source: str = "the key ring") -> None:
        ring = [k if isinstance(k, Key) else Key.from_secret(k) for k in keys]
        if not ring:
            raise ConfigurationError(f"{source}: no encryption key given; {_HINT}")
        seen: dict[str, int] = {}
        for position, key in enumerate(ring, start=1):
            if key.kid in seen:
                raise ConfigurationError(
                    f"{source}: key {position} of {len(ring)} repeats key {seen[key.kid]} "
                    f"(key id {key.kid}); list each key once, newest first"
                )
            seen[key.kid] = position
        self._keys = tuple(ring)
        self._by_kid = {k.kid: k for k in ring}

    @property
    def newest(self) -> Key:
        """The key that seals new values."""
        return self._keys[0]

    @property
    def kids(self) -> tuple[str, ...]:
        """Every key id, newest first: what an error may show instead of the keys."""
        return tuple(k.kid for k in self._keys)

    def get(self, kid: str) -> Key | None:
        """The key named by an envelope, or None when this ring does not hold it."""
        return self._by_kid.get(kid)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"KeyRing(kids={list(self.kids)!r})"


def parse_keys(text: str, variable: str = ENV_VAR) -> KeyRing:
    """The ring written in `text` (comma-separated base64, newest first).

    Every error names `variable`, the 1-based position of the bad entry and the fix; never the
    entry itself, which may be a real key with one character missing."""
    entries = [e.strip() for e in text.split(",")]
    keys = [_decode(entry, i, len(entries), variable) for i, entry in enumerate(entries, 1)]
    return KeyRing(keys, source=variable)


def _decode(entry: str, position: int, total: int, variable: str) -> Key:
    where = f"{variable}: key {position} of {total} (newest first)"
    if not entry:
        raise ConfigurationError(
            f"{where} is empty; remove the stray comma, or put a key there ({_HINT})"
        )
    try:
        # Standard or URL-safe alphabet, padding required; validate=True rejects stray bytes
        # instead of silently dropping them (which would yield a different key).
        secret = base64.b64decode(entry.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigurationError(
            f"{where} is not valid base64; {_HINT}"
        ) from None  # the cause's message could quote the entry
    if len(secret) != KEY_BYTES:
        raise ConfigurationError(
            f"{where} decodes to {len(secret)} bytes, not {KEY_BYTES} (AES-256); {_HINT}"
        )
    return Key(key_id(secret), secret)


def keys_from_env(environ: Mapping[str, str] | None = None) -> KeyRing | None:
    """The ring of `SHIGOTO_ENCRYPTION_KEYS`, or None when the variable is unset or blank
    (encryption off). The one function of the package that reads the environment."""
    text = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return parse_keys(text) if text.strip() else None
