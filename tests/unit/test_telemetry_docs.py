"""docs/telemetry.md is the one table of events and metrics: it must list exactly the events
`shigoto.telemetry.EVENTS` fixes and exactly the metrics `RunnerMetrics` registers."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram

from shigoto import telemetry
from shigoto.ops.metrics import RunnerMetrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "telemetry.md"

#: A table row whose first cell is a backquoted name: | `name` | ... |
_ROW = re.compile(r"^\| `([a-z_.]+)` \|(.*)\|\s*$", re.M)


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _keys(cell: str) -> frozenset[str]:
    """The keys a cell lists, `(none)` being no key."""
    return frozenset(k.strip() for k in cell.split(",") if k.strip() and k.strip() != "(none)")


def documented_events() -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """Each documented event with its (measurement keys, metadata keys)."""
    events = {}
    for name, rest in _ROW.findall(_section("Events")):
        cells = [c.strip() for c in rest.split("|")]
        assert len(cells) == 4, f"{name}: expected when | by | measurements | metadata"
        events[name] = (_keys(cells[2]), _keys(cells[3]))
    return events


def documented_metrics() -> dict[str, tuple[str, frozenset[str]]]:
    """Each documented metric with its (type, label names)."""
    metrics = {}
    for name, rest in _ROW.findall(_section("Metrics")):
        cells = [c.strip() for c in rest.split("|")]
        metrics[name] = (cells[0], _keys(cells[1]))
    return metrics


def test_the_documented_events_are_exactly_the_known_events() -> None:
    assert set(documented_events()) == set(telemetry.EVENTS)


def test_every_documented_event_names_its_measurements_and_metadata_cells() -> None:
    # An event without metadata would be one no subscriber could tell apart; the runner's
    # carry `node` so metrics can keep to their own node.
    for name, (_, metadata) in documented_events().items():
        assert metadata, name


def registered_metrics() -> dict[str, tuple[str, frozenset[str]]]:
    """What a `RunnerMetrics` registers, as the table names it (counters with `_total`).

    prometheus_client has no public accessor for a metric's label names before it has a
    sample, so this reads the metric objects' own `_type` and `_labelnames`."""
    metrics = RunnerMetrics("node", process_metrics=False)
    found = {}
    for value in vars(metrics).values():
        if isinstance(value, Counter | Gauge | Histogram):
            suffix = "_total" if value._type == "counter" else ""
            found[value._name + suffix] = (value._type, frozenset(value._labelnames))
    return found


def test_the_documented_metrics_are_exactly_what_the_runner_registers() -> None:
    registered = registered_metrics()
    assert set(documented_metrics()) == set(registered)
    for name, (kind, labels) in documented_metrics().items():
        assert registered[name] == (kind, labels), name


def test_every_registered_metric_is_one_of_the_runners_attributes() -> None:
    # The comparison above walks the attributes: a metric registered without one would be
    # missed there, so count the registry's own families too.
    metrics = RunnerMetrics("node", process_metrics=False)
    families = {f.name + ("_total" if f.type == "counter" else "")
                for f in metrics.registry.collect()}  # fmt: skip
    assert families == set(registered_metrics())
