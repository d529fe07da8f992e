"""The cyclic garbage collector's view of a runner process's heap.

Everything a runner's start-up creates (the interpreter's own objects, Shigoto, the worker
modules and all they import) lives as long as the process, yet every full (generation 2)
collection walks all of it again. Those collections run on the loop thread, so each is a pause
for every job in flight: 13 to 34 ms each in the bench's processing phase, and more with a
large application imported. Freezing the start-up heap once (`gc.freeze`) leaves the collector
only the objects jobs create: those passes then took under 1 ms, and the collector's time per
run halved (docs/benchmarks.md, "Third sitting").

It is a process-wide act, so the process's owner decides: `shigoto run` and `shigoto bench`
freeze; a runner embedded in someone else's process does not unless asked (`Runner(...,
freeze_heap=True)`), since objects alive at that moment that later become cyclic garbage are
never reclaimed.

The same owner also spaces the young collections out: with the default threshold (a
generation-0 pass every 700 net allocations) a no-op job's objects (its Job, context,
coroutines, completion) set one off every few jobs, 640 passes for 20,000 jobs and 9 µs of the
runner's CPU per job; every 10,000 allocations, 5.5 µs (issue 26). The jobs' objects are short
lived either way, so the older generations' thresholds stay as they are.
"""

from __future__ import annotations

import gc

#: Net allocations between two generation-0 collections in a runner that owns its process.
YOUNG_THRESHOLD = 10_000


def freeze_startup_heap() -> int:
    """Collect the start-up's garbage first (so none of it is kept for good), then move every
    object still alive out of the collector's reach, and space the young collections out.
    Returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    young, older, oldest = gc.get_threshold()
    gc.set_threshold(max(YOUNG_THRESHOLD, young), older, oldest)
    return gc.get_freeze_count()


__all__ = ["freeze_startup_heap"]
