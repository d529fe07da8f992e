"""An encryption key for this test process (client and in-process runners), forgotten after
the test: the fixture the tests of sealed jobs share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shigoto.db import insert_encryption
from shigoto.encryption import ENV_VAR, Key, KeyRing, sealing


@pytest.fixture
def key_ring(monkeypatch: pytest.MonkeyPatch) -> Iterator[KeyRing]:
    """A key for this process (client and in-process runner); forgotten afterwards."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    ring = KeyRing([Key.from_secret(b"k" * 32)])
    sealing.use_keys(ring)
    insert_encryption._ENCRYPTED_QUEUES.clear()
    yield ring
    sealing.reload_keys()
    insert_encryption._ENCRYPTED_QUEUES.clear()
