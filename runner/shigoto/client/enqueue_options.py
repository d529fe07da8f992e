"""The typed shortcut `worker.options(...).enqueue(**args)`: a worker with its enqueue options
fixed, so the call that follows takes only the job's args.

It binds both twins (`enqueue` and `aenqueue`), so it sits above `enqueuing_sync` and
`enqueuing_async` rather than in either: a generated module cannot hold a class whose sync and
async methods are both public.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shigoto.client.enqueue_plan import check_option_names
from shigoto.client.enqueuing_async import aenqueue
from shigoto.client.enqueuing_sync import enqueue
from shigoto.job import Job


class EnqueueOptions:
    """A worker with its enqueue options fixed, so `.enqueue(**kwargs)` takes only job args.

    Options and args never share a namespace: a worker may have an argument called `priority`
    and still be enqueued with a priority.
    """

    __slots__ = ("_options", "worker")

    def __init__(self, worker: Any, options: Mapping[str, Any]) -> None:
        check_option_names(options)
        self.worker = worker
        self._options = dict(options)

    def options(self, **more: Any) -> EnqueueOptions:
        """These options plus `more` (which win)."""
        return EnqueueOptions(self.worker, {**self._options, **more})

    def enqueue(self, **args: Any) -> Job:
        return enqueue(self.worker, args, **self._options)

    async def aenqueue(self, **args: Any) -> Job:
        return await aenqueue(self.worker, args, **self._options)

    def __repr__(self) -> str:
        return f"<{self.worker!r} with {self._options!r}>"
