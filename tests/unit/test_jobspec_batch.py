"""`jobspec.build_many` validates each (worker, options) pair of a batch once and each entry's
args on their own (`_Templates`), and `_fast_json_object` checks and encodes args in one walk:
both must give exactly what `build` and `_json_object` give, specs and refusals alike."""

from __future__ import annotations

import dataclasses
import enum
import math
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from shigoto import jobspec
from shigoto.encryption.envelope import MARKER
from shigoto.errors import ValidationError
from shigoto.worker import worker


@worker(name="tests.unit.jobspec_batch.send", queue="mail", priority=3, tags=["mail"])
def send(to: str, cc: str | None = None) -> None:
    """A function worker with defaults (queue, priority, tags) and a signature to fit."""


def _built(entries: list[dict[str, Any]]) -> list[jobspec.JobSpec]:
    return [jobspec.build(e["worker"], e.get("args"),
                          **{k: v for k, v in e.items() if k not in ("worker", "args")})
            for e in entries]  # fmt: skip


ENTRIES: list[list[dict[str, Any]]] = [
    [{"worker": "app.w", "args": {"n": n}, "queue": "bulk"} for n in range(5)],
    [{"worker": send, "args": {"to": f"u{n}@x"}} for n in range(3)],
    [{"worker": send, "args": {"to": "a", "cc": "b"}, "priority": 9, "schedule_in": 30}],
    [{"worker": "app.w", "args": {"n": 1}, "tags": ["a"], "meta": {"m": 1}},
     {"worker": "app.w", "args": {"n": 2}, "tags": ["a"], "meta": {"m": 1}}],
    [{"worker": "app.w", "args": {"n": n}, "unique": {"keys": ["args"]}} for n in range(3)],
    [{"worker": "app.w", "args": {"n": 1}, "partition_key": "t-1",
      "scheduled_at": datetime(2030, 1, 1, tzinfo=UTC)},
     {"worker": "app.w"}, {"worker": "app.w", "args": {"n": 1}, "depends_on": [1, 2]}],
]  # fmt: skip


@pytest.mark.parametrize("entries", ENTRIES)
def test_build_many_gives_what_build_gives_entry_by_entry(entries: list[dict[str, Any]]) -> None:
    assert jobspec.build_many(entries) == _built(entries)


def test_jobs_of_one_template_do_not_share_their_tags_list() -> None:
    specs = jobspec.build_many([{"worker": send, "args": {"to": "a"}}] * 2)
    assert specs[0].tags == ["mail"]
    assert specs[0].tags is not specs[1].tags


def test_each_entry_is_checked_against_the_signature_whatever_its_template() -> None:
    with pytest.raises(ValidationError) as caught:
        jobspec.build_many([{"worker": send, "args": {"to": "a"}},
                            {"worker": send, "args": {"too": "a"}}])  # fmt: skip
    assert caught.value.field == "jobs[1].args.too"


def test_an_entry_with_several_problems_names_the_one_build_names() -> None:
    entry = {"worker": "app.w", "args": {"n": math.nan}, "priority": "high"}
    with pytest.raises(ValidationError) as one:
        jobspec.build("app.w", entry["args"], priority="high")
    with pytest.raises(ValidationError) as many:
        jobspec.build_many([{"worker": "app.w", "args": {"n": 1}}, entry])
    assert many.value.field == f"jobs[1].{one.value.field}"


def test_a_bad_option_in_a_later_entry_of_a_known_template_is_still_refused() -> None:
    good = {"worker": "app.w", "args": {"n": 1}, "queue": "q"}
    with pytest.raises(ValidationError) as caught:
        jobspec.build_many([good, {**good, "queue": "bad queue!"}])
    assert caught.value.field == "jobs[1].queue"


class Color(enum.Enum):
    RED = "red"


class Text(str):
    pass


@dataclasses.dataclass
class Point:
    x: int


PLAIN = [
    {}, {"n": 1}, {"s": "héllo ✓", "f": 1.5, "b": True, "z": None, "l": [1, [2, {"k": "v"}]]},
    {"t": (1, 2)}, {"big": 2**70}, {"neg": -(2**63)}, {"f": 1e300}, {"e": "", "k": "\\"},
]  # fmt: skip


@pytest.mark.parametrize("value", PLAIN)
def test_fast_json_writes_the_standard_librarys_text(value: dict[str, Any]) -> None:
    assert jobspec._fast_json_object("args", value) == jobspec._json_object("args", value)


REFUSED = [
    {"f": math.nan}, {"f": math.inf}, {"u": uuid.uuid4()}, {"c": Color.RED},
    {"d": datetime.now(UTC)}, {"p": Point(1)}, {1: "int key"}, {"s": "\ud800"},
    {"nul": "a\x00b"}, {MARKER: 1}, "not a dict", ["a", "list"],
]  # fmt: skip


@pytest.mark.parametrize("value", REFUSED)
def test_fast_json_refuses_what_the_standard_path_refuses_in_its_words(value: Any) -> None:
    with pytest.raises(ValidationError) as standard:
        jobspec._json_object("args", value)
    with pytest.raises(ValidationError) as fast:
        jobspec._fast_json_object("args", value)
    assert (fast.value.field, fast.value.message) == (standard.value.field, standard.value.message)


def test_fast_json_takes_subclasses_as_the_standard_path_does() -> None:
    value = {"s": Text("x"), "i": True}
    assert jobspec._fast_json_object("args", value) == jobspec._json_object("args", value)


def test_fast_json_refuses_nesting_past_the_limit() -> None:
    deep: Any = {}
    for _ in range(jobspec.MAX_DEPTH + 1):
        deep = {"d": deep}
    with pytest.raises(ValidationError, match="deeper than"):
        jobspec._fast_json_object("args", deep)
