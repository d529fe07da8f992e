"""Issue 25, second contact: the pure parts of items 4, 6 and 11 (masking, start-up checks,
cron file keys), without a database."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from shigoto import logs
from shigoto.cron.definitions import load_file
from shigoto.encryption import sealing
from shigoto.errors import ConfigurationError, ValidationError
from shigoto.runtime.runner import check_startup


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('missing "=" after "postgresql//oops" in connection info string',
         'missing "=" after "postgresql//oops" in connection info string'),
        ('invalid integer value "abc" for connection option "port"',
         'invalid integer value "abc" for connection option "port"'),
        ('missing "=" after "hunter22" in connection info string',  # may be a password
         'missing "=" after "***" in connection info string'),
        ('invalid value "hunter22" for connection option "password"',
         'invalid value "***" for connection option "password"'),
    ],
)  # fmt: skip
def test_without_the_url_only_what_may_be_a_password_is_masked(text: str, expected: str) -> None:
    assert logs.redact(text) == expected


def test_with_the_url_exactly_its_password_is_masked() -> None:
    url = "host=db port=5432 password=s3"  # short: masked where quoted alone, not in words
    assert logs.redact('invalid value "s3" for connection option "sslmode"', url) == (
        'invalid value "***" for connection option "sslmode"')  # fmt: skip
    assert logs.redact('missing "=" after "ab" in connection info string', url) == (
        'missing "=" after "ab" in connection info string')  # fmt: skip


def test_an_encrypted_worker_of_a_queue_served_elsewhere_is_only_a_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SHIGOTO_ENCRYPTION_KEYS", raising=False)
    sealing.use_keys(None)
    try:
        with caplog.at_level(logging.WARNING, logger="shigoto.runner"):
            check_startup(["tests.support.encryption_workers"], {"other": 1}, ())
        with pytest.raises(ConfigurationError, match="SHIGOTO_ENCRYPTION_KEYS"):
            check_startup(["tests.support.encryption_workers"], {"default": 1}, ())
    finally:
        sealing.reload_keys()
    warned = [r.getMessage() for r in caplog.records]
    assert any("encryption_workers.charge is encrypted=True" in m
               and "not served by this runner" in m for m in warned)  # fmt: skip


def test_a_cron_file_key_without_a_close_match_lists_the_known_ones(tmp_path: Path) -> None:
    path = tmp_path / "cron.json"
    path.write_text(json.dumps([{"name": "n", "schedule": "* * * * *", "worker": "a.b",
                                 "zzz": 1}]))  # fmt: skip
    with pytest.raises(ValidationError) as bad:
        load_file(str(path))
    assert bad.value.field == "--cron[0]"
    assert "unknown key 'zzz' (known: args, catch_up," in bad.value.message
