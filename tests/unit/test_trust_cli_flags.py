"""`shigoto run` flags for the runner's limits and worker resolution, each with its env var."""

from __future__ import annotations

import pytest

import shigoto
from shigoto.cli import commands
from shigoto.errors import ConfigurationError

URL = "postgresql://unused@localhost/db"


def runner_for(*argv: str) -> shigoto.Runner:
    args = commands.build_parser().parse_args(["run", "--database-url", URL, *argv])
    commands._resolve_env(args)
    runner = commands._runner(args)
    assert isinstance(runner, shigoto.Runner)
    return runner


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SHIGOTO_MAX_STUCK_THREADS", "SHIGOTO_CALLBACK_TIMEOUT",
                 "SHIGOTO_WORKER_PREFIXES"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


def test_flags_reach_the_runner() -> None:
    runner = runner_for("--max-stuck-threads", "3", "--callback-timeout", "2.5",
                        "--worker-prefix", "myapp", "--worker-prefix", "other.jobs.")  # fmt: skip
    assert runner.max_stuck_threads == 3
    assert runner.callback_timeout == 2.5
    assert runner.settings.worker_prefixes == ("myapp", "other.jobs")


def test_env_vars_reach_the_runner_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHIGOTO_MAX_STUCK_THREADS", "0")
    monkeypatch.setenv("SHIGOTO_CALLBACK_TIMEOUT", "7")
    monkeypatch.setenv("SHIGOTO_WORKER_PREFIXES", "a, b.c")
    runner = runner_for()
    assert (runner.max_stuck_threads, runner.callback_timeout) == (0, 7.0)
    assert runner.settings.worker_prefixes == ("a", "b.c")
    runner = runner_for("--max-stuck-threads", "5", "--worker-prefix", "z")
    assert runner.max_stuck_threads == 5 and runner.settings.worker_prefixes == ("z",)


def test_defaults_are_the_runners_own() -> None:
    runner = runner_for()
    assert runner.max_stuck_threads is None and runner.callback_timeout == 30.0
    assert runner.settings.worker_prefixes == ()


@pytest.mark.parametrize(
    ("env", "value"),
    [("SHIGOTO_MAX_STUCK_THREADS", "-1"), ("SHIGOTO_CALLBACK_TIMEOUT", "0"),
     ("SHIGOTO_WORKER_PREFIXES", "my-app")],
)  # fmt: skip
def test_a_malformed_env_var_is_one_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigurationError, match=env):
        runner_for()


def test_stuck_threads_error_is_public() -> None:
    assert issubclass(shigoto.StuckThreadsError, shigoto.Error)
    assert "StuckThreadsError" in shigoto.__all__


def test_stuck_after_flag_and_env_reach_the_rescuer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHIGOTO_STUCK_AFTER", raising=False)
    assert runner_for().stuck_after == 3600.0
    assert runner_for("--stuck-after", "90").stuck_after == 90.0
    monkeypatch.setenv("SHIGOTO_STUCK_AFTER", "120")
    assert runner_for().stuck_after == 120.0
    assert runner_for("--stuck-after", "30").stuck_after == 30.0
