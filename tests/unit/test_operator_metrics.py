"""The operator's metrics without a database or a cluster: readings in, Prometheus samples out."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shigoto_operator.config import OperatorConfig
from shigoto_operator.crds import JOB_STATES
from shigoto_operator.metrics import (
    CRON_SCHEDULE,
    QUEUE,
    DatabaseHealth,
    DatabaseSample,
    MetricsServer,
    OperatorMetrics,
)
from shigoto_operator.policy import JobCounts
from tests.support.http_probe import http_get

DOCS = Path(__file__).resolve().parents[2] / "docs"


def samples(metrics: OperatorMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample called `name`: sorted label pairs -> value."""
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def value(metrics: OperatorMetrics, name: str, **labels: str) -> float | None:
    return samples(metrics, name).get(tuple(sorted(labels.items())))


def deployment(spec_replicas: int | None = None, ready: int | None = None) -> dict[str, Any]:
    return {"spec": {"replicas": spec_replicas}, "status": {"readyReplicas": ready}}


def test_a_queue_pass_records_its_counts_replicas_and_pause() -> None:
    m = OperatorMetrics(process_metrics=False)
    counts = JobCounts(available=7, executing=2, discarded=1)
    m.observe_queue("shop", "emails", "mail", counts=counts, desired=3,
                    deployment=deployment(2, ready=2), paused=True)  # fmt: skip
    jobs = {dict(k)["state"]: v for k, v in samples(m, "shigoto_operator_queue_jobs").items()}
    assert jobs == {state: float(getattr(counts, state)) for state in JOB_STATES}
    labels = {"namespace": "shop", "queue": "mail"}
    assert value(m, "shigoto_operator_queue_replicas", **labels) == 3  # desired, not the live 2
    assert value(m, "shigoto_operator_queue_ready_replicas", **labels) == 2
    assert value(m, "shigoto_operator_queue_paused", **labels) == 1


def test_without_a_decision_the_replicas_are_the_deployments() -> None:
    # KEDA mode: the HPA owns replicas, the operator decides none
    m = OperatorMetrics(process_metrics=False)
    m.observe_queue("shop", "emails", "mail", counts=None, desired=None,
                    deployment=deployment(4, ready=None))  # fmt: skip
    assert value(m, "shigoto_operator_queue_replicas", namespace="shop", queue="mail") == 4
    assert value(m, "shigoto_operator_queue_ready_replicas", namespace="shop", queue="mail") == 0


def test_unknown_counts_remove_the_job_series_instead_of_repeating_stale_ones() -> None:
    m = OperatorMetrics(process_metrics=False)
    m.observe_queue("shop", "emails", "mail", counts=JobCounts(available=5), desired=1,
                    deployment=None)  # fmt: skip
    m.observe_queue("shop", "emails", "mail", counts=None, desired=1, deployment=None)
    assert samples(m, "shigoto_operator_queue_jobs") == {}
    assert value(m, "shigoto_operator_queue_replicas", namespace="shop", queue="mail") == 1


def test_a_renamed_queue_moves_its_series_and_a_forgotten_one_leaves_none() -> None:
    m = OperatorMetrics(process_metrics=False)
    m.observe_queue("shop", "emails", "mail", counts=JobCounts(), desired=0, deployment=None)
    m.observe_queue("shop", "emails", "post", counts=JobCounts(), desired=0, deployment=None)
    assert {dict(k)["queue"] for k in samples(m, "shigoto_operator_queue_jobs")} == {"post"}
    m.forget_queue("shop", "emails")
    for name in ("jobs", "replicas", "ready_replicas", "paused"):
        assert samples(m, f"shigoto_operator_queue_{name}") == {}, name


def test_forgetting_one_of_two_queue_objects_on_the_same_labels_keeps_the_series() -> None:
    m = OperatorMetrics(process_metrics=False)
    for name in ("emails", "emails-copy"):
        m.observe_queue("shop", name, "mail", counts=JobCounts(), desired=0, deployment=None)
    m.forget_queue("shop", "emails")
    assert value(m, "shigoto_operator_queue_replicas", namespace="shop", queue="mail") == 0


def test_reconcile_counters_start_at_zero_and_count_by_kind() -> None:
    m = OperatorMetrics(process_metrics=False)
    assert value(m, "shigoto_operator_reconcile_errors_total", kind=QUEUE) == 0
    m.reconcile_started(QUEUE)
    m.reconcile_started(QUEUE)
    m.reconcile_failed(CRON_SCHEDULE)
    assert value(m, "shigoto_operator_reconcile_passes_total", kind=QUEUE) == 2
    assert value(m, "shigoto_operator_reconcile_errors_total", kind=CRON_SCHEDULE) == 1


def probe(up: bool, **queues: tuple[float, int]) -> DatabaseHealth:
    return DatabaseHealth(
        up, {q: age for q, (age, _) in queues.items()}, {q: n for q, (_, n) in queues.items()}
    )


def test_databases_are_read_at_scrape_time_under_a_name_without_the_url() -> None:
    known: list[DatabaseSample] = [
        DatabaseSample("db1:5432/shop", "public", probe(True, mail=(42.5, 2)),
                       (("shop", "mail"), ("shop", "idle"))),
        DatabaseSample("db2:5432/crm", "jobs", probe(False, mail=(1.0, 1)), (("crm", "mail"),)),
        DatabaseSample("db3:5432/new", "public", None, (("new", "mail"),)),
    ]  # fmt: skip
    m = OperatorMetrics(lambda: known, process_metrics=False)
    up = {dict(k)["database"]: v for k, v in samples(m, "shigoto_operator_database_up").items()}
    assert up == {"db1:5432/shop": 1, "db2:5432/crm": 0}
    age = "shigoto_operator_queue_oldest_available_age_seconds"
    # only answers count: an unreachable database's last ages would be made up
    assert {dict(k)["queue"]: v for k, v in samples(m, age).items()} == {"mail": 42.5, "idle": 0}
    assert value(m, "shigoto_operator_queue_runners", namespace="shop", queue="mail") == 2
    assert value(m, "shigoto_operator_queue_runners", namespace="shop", queue="idle") == 0
    known.pop(0)  # the operator forgot the database: gone from the next scrape
    assert value(m, "shigoto_operator_database_up", database="db1:5432/shop",
                 schema="public") is None  # fmt: skip


def test_one_database_reached_by_two_urls_is_up_only_while_both_answer() -> None:
    known = [
        DatabaseSample("db:5432/shop", "public", probe(True)),
        DatabaseSample("db:5432/shop", "public", probe(False)),
    ]
    m = OperatorMetrics(lambda: known, process_metrics=False)
    assert value(m, "shigoto_operator_database_up", database="db:5432/shop", schema="public") == 0


def test_the_server_serves_the_registry_over_http() -> None:
    m = OperatorMetrics(process_metrics=True)
    server = MetricsServer(m.registry, "127.0.0.1", 0)
    try:
        code, ctype, body = http_get(f"http://127.0.0.1:{server.port}/metrics")
    finally:
        server.stop()
    assert code == 200 and ctype.startswith("text/plain")
    assert b"shigoto_operator_reconcile_passes_total" in body
    assert b"process_resident_memory_bytes" in body


def test_metrics_settings_come_from_the_environment() -> None:
    config = OperatorConfig.from_env(
        {"SHIGOTO_OPERATOR_METRICS_PORT": "0", "SHIGOTO_OPERATOR_METRICS_INTERVAL": "2"}
    )
    assert (config.metrics_port, config.metrics_interval) == (0, 2.0)
    assert OperatorConfig.from_env({}).metrics_port == 9090


@pytest.mark.parametrize("text", ["http", "-1", "70000"])
def test_a_bad_metrics_port_names_the_variable(text: str) -> None:
    with pytest.raises(ValueError, match="SHIGOTO_OPERATOR_METRICS_PORT"):
        OperatorConfig.from_env({"SHIGOTO_OPERATOR_METRICS_PORT": text})


# --- the documented tables ---------------------------------------------------------------------

_ROW = re.compile(r"^\| `(shigoto_operator_[a-z_]+)` \| (\w+) \| ([^|]*) \|", re.M)


def registered() -> dict[str, tuple[str, frozenset[str]]]:
    """What the registry exports, as the tables name it (counters with `_total`)."""
    m = OperatorMetrics(
        lambda: [DatabaseSample("db:5432/x", "public", probe(True, q=(1.0, 1)), (("n", "q"),))],
        process_metrics=False,
    )
    m.observe_queue("n", "q", "q", counts=JobCounts(), desired=0, deployment=None)
    out = {}
    for family in m.registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        out[name] = (family.type, frozenset(k for s in family.samples for k in s.labels))
    return out


def test_every_table_of_operator_metrics_in_the_docs_lists_exactly_the_registry() -> None:
    # docs/monitoring.md has the table; any other page that lists them (telemetry.md) must agree
    tables = {}
    for page in sorted(DOCS.glob("*.md")):
        rows = _ROW.findall(page.read_text())
        if rows:
            tables[page.name] = {
                name: (kind, frozenset(x.strip() for x in labels.split(",") if x.strip()))
                for name, kind, labels in rows
            }
    assert "monitoring.md" in tables
    expected = registered()
    for page, documented in tables.items():
        assert documented == expected, page


def test_port_zero_serves_nothing_and_a_taken_port_is_logged_not_fatal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from shigoto_operator.handlers import _serve_metrics

    m = OperatorMetrics(process_metrics=False)
    assert _serve_metrics(m, OperatorConfig(metrics_port=0)) is None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = OperatorConfig(metrics_port=port, metrics_host="127.0.0.1")
        assert _serve_metrics(m, config) is None
    assert "SHIGOTO_OPERATOR_METRICS_PORT" in caplog.text
