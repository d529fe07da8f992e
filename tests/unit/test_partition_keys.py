"""The partition_key enqueue option, the flow queue settings' validation and the fair claim's
pure decisions: no database."""

from __future__ import annotations

from typing import Any

import pytest

import shigoto
from shigoto import jobspec
from shigoto.client import queue_settings
from shigoto.client.enqueuing import OPTION_KEYWORDS
from shigoto.errors import ValidationError
from shigoto.job import Job, JobState
from shigoto.runtime.fair_claim import FairRow, last_served, more_to_offer

NAME = "tests.unit.partition.job"


@shigoto.worker(name="tests.unit.test_partition_keys.tenant_job")
def tenant_job(n: int = 0) -> None:
    """A worker enqueued as an object, so its signature and defaults apply."""


def test_partition_key_reaches_the_spec_and_its_params() -> None:
    spec = jobspec.build(NAME, {}, partition_key="tenant-42")
    assert spec.partition_key == "tenant-42"
    assert spec.as_params()["partition_key"] == "tenant-42"


def test_no_partition_key_is_the_one_unkeyed_partition() -> None:
    spec = jobspec.build(NAME, {})
    assert spec.partition_key is None and spec.as_params()["partition_key"] is None


def test_a_key_of_the_longest_length_is_accepted() -> None:
    assert jobspec.build(NAME, {}, partition_key="k" * 200).partition_key == "k" * 200


@pytest.mark.parametrize("bad", ["", "k" * 201, 42, b"tenant", ["t"], "a\x00b"])
def test_a_bad_partition_key_names_the_field_and_the_fix(bad: Any) -> None:
    with pytest.raises(ValidationError) as err:
        jobspec.build(NAME, {}, partition_key=bad)
    assert err.value.field == "partition_key"
    assert "1 to 200 characters" in err.value.message or "NUL" in err.value.message


def test_enqueue_many_names_the_entry_with_a_bad_key() -> None:
    with pytest.raises(ValidationError) as err:
        jobspec.build_many([{"worker": NAME}, {"worker": NAME, "partition_key": ""}])
    assert err.value.field == "jobs[1].partition_key"


def test_worker_new_and_options_take_a_partition_key() -> None:
    assert tenant_job.new({"n": 1}, partition_key="t1").partition_key == "t1"
    assert "partition_key" in OPTION_KEYWORDS
    assert repr(tenant_job.options(partition_key="t1")).endswith("{'partition_key': 't1'}>")
    with pytest.raises(ValidationError) as err:
        tenant_job.new({"n": 1}, partition_key="x" * 300)
    assert err.value.field == "partition_key"


# -- the flow queue settings ----------------------------------------------------------------


def test_flow_settings_left_out_are_not_written() -> None:
    assert queue_settings.flow_values() == {}


def test_flow_settings_as_stored() -> None:
    limit = shigoto.RateLimit(100, per=60)
    assert queue_settings.flow_values(True, 3, 2, limit) == {
        "fair": True, "weight": 3, "partition_concurrency": 2, "rate_limit": limit.to_json(),
    }  # fmt: skip
    assert queue_settings.flow_values(partition_concurrency=None, rate_limit=None) == {
        "partition_concurrency": None, "rate_limit": None,
    }  # fmt: skip
    as_dict = queue_settings.flow_values(rate_limit={"limit": 5, "algorithm": "token_bucket"})
    assert as_dict["rate_limit"] == shigoto.RateLimit(5, algorithm="token_bucket").to_json()


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"fair": "yes"}, "fair"),
        ({"fair": 1}, "fair"),
        ({"weight": 0}, "weight"),
        ({"weight": True}, "weight"),
        ({"weight": 1.5}, "weight"),
        ({"weight": 2**31}, "weight"),
        ({"partition_concurrency": 0}, "partition_concurrency"),
        ({"partition_concurrency": "3"}, "partition_concurrency"),
        ({"rate_limit": "100/s"}, "rate_limit"),
        ({"rate_limit": {"per": 1}}, "rate_limit.limit"),
        ({"rate_limit": {"limit": 0}}, "rate_limit.limit"),
        ({"rate_limit": {"limit": 5, "burst": 2, "algorithm": "leaky_bucket"}},
         "rate_limit.burst"),
        ({"rate_limit": {"limit": 5, "every": 2}}, "rate_limit.every"),
    ],
)  # fmt: skip
def test_a_bad_flow_setting_names_its_field(given: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        queue_settings.flow_values(**given)
    assert err.value.field == field
    assert err.value.message


def test_a_settings_row_becomes_a_queue_setting() -> None:
    limit = shigoto.RateLimit(10, per=2.0, burst=1)
    row = ("q", 5, False, False, True, 3, 2, limit.to_json(), True)
    assert queue_settings.setting_of(row) == queue_settings.QueueSetting(
        5, False, False, fair=True, weight=3, partition_concurrency=2, rate_limit=limit,
        encrypted=True,
    )


def test_a_stored_rate_limit_no_runner_can_use_is_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    row = ("q", None, False, False, False, 1, None, {"limit": 5, "unknown": 1}, False)
    assert queue_settings.setting_of(row).rate_limit is None
    assert "rate_limit ignored" in caplog.text


# -- the fair claim's rounds ----------------------------------------------------------------


def _job(key: str | None) -> Job:
    return Job(id=1, queue="q", worker="w", args={}, state=JobState.EXECUTING,
               partition_key=key)  # fmt: skip


def _rows(*keys: str | None, share: int = 2) -> list[FairRow]:
    """One row per key, each in its own place of the walk, all of turn 1."""
    return [FairRow(_job(key), share, 1, n) for n, key in enumerate(keys, 1)]


def test_another_round_when_a_partition_gave_its_whole_share_and_the_claim_is_short() -> None:
    assert more_to_offer(_rows("big", "big", "a"), 10)


def test_no_other_round_when_every_partition_ran_short() -> None:
    assert not more_to_offer(_rows("a", None), 10)


def test_no_other_round_when_full_or_empty() -> None:
    assert not more_to_offer(_rows("a", "b", share=1), 2)
    assert not more_to_offer([], 10)


def test_the_next_claim_starts_after_the_partition_served_last_in_round_robin_order() -> None:
    """The greatest turn first, then the latest in the walk; not the greatest key: the walk
    may have wrapped around past the last key."""
    assert last_served(_rows("c", "d", "a")) == "a"
    later_turn = [FairRow(_job("b"), 2, 2, 1), FairRow(_job("z"), 2, 1, 3)]
    assert last_served(later_turn) == "b"
    assert last_served(_rows("x", None)) == ""  # the partition of jobs without a key
    assert last_served([]) is None
