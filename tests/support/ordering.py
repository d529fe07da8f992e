"""The order the suite runs in: the long tests first on every xdist worker, spread so the
workers finish together.

Under `--dist worksteal` (pyproject.toml) xdist hands worker k the k-th of as many contiguous
slices of the collected items as there are workers, and a worker that runs out takes the last
half of what another still has queued. So each slice here starts with its share of the long
tests, dealt out longest first to the slice with the least long work so far, and goes on with
the short tests in their usual order: the long ones start at once, and what is left to steal
at the end is short.

Which tests are long comes from `tests/durations.json` (a test's seconds, setup and teardown
included; only tests of `LONG` seconds or more), updated by a run with `--store-durations` for
the tests that ran and passed. A test missing from it counts as short: a stale file only makes
the order less good.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeVar

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"
#: Seconds from which a test counts as long.
LONG = 1.0

T = TypeVar("T")


def load(path: Path = DURATIONS) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text("utf-8")).items()}
    except FileNotFoundError:
        return {}


def store(seconds: Mapping[str, float], path: Path = DURATIONS) -> None:
    """Update the file with the tests of this run; tests that did not run keep their entry."""
    known = load(path)
    for name, spent in seconds.items():
        known.pop(name, None)
        if spent >= LONG:
            known[name] = round(spent, 1)
    path.write_text(json.dumps(dict(sorted(known.items())), indent=1) + "\n", "utf-8")


def slice_sizes(total: int, parts: int) -> list[int]:
    """How many items each of `parts` idle workers gets at the start, as xdist's worksteal
    scheduler divides them: each in turn takes an equal share of what is left."""
    sizes = []
    for k in range(parts):
        sizes.append(total // (parts - k))
        total -= sizes[-1]
    return sizes


def ordered(items: Sequence[T], key: Sequence[str], seconds: Mapping[str, float],
            parts: int) -> list[T]:  # fmt: skip
    """`items` (named by `key`, one name each) in slices for `parts` workers, each slice its
    long tests first (longest first), then its share of the rest in their order."""
    indexed = list(zip(items, key, strict=True))
    long = sorted((i for i, (_, name) in enumerate(indexed) if seconds.get(name, 0.0) >= LONG),
                  key=lambda i: (-seconds[indexed[i][1]], i))  # fmt: skip
    chosen = set(long)
    rest = [i for i in range(len(indexed)) if i not in chosen]
    loads = [0.0] * parts
    slices: list[list[int]] = [[] for _ in range(parts)]
    for i in long:
        k = min(range(parts), key=lambda p: (loads[p], p))
        slices[k].append(i)
        loads[k] += seconds[indexed[i][1]]
    order: list[int] = []
    start = 0
    for k, size in enumerate(slice_sizes(len(indexed), parts)):
        take = max(size - len(slices[k]), 0)
        order += slices[k] + rest[start : start + take]
        start += take
    order += rest[start:]
    return [indexed[i][0] for i in order]
