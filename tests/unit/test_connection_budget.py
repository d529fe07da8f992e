"""The arithmetic of a runner's connections (`shigoto.runtime.connection_budget`), and where
each connection goes behind a transaction pooler (`shigoto.db.routes`)."""

from __future__ import annotations

import pytest

from shigoto import config
from shigoto.cli import commands
from shigoto.db import database
from shigoto.db.routes import Routes, application_name
from shigoto.errors import ConfigurationError
from shigoto.runtime import connection_budget as cb
from shigoto.runtime.runner import Runner
from tests.support.cli import shigoto_cli

DIRECT = "postgresql://app@db:5432/shop"
POOLED = "postgresql://app@pgbouncer:6432/shop"


def test_without_a_cap_a_runner_holds_its_pool_three_sessions_and_the_client_pools() -> None:
    budget = cb.plan(queues=2, max_connections=None)
    assert (budget.pool, budget.listen, budget.limiter, budget.elector) == (8, 1, 1, 1)
    assert budget.client == 2 * database.CLIENT_POOL_MAX, "sync and async client pools"
    assert cb.runner_connections(queues=2, max_connections=None) == 8 + 3 + 16


def test_a_cap_is_shared_out_and_never_exceeded() -> None:
    for queues in (1, 2, 5, 20):
        for cap in range(cb.minimum_connections(), 40):
            budget = cb.plan(queues=queues, max_connections=cap)
            assert budget.total <= cap
            assert budget.pool >= cb.MIN_POOL and budget.client == cb.CLIENT_UNDER_CAP
            assert cb.runner_connections(queues=queues, max_connections=cap) == budget.total


def test_a_generous_cap_gives_no_more_than_the_uncapped_pool() -> None:
    budget = cb.plan(queues=2, max_connections=100)
    assert budget.pool == 2 + cb.POOL_PER_RUNNER and budget.total == 8 + 3 + 1


def test_the_least_cap_is_two_pooled_plus_the_sessions_plus_one_for_sync_enqueues() -> None:
    assert cb.minimum_connections() == 2 + 3 + 1
    assert cb.plan(queues=3, max_connections=6).pool == 2
    # behind a transaction pooler with no direct URL: only the elector beside the pool
    assert cb.minimum_connections(sessions=False) == 2 + 1 + 1
    budget = cb.plan(queues=3, max_connections=6, sessions=False)
    assert (budget.listen, budget.limiter, budget.pool) == (0, 0, 4)


def test_a_cap_below_the_least_is_refused_naming_the_flag_the_env_var_and_why() -> None:
    with pytest.raises(ConfigurationError) as refused:
        cb.plan(queues=2, max_connections=5)
    message = str(refused.value)
    assert "--max-connections" in message and "SHIGOTO_MAX_CONNECTIONS" in message
    assert "the least a runner can work with is 6" in message and "LISTEN" in message


def test_no_pooler_keeps_prepared_statements_and_sessions_on_the_main_url() -> None:
    routes = Routes(DIRECT)
    assert routes.session_url == DIRECT and routes.migrate_url == DIRECT
    assert "prepare_threshold" not in routes.kwargs(DIRECT, "runner", "n1")


def test_a_transaction_pooler_turns_prepares_off_and_sends_sessions_to_the_direct_url() -> None:
    routes = Routes(POOLED, "transaction", DIRECT)
    assert routes.session_url == DIRECT and routes.migrate_url == DIRECT
    assert routes.kwargs(POOLED, "runner", "n1")["prepare_threshold"] is None
    assert "prepare_threshold" not in routes.kwargs(DIRECT, "listen", "n1"), "direct: prepares"


def test_a_transaction_pooler_without_a_direct_url_has_no_session_and_no_migrations() -> None:
    routes = Routes(POOLED, "transaction")
    assert routes.session_url is None and routes.migrate_url is None
    assert cb.plan(queues=1, max_connections=4, sessions=routes.session_url is not None)


def test_connections_are_named_unless_the_url_or_pgappname_names_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PGAPPNAME", raising=False)
    routes = Routes(DIRECT)
    assert routes.kwargs(DIRECT, "listen", "n1")["application_name"] == "shigoto-listen:n1"
    named = DIRECT + "?application_name=shop"
    assert "application_name" not in routes.kwargs(named, "listen", "n1")
    monkeypatch.setenv("PGAPPNAME", "shop")
    assert "application_name" not in routes.kwargs(DIRECT, "listen", "n1")
    assert len(application_name("runner", "x" * 100).encode()) == 63


def test_the_client_pools_follow_the_env_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(config.ENV_POOLER, "transaction")
    monkeypatch.setenv(config.ENV_DIRECT_DATABASE_URL, DIRECT)
    assert database.connect_kwargs(POOLED)["prepare_threshold"] is None
    assert "prepare_threshold" not in database.connect_kwargs(DIRECT)
    monkeypatch.setenv(config.ENV_POOLER, "transactoin")
    with pytest.raises(ConfigurationError, match="SHIGOTO_POOLER"):
        database.connect_kwargs(POOLED)


def test_a_malformed_max_connections_env_var_is_one_error_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(config.ENV_MAX_CONNECTIONS, "lots")
    with pytest.raises(ConfigurationError, match="SHIGOTO_MAX_CONNECTIONS"):
        config.max_connections()
    assert config.max_connections(7) == 7, "the explicit value wins"


# -- `shigoto run` flags and env vars ---------------------------------------------------------


def runner_for(*argv: str) -> Runner:
    args = commands.build_parser().parse_args(["run", "--database-url", POOLED, *argv])
    commands._resolve_env(args)
    runner = commands._runner(args)
    assert isinstance(runner, Runner)
    return runner


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Unset (empty), and restored afterwards even when `shigoto run` exports them."""
    for name in (config.ENV_MAX_CONNECTIONS, config.ENV_POOLER, config.ENV_DIRECT_DATABASE_URL):
        monkeypatch.setenv(name, "")
    return monkeypatch


def test_the_connection_flags_reach_the_runner(clean_env: pytest.MonkeyPatch) -> None:
    runner = runner_for("--queue", "a=1,b=1", "--max-connections", "9", "--pooler",
                        "transaction", "--direct-database-url", DIRECT)  # fmt: skip
    assert runner.budget == cb.plan(queues=2, max_connections=9)
    assert runner.routes == Routes(POOLED, "transaction", DIRECT)
    # and the process's own enqueues follow the flags, as if the env vars were set
    assert database.connect_kwargs(POOLED)["prepare_threshold"] is None


def test_the_env_vars_reach_the_runner_and_the_flags_win(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv(config.ENV_MAX_CONNECTIONS, "7")
    clean_env.setenv(config.ENV_POOLER, "transaction")
    runner = runner_for("--queue", "a=1")
    assert runner.budget.total <= 7 and runner.routes.session_url is None
    assert runner.budget.listen == 0, "no direct URL: no LISTEN"
    runner = runner_for("--queue", "a=1", "--max-connections", "12", "--pooler", "none")
    assert runner.max_connections == 12 and runner.routes.session_url == POOLED


def test_a_cap_too_small_stops_the_command_with_one_line(clean_env: pytest.MonkeyPatch) -> None:
    done = shigoto_cli(POOLED, "run", "--max-connections", "3")
    assert done.returncode == 2, done.stderr
    assert "--max-connections (SHIGOTO_MAX_CONNECTIONS) is 3" in done.stderr
