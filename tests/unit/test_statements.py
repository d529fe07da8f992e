"""Runtime SQL: composed per schema, states from JobState, one claim shaped by its parts."""

from __future__ import annotations

import dataclasses

from shigoto.db import fair_statements
from shigoto.db import runtime_statements as statements
from shigoto.job import FINISHED_STATES, JobState


def test_every_statement_composes_for_a_schema_that_needs_quoting() -> None:
    stmts = statements.statements('we"ird')
    for field in dataclasses.fields(stmts):
        text = getattr(stmts, field.name)
        assert "{" not in text.replace("{}", "") or field.name == "schema", field.name
    assert '"we""ird"."shigoto_jobs"' in stmts.claim
    assert '"we""ird"."shigoto_leaders"' in stmts.acquire_lease


def test_one_claim_whose_only_differences_are_the_pick_and_the_conditions() -> None:
    """Every claim is the same UPDATE: plugins' conditions land in the pick's `{filters}` slot
    and nowhere else, and a shape changes only the pick and the columns returned after the
    job's."""
    plain = statements.claim("public")
    assert plain == statements.statements("public").claim
    filtered = statements.claim("public", filters=("j.priority >= 3", "j.worker <> 'x'"))
    added = "\n      AND (j.priority >= 3)\n      AND (j.worker <> 'x')"
    assert filtered.replace(added, "") == plain
    fair = statements.claim("public", fair_statements.PICK, (), fair_statements.RETURNING_EXTRA)
    update = plain[plain.index("\nUPDATE"):]
    assert fair.endswith(update.rstrip("\n") + fair_statements.RETURNING_EXTRA + "\n")
    assert statements.claim("public", filters=("j.priority >= 3",)) is statements.claim(
        "public", filters=("j.priority >= 3",))  # composed once, prepared once


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
