"""Reading executed plans (EXPLAIN (ANALYZE, FORMAT JSON)) by their row counts, never their
timings, so a test can say what a statement touched without timing it."""

from __future__ import annotations

from typing import Any


def rows_read_from(plan: dict[str, Any], relation: str = "shigoto_jobs") -> int:
    """Rows the executed plan took from `relation`: returned by its scans plus those their
    filters removed, over every loop. The rows an UPDATE writes are not counted again."""
    read = 0
    if plan.get("Relation Name") == relation and plan["Node Type"] != "ModifyTable":
        loops = plan.get("Actual Loops", 1)
        read += (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * loops
    for child in plan.get("Plans", []):
        read += rows_read_from(child, relation)
    return read


def rows_compared_in_joins(plan: dict[str, Any]) -> int:
    """Row pairs the plan's joins tried and threw away (their join filters' removed rows)."""
    thrown = plan.get("Rows Removed by Join Filter", 0) * plan.get("Actual Loops", 1)
    return thrown + sum(rows_compared_in_joins(child) for child in plan.get("Plans", []))


def indexes_used(plan: dict[str, Any]) -> set[str]:
    """The indexes the plan reads, at any depth."""
    found = {plan["Index Name"]} if "Index Name" in plan else set()
    return found.union(*(indexes_used(child) for child in plan.get("Plans", [])))
