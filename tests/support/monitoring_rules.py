"""deploy/monitoring/'s alerts and dashboard queries, read for the tests that check them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"

#: A metric name in PromQL: our prefixes, then name characters. Label names inside braces
#: never start with these prefixes, and functions never do.
_METRIC = re.compile(r"\b((?:shigoto|process|python)_[a-zA-Z0-9_]*)")


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((MONITORING / name).read_text()) if d]


def rule_groups() -> list[dict[str, Any]]:
    """The PrometheusRule's `spec.groups`: a Prometheus rule file's content."""
    [rule] = documents("prometheus-rule.yaml")
    return list(rule["spec"]["groups"])


def rules() -> list[dict[str, Any]]:
    return [r for group in rule_groups() for r in group["rules"]]


def dashboard() -> dict[str, Any]:
    return dict(json.loads((MONITORING / "grafana-dashboard.json").read_text()))


def dashboard_expressions(*, variables: bool = True) -> Iterator[tuple[str, str]]:
    """(panel title, expression) of every query of the dashboard, variables' too if asked."""
    board = dashboard()
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    if variables:
        for variable in board["templating"]["list"]:
            if variable["type"] == "query":
                yield f"variable {variable['name']}", variable["query"]["query"]


def metric_names(expression: str) -> set[str]:
    return set(_METRIC.findall(expression))
