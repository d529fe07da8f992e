"""A worker module whose import fails: the runner must report the real error."""

from __future__ import annotations

import shigoto_no_such_dependency  # noqa: F401 - the point of this module

import shigoto


@shigoto.worker
def never() -> None:
    """Never registered: the import above fails first."""
