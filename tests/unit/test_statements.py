"""Runtime SQL: composed per schema, states from JobState, the claim's variants from parts."""

from __future__ import annotations

import dataclasses
import re

from shigoto.db import runtime_statements as statements
from shigoto.job import FINISHED_STATES, JobState


def test_every_statement_composes_for_a_schema_that_needs_quoting() -> None:
    stmts = statements.statements('we"ird')
    for field in dataclasses.fields(stmts):
        text = getattr(stmts, field.name)
        assert "{" not in text.replace("{}", "") or field.name == "schema", field.name
    assert '"we""ird"."shigoto_jobs"' in stmts.claim
    assert '"we""ird"."shigoto_leaders"' in stmts.acquire_lease


def test_the_claim_variants_differ_only_in_their_parts() -> None:
    s = statements.statements("public")
    assert "ALL(%(exclude)s" not in s.claim and "%(room)s" not in s.claim
    assert "ALL(%(exclude)s" in s.claim_excluding and "%(room)s" not in s.claim_excluding
    assert "%(room)s" in s.claim_limited and "ALL(%(exclude)s" not in s.claim_limited
    both = s.claim_excluding_limited
    assert "ALL(%(exclude)s" in both and "least(%(limit)s, %(room)s)" in both
    strip = re.compile(r" AND worker <> ALL\(%\(exclude\)s::text\[\]\)|least\(|, %\(room\)s\)")
    assert strip.sub("", both).replace("LIMIT %(limit)s", "") == s.claim.replace(
        "LIMIT %(limit)s", ""
    )


def test_finished_states_come_from_job_state_in_its_order() -> None:
    s = statements.statements("public")
    listed = ", ".join(f"'{state}'" for state in JobState if state in FINISHED_STATES)
    assert f"IN ({listed})" in s.complete and f"IN ({listed})" in s.archive


def test_time_decisions_take_the_clock_and_ops_keep_the_database_clock() -> None:
    s = statements.statements("public")
    for name in ("stage", "rescue", "forget_nodes", "archive_at", "delete_archived_at",
                 "node_upsert", "prove", "acquire_lease"):  # fmt: skip
        assert "coalesce(%(now)s::timestamptz, now())" in getattr(s, name), name
    for name in ("archive", "delete_archived", "claim"):
        assert "%(now)s" not in getattr(s, name), name
