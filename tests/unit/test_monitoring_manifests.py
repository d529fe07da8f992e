"""deploy/monitoring/ names only metrics that exist and scrapes the ports that exist.

An alert on a misspelt metric never fires and a dashboard panel on one stays empty, and
neither says so; a PodMonitor on a renamed port scrapes nothing. So every metric an alert or a
panel names is checked against what `RunnerMetrics` and `OperatorMetrics` really register, and
the PodMonitors against the labels and port names the operator gives the pods. (promtool
checks the expressions' syntax: tests/integration/test_monitoring_rules.py.)
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from shigoto.ops.metrics import RunnerMetrics
from shigoto_operator import builders
from shigoto_operator.metrics import DatabaseHealth, DatabaseSample, OperatorMetrics
from shigoto_operator.policy import JobCounts
from shigoto_operator.spec import parse_queue
from tests.support.monitoring_rules import (
    MONITORING,
    dashboard,
    dashboard_expressions,
    documents,
    metric_names,
    rules,
)

ROOT = Path(__file__).resolve().parents[2]


def exported_names() -> set[str]:
    """Every sample name a runner or the operator can export: counters with `_total`,
    histograms with `_bucket`, `_count`, `_sum`, the process collectors included."""
    runner = RunnerMetrics("node", process_metrics=True)
    operator = OperatorMetrics(
        lambda: [DatabaseSample("db:5432/x", "public", DatabaseHealth(True), (("n", "q"),))]
    )
    operator.observe_queue("n", "q", "q", counts=JobCounts(), desired=0, deployment=None)
    names = set()
    for registry in (runner.registry, operator.registry):
        for family in registry.collect():
            if family.type == "counter":
                names.add(family.name + "_total")
            elif family.type == "histogram":
                names.update(family.name + suffix for suffix in ("_bucket", "_count", "_sum"))
            else:
                names.add(family.name)
    return names


def test_the_name_pattern_finds_names_and_skips_labels_and_functions() -> None:
    found = metric_names(
        'histogram_quantile(0.95, sum by (le, queue) (rate(shigoto_job_duration_seconds_bucket'
        '{namespace=~"$namespace"}[5m]))) / on (queue) shigoto_queue_depth{state="available"}'
    )
    assert found == {"shigoto_job_duration_seconds_bucket", "shigoto_queue_depth"}


def test_every_alert_names_only_exported_metrics() -> None:
    exported = exported_names()
    for rule in rules():
        names = metric_names(rule["expr"])
        assert names, f"{rule['alert']}: no Shigoto metric in its expression"
        assert names <= exported, f"{rule['alert']}: not exported: {names - exported}"


def test_every_dashboard_query_names_only_exported_metrics() -> None:
    exported = exported_names()
    seen = 0
    for title, expression in dashboard_expressions():
        names = metric_names(expression)
        assert names, f"{title}: no Shigoto metric in {expression}"
        assert names <= exported, f"{title}: not exported: {names - exported}"
        seen += 1
    assert seen >= 20


def test_the_issue_asks_for_these_alerts_and_each_explains_itself() -> None:
    alerts = {rule["alert"]: rule for rule in rules()}
    assert {
        "ShigotoQueueBacklogGrowing",
        "ShigotoOldestAvailableJobTooOld",
        "ShigotoDiscardRateHigh",
        "ShigotoQueueNoLiveRunner",
        "ShigotoDatabaseUnreachable",
    } <= set(alerts)
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), name


def test_alerts_match_the_table_in_docs_monitoring() -> None:
    doc = (ROOT / "docs" / "monitoring.md").read_text()
    rows = dict(re.findall(r"^\| `(Shigoto\w+)` \| [^|]* \| ([^|]*) \|", doc, re.M))
    documented = {name: cell.strip() for name, cell in rows.items()}
    assert {rule["alert"]: rule.get("for") or "—" for rule in rules()} == documented


def test_the_runner_memory_panel_selects_the_runner_container() -> None:
    [memory] = [expr for _, expr in dashboard_expressions() if "process_resident" in expr]
    assert f'container="{builders.RUNNER_CONTAINER}"' in memory


def test_panels_have_unique_ids_and_fit_the_grid() -> None:
    panels = dashboard()["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


# --- what gets scraped -------------------------------------------------------------------------


def pod_monitor(name: str) -> dict[str, Any]:
    [found] = [d for d in documents("pod-monitors.yaml") if d["metadata"]["name"] == name]
    return found


def test_the_runner_pod_monitor_selects_the_operators_runner_pods_and_port() -> None:
    spec = parse_queue(
        "emails",
        "shop",
        {"database": {"secretRef": {"name": "pg"}}, "runner": {"image": "example.com/w:1"}},
    )
    template = builders.pod_template(spec)
    monitor = pod_monitor("shigoto-runners")["spec"]
    assert monitor["namespaceSelector"] == {"any": True}
    assert monitor["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    [endpoint] = monitor["podMetricsEndpoints"]
    [container] = template["spec"]["containers"]
    assert endpoint["port"] in {port["name"] for port in container["ports"]}
    assert endpoint["path"] == template["metadata"]["annotations"]["prometheus.io/path"]


def test_the_operator_pod_monitor_selects_the_operator_pod_and_its_metrics_port() -> None:
    [deployment] = [
        d
        for d in yaml.safe_load_all((ROOT / "deploy/operator/operator-deployment.yaml").read_text())
        if d
    ]
    pod = deployment["spec"]["template"]
    [container] = pod["spec"]["containers"]
    monitor = pod_monitor("shigoto-operator")["spec"]
    assert monitor["namespaceSelector"]["matchNames"] == [deployment["metadata"]["namespace"]]
    assert monitor["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    [endpoint] = monitor["podMetricsEndpoints"]
    # the Queue's namespace label must survive the scrape
    assert endpoint["honorLabels"] is True
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert str(ports[endpoint["port"]]) == env["SHIGOTO_OPERATOR_METRICS_PORT"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ports[endpoint["port"]])


def test_monitoring_is_opt_in() -> None:
    base = yaml.safe_load((ROOT / "deploy" / "kustomization.yaml").read_text())
    assert not any("monitoring" in entry for entry in base["resources"])


@pytest.mark.parametrize("name", ["pod-monitors.yaml", "prometheus-rule.yaml"])
def test_kustomization_lists_the_monitoring_files(name: str) -> None:
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    assert name in kustomization["resources"]
    [generator] = kustomization["configMapGenerator"]
    assert generator["options"]["labels"]["grafana_dashboard"] == "1"
    assert generator["files"] == ["shigoto.json=grafana-dashboard.json"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (embedded kustomize) absent")
def test_kustomize_builds_the_monitoring_bundle() -> None:
    result = subprocess.run(
        ["kubectl", "kustomize", str(MONITORING)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    rendered = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in rendered) == [
        ("ConfigMap", "shigoto-grafana-dashboard"),
        ("PodMonitor", "shigoto-operator"),
        ("PodMonitor", "shigoto-runners"),
        ("PrometheusRule", "shigoto"),
    ]
    assert {o["metadata"]["namespace"] for o in rendered} == {"shigoto-system"}
    [config_map] = [o for o in rendered if o["kind"] == "ConfigMap"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["shigoto.json"]) == dashboard()
