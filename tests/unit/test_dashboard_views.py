"""Jobs as the dashboard's JSON: what a viewer may not see is taken out. Pure."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from shigoto.client.jobs import JobRecord
from shigoto.dashboard.auth import ShowArgs, Viewer
from shigoto.dashboard.views import (
    PUBLIC_FIELDS,
    error_class,
    error_entry,
    filter_refusal,
    job_detail,
    job_summary,
    unsealed,
)
from shigoto.job import JobState

ENVELOPE = {"$shigoto_enc": 1, "kid": "k1", "for": {"queue": "q", "id": 7}, "nonce": "n",
            "ct": "c"}  # fmt: skip
AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
SIGNED_IN = Viewer(signed_in=True, may_see_args=True)
ANONYMOUS = Viewer(signed_in=False, may_see_args=False)


def job(**changes: object) -> JobRecord:
    values: dict[str, object] = {"id": 7, "queue": "q", "worker": "app.w",
                                 "args": {"card": "4111"}, "state": JobState.DISCARDED,
                                 "inserted_at": AT, "finished_at": AT}  # fmt: skip
    values.update(changes)
    return JobRecord(**values)  # type: ignore[arg-type]


def test_plain_args_follow_the_policy() -> None:
    assert job_summary(job(), SIGNED_IN)["args"] == {"card": "4111"}
    hidden = job_summary(job(), ANONYMOUS)
    assert hidden["args"] is None and hidden["args_hidden"] == "token"
    never = job_detail(job(unique_key="unique:abc"), Viewer(True, False, ShowArgs.NEVER))
    assert never["args"] is None and never["args_hidden"] == "never"
    assert never["unique_key"] is None and never["hidden"] == ["args", "unique_key"]
    always = job_summary(job(), Viewer(False, True, ShowArgs.ALWAYS))
    assert always["args"] == {"card": "4111"} and always["tags"] is None


def test_timestamps_are_iso_with_offset() -> None:
    view = job_summary(job(), SIGNED_IN)
    assert view["inserted_at"] == "2026-01-02T03:04:05+00:00" and view["attempted_at"] is None


def test_sealed_values_never_leave_whatever_the_policy() -> None:
    sealed = job(
        args=ENVELOPE, result=ENVELOPE,
        errors=[{"attempt": 1, "at": "t", "error": "ValueError", "traceback": "",
                 "sealed": ENVELOPE}],
        meta={"forwarded_from": {"id": 3, "result": ENVELOPE,
                                 "errors": [{"error": "ValueError", "sealed": ENVELOPE}]}},
    )  # fmt: skip
    view = job_detail(sealed, SIGNED_IN)
    assert view["args"] is None and view["args_hidden"] == "encrypted"
    assert view["result"] is None and view["result_sealed"] is True
    assert view["errors"] == [{"attempt": 1, "at": "t", "error": "ValueError",
                               "traceback": None, "sealed": True,
                               "error_class": "ValueError"}]  # fmt: skip
    assert "$shigoto_enc" not in json.dumps(view) and '"ct"' not in json.dumps(view)
    assert view["meta"]["forwarded_from"]["result"] == {"sealed": True}


def test_plain_errors_and_results_are_shown_to_a_signed_in_viewer() -> None:
    entry = {"attempt": 2, "at": "t", "error": "ValueError: boom", "traceback": "Traceback..."}
    assert error_entry(entry) == {**entry, "error_class": "ValueError"}
    view = job_detail(job(result={"ok": 1}, errors=[entry], meta={"m": 1}), SIGNED_IN)
    assert view["result"] == {"ok": 1} and view["result_sealed"] is False
    assert view["errors"] == [{**entry, "error_class": "ValueError"}] and view["hidden"] == []
    assert view["meta"] == {"m": 1}


def test_an_anonymous_viewer_gets_the_public_fields_only() -> None:
    entry = {"attempt": 2, "at": "t", "error": "ValueError: id 850704 bad", "traceback": "tb"}
    full = job(result={"id": "850704"}, errors=[entry], meta={"m": "850704"}, tags=["vip"],
               unique_key="unique:abc", partition_key="tenant-1", priority=3, progress=40)
    view = job_detail(full, ANONYMOUS)
    assert "850704" not in json.dumps(view) and "tenant-1" not in json.dumps(view)
    assert view["errors"] == [{"attempt": 2, "at": "t", "error": None, "traceback": None,
                               "error_class": "ValueError"}]  # fmt: skip
    assert view["id"] == 7 and view["state"] == "discarded" and view["queue"] == "q"
    shown = {k for k, v in view.items() if v is not None} - {"hidden", "errors"}
    assert shown <= PUBLIC_FIELDS
    assert {"args", "result", "meta", "tags", "unique_key", "partition_key", "priority",
            "progress"} <= set(view["hidden"])  # fmt: skip
    assert all(view[name] is None for name in view["hidden"])


def test_error_class_is_the_class_name_or_nothing() -> None:
    assert error_class("ValueError: boom: again") == "ValueError"
    assert error_class("billing.errors.Declined: card") == "billing.errors.Declined"
    assert error_class("TimeoutError") == "TimeoutError"
    assert error_class("result not storable: too big") is None
    assert error_class("parent job 3 was discarded") is None
    assert error_class(None) is None and error_class("") is None


def test_filters_on_hidden_values_are_refused() -> None:
    assert filter_refusal({"tag": "vip"}, ANONYMOUS) is not None
    assert filter_refusal({"args_contains": {"a": 1}}, ANONYMOUS) is not None
    assert filter_refusal({"queue": "q", "worker": "w", "state": ["completed"]}, ANONYMOUS) \
        is None  # fmt: skip
    assert filter_refusal({"tag": "vip", "args_contains": {"a": 1}}, SIGNED_IN) is None


def test_unsealed_walks_lists_and_mappings() -> None:
    assert unsealed([1, {"a": ENVELOPE}, "x"]) == [1, {"a": {"sealed": True}}, "x"]
    assert unsealed(ENVELOPE) == {"sealed": True}
    assert unsealed(None) is None
