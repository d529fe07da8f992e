"""deploy/monitoring/'s alerts checked by promtool against metrics recorded from a real run.

`promtool check rules` parses the PrometheusRule's groups (expressions, durations, annotation
templates), and a rule file made of the dashboard's queries shows they parse too.

`promtool test rules` then evaluates the alerts on series recorded here: a real `shigoto run`
process serving queues `mail` and `clean` on the test database, and the operator's real
metrics code (its `Databases` registry with the database probe, `OperatorMetrics`, its HTTP
server) watching `mail`, `clean`, `stuck` and `held` (no runner serves either; `held` is
paused by its Queue's spec) and a database that does not answer. Both /metrics are scraped
over HTTP once per step, each scrape given the target labels the PodMonitors would add, and
the steps are laid one minute apart (the run itself takes seconds; the alerts' windows are
minutes):

- steps 0-19, the runner alive: each step enqueues good and discarded jobs into `mail`, good
  ones into `clean`, and 20 more into each of `stuck` and `held`, whose first jobs are 20
  minutes overdue;
- steps 20-33, the runner stopped (SIGTERM) with 30 jobs left in `mail`: its scrapes fail;
- steps 34-51, the operator's metrics server stopped: its scrapes fail too.

The alerts must fire exactly where those states call for them, and nowhere else. promtool
compares annotations as well as labels, so the evaluated copy of the rules drops the
annotations; their templates are checked by `promtool check rules` above.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import shigoto
from shigoto_operator import databases
from shigoto_operator.config import OperatorConfig
from shigoto_operator.databases import Database, Databases, describe
from shigoto_operator.metrics import QUEUE, MetricsServer, OperatorMetrics
from tests.support.http_probe import http_get
from tests.support.monitoring_rules import dashboard_expressions, metric_names, rule_groups, rules
from tests.support.runner_process import RunnerProcess
from tests.support.system_tools import missing
from tests.support.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

WORKERS = "tests.support.workers"
ECHO = f"{WORKERS}.echo"
DISCARD = f"{WORKERS}.raise_outcome"

#: Target labels as the PodMonitors' scrapes add them (Prometheus Operator naming).
RUNNER_TARGET = {
    "namespace": "shop", "pod": "shigoto-runner-emails-7c9f-x2b4k", "container": "runner",
    "endpoint": "http", "job": "shigoto-system/shigoto-runners",
}  # fmt: skip
OPERATOR_TARGET = {
    "namespace": "shigoto-system", "pod": "shigoto-operator-5d8f-q7m2c", "container": "operator",
    "endpoint": "metrics", "job": "shigoto-system/shigoto-operator",
}  # fmt: skip
#: (Queue object, queue) the operator watches on the test database, all in namespace shop.
QUEUES = (("emails", "mail"), ("clean", "clean"), ("stuck", "stuck"), ("held", "held"))
#: Queues without a runner, filled at every step; `held` is paused by its Queue's spec.
UNSERVED = ("stuck", "held")

RUNNING, STOPPED, NO_OPERATOR = range(0, 20), range(20, 34), range(34, 52)


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        missing(
            "promtool is not installed: it comes with Debian's prometheus package "
            "(`apt-get install -y prometheus`)"
        )
    return path


def run_promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *map(str, args)], capture_output=True, text=True, timeout=60
    )


def test_the_prometheus_rule_passes_promtool_check(tmp_path: Path) -> None:
    path = tmp_path / "shigoto-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule_groups()}))
    result = run_promtool("check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def grafana_to_promql(expression: str) -> str:
    """A dashboard query as Prometheus receives it: Grafana's variables filled in."""
    return (
        expression.replace("$__rate_interval", "5m")
        .replace("$namespace", ".*")
        .replace("$queue", ".*")
    )


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    queries = [grafana_to_promql(expr) for _, expr in dashboard_expressions(variables=False)]
    records = [{"record": f"dashboard:query_{i}", "expr": q} for i, q in enumerate(queries)]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    result = run_promtool("check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


# --- a recorded run ----------------------------------------------------------------------------


class Recording:
    """Scrapes, one step each: (name, labels) -> {step: value}. Only the samples the rules
    read are kept (no `_created`, no histogram buckets they do not use)."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.step = 0
        self.series: dict[tuple[str, tuple[tuple[str, str], ...]], dict[int, float]] = {}

    def add(self, text: str | None, target: dict[str, str], *, honor_labels: bool) -> None:
        """One scrape's samples at the current step; None: the scrape failed (no samples)."""
        if text is None:
            return
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name not in self.names:
                    continue
                labels = dict(sample.labels)
                for key, value in target.items():
                    if key in labels and not honor_labels:
                        labels[f"exported_{key}"] = labels[key]
                    if key not in labels or not honor_labels:
                        labels[key] = value
                key = (sample.name, tuple(sorted(labels.items())))
                self.series.setdefault(key, {})[self.step] = sample.value

    def input_series(self) -> list[dict[str, str]]:
        """promtool's input_series: one value per step, `_` where no sample was scraped."""
        out = []
        for (name, labels), values in sorted(self.series.items()):
            selector = name + "{" + ",".join(f"{k}={json.dumps(v)}" for k, v in labels) + "}"
            steps = (repr(float(values[i])) if i in values else "_" for i in range(self.step))
            out.append({"series": selector, "values": " ".join(steps)})
        return out


def scrape(port: int) -> str | None:
    """/metrics over HTTP; None when nothing answers (the process is gone)."""
    try:
        code, _, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    except OSError:
        return None
    assert code == 200
    return body.decode()


def counter(text: str | None, name: str, queue: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text or ""):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("queue") == queue:
                total += sample.value
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def enqueue(queue: str, count: int, worker: str = ECHO, **args: Any) -> None:
    if count:
        shigoto.enqueue_many([{"worker": worker, "args": args, "queue": queue}] * count)


class Operator:
    """The operator's metrics side, as handlers wires it, without kopf: the registry of
    databases (each probed every 0.2 s), the metrics, and their HTTP server."""

    def __init__(self) -> None:
        # any port but 0 turns the probe on; the server below binds a free one
        self.databases = Databases(OperatorConfig(metrics_port=9090, metrics_interval=0.2))
        self.metrics = OperatorMetrics(self.databases.samples)
        self.server = MetricsServer(self.metrics.registry, "127.0.0.1", 0)
        self.db: Database | None = None

    async def watch(self, db_url: str, nowhere: str) -> None:
        for name, queue in QUEUES:
            self.db = await self.databases.acquire(db_url, "public", f"Queue/shop/{name}",
                                                   queue=queue)  # fmt: skip
        await self.databases.acquire(nowhere, "public", "Queue/crm/lost", queue="lost")

    async def reconcile(self) -> None:
        """What each Queue's pass records: counts read through the counts cache (the lost
        database's Queue has none, as when its pass finds it unreachable)."""
        assert self.db is not None
        for name, queue in QUEUES:
            self.metrics.reconcile_started(QUEUE)
            reading = await self.db.counts.get(queue, max_age=0)
            self.metrics.observe_queue("shop", name, queue, counts=reading.counts,
                                       desired=None, deployment=None,
                                       paused=queue == "held")  # fmt: skip
        self.metrics.reconcile_started(QUEUE)
        self.metrics.observe_queue("crm", "lost", "lost", counts=None, desired=None,
                                   deployment=None)  # fmt: skip


async def record_run(
    db_url: str, start_runner: Callable[..., RunnerProcess], names: set[str]
) -> tuple[Recording, str]:
    """The run described in the module docstring; the recording, and the lost database's
    name as the metrics give it."""
    recording = Recording(names)
    runner_port = free_port()
    runner = start_runner("--health-port", str(runner_port), "--queue", "clean=5",
                          workers=WORKERS, queue="mail=5")  # fmt: skip
    nowhere = f"postgresql://crm:pw@127.0.0.1:{free_port()}/crm"
    operator = Operator()
    try:
        await operator.watch(db_url, nowhere)
        overdue = datetime.now(UTC) - timedelta(minutes=20)
        for queue in UNSERVED:
            shigoto.enqueue(ECHO, {}, queue=queue, scheduled_at=overdue)
            enqueue(queue, 149)

        def probed() -> bool:  # the lost database's first probe waits out the pool's timeout
            return all(s.health is not None for s in operator.databases.samples())

        await until(probed, timeout=40, message="both databases probed")
        def ready() -> bool:
            try:
                return http_get(f"http://127.0.0.1:{runner_port}/readyz")[0] == 200
            except OSError:
                return False

        await until(ready, timeout=40, message="runner ready")

        async def step(runner_text: str | None) -> None:
            await operator.reconcile()
            recording.add(runner_text, RUNNER_TARGET, honor_labels=False)
            recording.add(scrape(operator.server.port), OPERATOR_TARGET, honor_labels=True)
            recording.step += 1

        for i in RUNNING:
            if i:
                enqueue("mail", 3)
                enqueue("mail", 2, DISCARD, kind="discard", value="bad input")
                enqueue("clean", 2)
                for queue in UNSERVED:
                    enqueue(queue, 20)

            def caught_up(i: int = i) -> str | None:
                text = scrape(runner_port)
                done = (
                    counter(text, "shigoto_jobs_completed_total", "mail") == 3 * i
                    and counter(text, "shigoto_jobs_discarded_total", "mail") == 2 * i
                    and counter(text, "shigoto_jobs_completed_total", "clean") == 2 * i
                )
                return text if done else None

            await step(await until(caught_up, timeout=30, message=f"step {i} jobs done"))

        runner.signal(signal.SIGTERM)
        assert runner.wait_exit() == 0, runner.output()
        enqueue("mail", 30)
        assert operator.db is not None
        db = operator.db

        async def no_runner_left() -> bool:
            db.health = await db.probe()
            return db.health.runners.get("mail", 0) == 0

        await until(no_runner_left, message="the stopped runner's node is gone")
        for _ in STOPPED:
            for queue in UNSERVED:
                enqueue(queue, 20)
            await step(scrape(runner_port))
        operator.server.stop()
        for _ in NO_OPERATOR:
            await step(scrape(runner_port))
    finally:
        operator.server.stop()
        await operator.databases.close()
    return recording, describe(nowhere)


def firing(alert: str, *labelled: dict[str, str]) -> dict[str, Any]:
    return {"alertname": alert, "exp_alerts": [{"exp_labels": labels} for labels in labelled]}


def expectations(lost_database: str) -> dict[int, list[dict[str, Any]]]:
    """Minute -> every alert and exactly what it must fire at that minute ([] = nothing)."""
    operator = {k: v for k, v in OPERATOR_TARGET.items() if k != "namespace"}

    def queue(name: str, severity: str, **extra: str) -> dict[str, str]:
        return {**operator, "namespace": "shop", "queue": name, "severity": severity, **extra}

    available = {"state": "available"}
    lost = {**OPERATOR_TARGET, "database": lost_database, "schema": "public",
            "severity": "critical"}  # fmt: skip
    discards = {"namespace": "shop", "queue": "mail", "severity": "warning"}
    everything_quiet = {rule["alert"]: firing(rule["alert"]) for rule in rules()}

    def at(**fired: dict[str, Any]) -> list[dict[str, Any]]:
        return list({**everything_quiet, **fired}.values())

    return {
        # every condition that holds from the start is still pending: none has lasted its `for`
        4: at(),
        # the runner alive: discards in mail; stuck has no runner, a growing backlog, an old
        # job; the lost database is down. mail and clean have runners and nothing waiting;
        # held is stuck's twin, but paused on purpose.
        19: at(
            ShigotoDiscardRateHigh=firing("ShigotoDiscardRateHigh", discards),
            ShigotoQueueNoLiveRunner=firing(
                "ShigotoQueueNoLiveRunner", queue("stuck", "critical", **available)
            ),
            ShigotoQueueBacklogGrowing=firing(
                "ShigotoQueueBacklogGrowing", queue("stuck", "warning", **available)
            ),
            ShigotoOldestAvailableJobTooOld=firing(
                "ShigotoOldestAvailableJobTooOld", queue("stuck", "warning")
            ),
            ShigotoDatabaseUnreachable=firing("ShigotoDatabaseUnreachable", lost),
        ),
        # the runner gone for over 10 minutes with jobs left in mail: no live runner there
        # too; its discards are no longer scraped, so that alert resolved
        33: at(
            ShigotoQueueNoLiveRunner=firing(
                "ShigotoQueueNoLiveRunner",
                queue("mail", "critical", **available),
                queue("stuck", "critical", **available),
            ),
            ShigotoQueueBacklogGrowing=firing(
                "ShigotoQueueBacklogGrowing", queue("stuck", "warning", **available)
            ),
            ShigotoOldestAvailableJobTooOld=firing(
                "ShigotoOldestAvailableJobTooOld", queue("stuck", "warning")
            ),
            ShigotoDatabaseUnreachable=firing("ShigotoDatabaseUnreachable", lost),
        ),
        # no operator metrics for over 10 minutes: only the absence alert can say so
        51: at(ShigotoOperatorAbsent=firing("ShigotoOperatorAbsent", {"severity": "critical"})),
    }


def without_annotations(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {**group, "rules": [{k: v for k, v in r.items() if k != "annotations"}
                            for r in group["rules"]]}
        for group in groups
    ]  # fmt: skip


async def test_alerts_fire_on_a_recorded_run_and_only_there(
    db_url: str, runner_processes: Callable[..., RunnerProcess], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    promtool()  # before the run, not after it
    # The lost database's probe gives up after the pool's timeout (10 s), shorter here: the
    # alerts read whether it is up, never how long a probe took to find out.
    monkeypatch.setattr(databases, "QUERY_TIMEOUT", 2.0)
    names = {name for rule in rules() for name in metric_names(rule["expr"])}
    recording, lost_database = await record_run(db_url, runner_processes, names)
    assert recording.step == NO_OPERATOR.stop
    assert {name for name, _ in recording.series} == names  # every metric the rules read

    (tmp_path / "rules.yaml").write_text(
        yaml.safe_dump({"groups": without_annotations(rule_groups())})
    )
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": recording.input_series(),
                "alert_rule_test": [
                    {"eval_time": f"{minute}m", **case}
                    for minute, cases in expectations(lost_database).items()
                    for case in cases
                ],
            }
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, width=10_000))
    result = run_promtool("test", "rules", tmp_path / "tests.yaml")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
