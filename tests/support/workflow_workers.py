"""Workers for the workflow tests, imported by in-process runners and `shigoto run` processes.

Each step returns its name and what it saw of its parents (`{parent_id: parent's name}`), so a
test can check from the rows alone that every parent's result reached its child.
"""

from __future__ import annotations

from typing import Any

import shigoto


@shigoto.worker(name="tests.workflow.step")
def step(name: str, fail: bool = False) -> dict[str, Any]:
    if fail:
        raise shigoto.Discard(f"step {name} was asked to fail")
    seen = {
        str(parent): (result or {}).get("name") if isinstance(result, dict) else result
        for parent, result in shigoto.current_job().parent_results.items()
    }
    return {"name": name, "seen": seen}
