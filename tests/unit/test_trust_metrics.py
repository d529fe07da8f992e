"""Metric labels stay bounded whatever job rows say: only served queues and registered
workers get labels of their own; the rest add up under `_other`."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from shigoto.db.ops_statements import LIVE_STATES
from shigoto.job import Job, JobState
from shigoto.ops.metrics import OTHER, RunnerMetrics

NODE = "node-a"


def labelled(m: RunnerMetrics, name: str) -> dict[tuple[str, ...], float]:
    text = m.exposition().decode()
    return {tuple(sorted(s.labels.values())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name}  # fmt: skip


def test_unknown_workers_and_unserved_queues_fold_into_other() -> None:
    served = {"q": 1}
    m = RunnerMetrics(NODE, process_metrics=False, queues=lambda: served,
                      workers=lambda: {"app.known"})  # fmt: skip
    for i in range(500):
        job = Job(id=i, queue="q", worker=f"made.up_{i}", args={}, state=JobState.EXECUTING)
        m.handle("job.stop", {"duration": 0.1}, {"job": job, "node": NODE, "result": None})
    known = Job(id=1, queue="q", worker="app.known", args={}, state=JobState.EXECUTING)
    m.handle("job.stop", {"duration": 0.1}, {"job": known, "node": NODE, "result": None})
    assert labelled(m, "shigoto_jobs_completed_total") == {
        tuple(sorted(("q", OTHER))): 500, tuple(sorted(("q", "app.known"))): 1,
    }  # fmt: skip
    m.set_depth([(f"stranger-{i}", "available", 1) for i in range(300)] + [("q", "available", 2)])
    depth = labelled(m, "shigoto_queue_depth")
    assert depth[tuple(sorted((OTHER, "available")))] == 300
    assert depth[tuple(sorted(("q", "available")))] == 2
    assert len(depth) == 2 * len(LIVE_STATES)  # two queues (q and OTHER), live states only


def test_a_queue_no_longer_served_loses_its_depth_series() -> None:
    served = {"q": 1, "r": 1}
    m = RunnerMetrics(NODE, process_metrics=False, queues=lambda: served)
    m.set_depth([("q", "available", 1), ("r", "available", 1)])
    del served["r"]
    m.set_depth([("q", "available", 1), ("r", "available", 4)])
    depth = labelled(m, "shigoto_queue_depth")
    assert not any("r" in key for key in depth)
    assert depth[tuple(sorted((OTHER, "available")))] == 4
