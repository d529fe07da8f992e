"""Jobs as the dashboard's JSON: what a viewer may not see is taken out. Pure."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from shigoto.client.jobs import JobRecord
from shigoto.dashboard.auth import ShowArgs
from shigoto.dashboard.views import error_entry, job_detail, job_summary, unsealed
from shigoto.job import JobState

ENVELOPE = {"$shigoto_enc": 1, "kid": "k1", "for": {"queue": "q", "id": 7}, "nonce": "n",
            "ct": "c"}  # fmt: skip
AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def job(**changes: object) -> JobRecord:
    values: dict[str, object] = {"id": 7, "queue": "q", "worker": "app.w",
                                 "args": {"card": "4111"}, "state": JobState.DISCARDED,
                                 "inserted_at": AT, "finished_at": AT}  # fmt: skip
    values.update(changes)
    return JobRecord(**values)  # type: ignore[arg-type]


def test_plain_args_follow_the_policy() -> None:
    assert job_summary(job(), True, ShowArgs.TOKEN)["args"] == {"card": "4111"}
    hidden = job_summary(job(), False, ShowArgs.TOKEN)
    assert hidden["args"] is None and hidden["args_hidden"] == "token"
    never = job_summary(job(), False, ShowArgs.NEVER)
    assert never["args"] is None and never["args_hidden"] == "never"


def test_timestamps_are_iso_with_offset() -> None:
    view = job_summary(job(), True, ShowArgs.ALWAYS)
    assert view["inserted_at"] == "2026-01-02T03:04:05+00:00" and view["attempted_at"] is None


def test_sealed_values_never_leave_whatever_the_policy() -> None:
    sealed = job(
        args=ENVELOPE, result=ENVELOPE,
        errors=[{"attempt": 1, "at": "t", "error": "ValueError", "traceback": "",
                 "sealed": ENVELOPE}],
        meta={"forwarded_from": {"id": 3, "result": ENVELOPE,
                                 "errors": [{"error": "ValueError", "sealed": ENVELOPE}]}},
    )  # fmt: skip
    view = job_detail(sealed, True, ShowArgs.ALWAYS)
    assert view["args"] is None and view["args_hidden"] == "encrypted"
    assert view["result"] is None and view["result_sealed"] is True
    assert view["errors"] == [{"attempt": 1, "at": "t", "error": "ValueError",
                               "traceback": None, "sealed": True}]  # fmt: skip
    assert "$shigoto_enc" not in json.dumps(view) and '"ct"' not in json.dumps(view)
    assert view["meta"]["forwarded_from"]["result"] == {"sealed": True}


def test_plain_errors_and_results_are_shown() -> None:
    entry = {"attempt": 2, "at": "t", "error": "ValueError: boom", "traceback": "Traceback..."}
    assert error_entry(entry) == entry
    view = job_detail(job(result={"ok": 1}, errors=[entry]), False, ShowArgs.TOKEN)
    assert view["result"] == {"ok": 1} and view["result_sealed"] is False
    assert view["errors"] == [entry]


def test_unsealed_walks_lists_and_mappings() -> None:
    assert unsealed([1, {"a": ENVELOPE}, "x"]) == [1, {"a": {"sealed": True}}, "x"]
    assert unsealed(ENVELOPE) == {"sealed": True}
    assert unsealed(None) is None
