"""Settings from the environment, validated with hints (pure; no database)."""

from __future__ import annotations

import pytest

import shigoto
from shigoto import config


def test_database_url_explicit_wins_over_env() -> None:
    env = {"SHIGOTO_DATABASE_URL": "postgresql://env/db"}
    assert config.database_url("postgresql://explicit/db", env) == "postgresql://explicit/db"
    assert config.database_url(None, env) == "postgresql://env/db"


def test_missing_database_url_says_what_to_set() -> None:
    with pytest.raises(shigoto.ConfigurationError, match="SHIGOTO_DATABASE_URL"):
        config.database_url(None, {})


def test_schema_defaults_to_public_and_honours_env() -> None:
    assert config.schema(None, {}) == "public"
    assert config.schema(None, {"SHIGOTO_SCHEMA": "jobs_1"}) == "jobs_1"
    assert config.schema("explicit", {"SHIGOTO_SCHEMA": "jobs_1"}) == "explicit"


@pytest.mark.parametrize(
    "name", ['public"; DROP TABLE x; --', "1abc", "has space", "a-b", "x" * 64, "sch.ema"]
)
def test_schema_rejects_anything_but_a_plain_identifier(name: str) -> None:
    with pytest.raises(shigoto.ConfigurationError, match="SHIGOTO_SCHEMA"):
        config.schema(name, {})


def test_schema_of_maximum_length_is_accepted() -> None:
    assert config.schema("_" + "a" * 62, {}) == "_" + "a" * 62


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("default=10", {"default": 10}),
        ("default=10,emails=5", {"default": 10, "emails": 5}),
        (" default=10 ,  emails=5 ", {"default": 10, "emails": 5}),
        ("default=10 emails=5", {"default": 10, "emails": 5}),
        ("emails", {"emails": 10}),
    ],
)
def test_parse_queues(text: str, expected: dict[str, int]) -> None:
    assert config.parse_queues(text) == expected


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("", "at least one queue"),
        (",,", "at least one queue"),
        ("=5", "queue name"),
        ("emails=five", "whole number"),
        ("emails=0", "at least 1"),
        ("emails=-2", "at least 1"),
        ("q" * 129 + "=1", "queue name"),
        ("my queue=1", "cannot contain spaces"),
        ("default=10,my queue", "cannot contain spaces"),
    ],
)
def test_parse_queues_rejects_with_a_hint(text: str, hint: str) -> None:
    with pytest.raises(shigoto.ConfigurationError, match=hint):
        config.parse_queues(text)


def test_queues_from_env() -> None:
    assert config.queues_from_env({}) == {"default": 10}
    assert config.queues_from_env({"SHIGOTO_QUEUES": "a=2,b=3"}) == {"a": 2, "b": 3}


def test_default_queues_are_not_shared_mutable_state() -> None:
    config.queues_from_env({})["default"] = 99
    assert config.queues_from_env({}) == {"default": 10}


def test_imports_from_env() -> None:
    assert config.imports_from_env({}) == []
    env = {"SHIGOTO_IMPORT": " app.workers , ,other.mod"}
    assert config.imports_from_env(env) == ["app.workers", "other.mod"]


def test_runner_settings_defaults() -> None:
    s = config.RunnerSettings()
    assert s.shutdown_timeout == 15.0
    assert s.prune_after == 14 * 86400.0
    assert s.poll_interval > 0 and s.stage_interval > 0
    assert s.stage_interval < 1.0  # scheduled jobs must be less than 1 s late


@pytest.mark.parametrize(
    "override",
    [
        {"poll_interval": 0},
        {"stage_interval": -1},
        {"shutdown_timeout": 0},
        {"heartbeat_interval": 0},
        {"prune_interval": 0},
        {"claim_batch": 0},
    ],
)
def test_runner_settings_reject_non_positive_values(override: dict) -> None:
    with pytest.raises(shigoto.ConfigurationError, match=next(iter(override))):
        config.RunnerSettings(**override)


def test_runner_validates_queues_like_the_cli() -> None:
    with pytest.raises(shigoto.ConfigurationError):
        shigoto.Runner({"default": 0}, database_url="postgresql://unused/db")


def test_runner_takes_setting_overrides_as_keywords() -> None:
    runner = shigoto.Runner(
        {"default": 3}, database_url="postgresql://unused/db", poll_interval=0.2,
        stage_interval=0.1,
    )  # fmt: skip
    assert runner.settings.poll_interval == 0.2
    assert runner.settings.stage_interval == 0.1
    assert runner.queues == {"default": 3}


def test_runner_reads_queues_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHIGOTO_QUEUES", "emails=5")
    runner = shigoto.Runner(database_url="postgresql://unused/db")
    assert runner.queues == {"emails": 5}
