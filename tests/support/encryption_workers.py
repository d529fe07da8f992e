"""Workers of the encryption tests (tests/integration/test_encryption_*.py): each records what
its perform saw, so a test can tell plaintext from an envelope and a run from no run."""

from __future__ import annotations

from typing import Any

import shigoto

#: What performs and callbacks saw, in order: (what, value). Tests clear it.
SEEN: list[tuple[str, Any]] = []

#: A secret the tests look for everywhere the job could leak it.
SECRET = "4111-1111-1111-1111-zebra"


def _fast(attempt: int, error: BaseException) -> float:
    return 0.2


def _discarded(args: dict[str, Any], errors: list[dict[str, Any]]) -> None:
    SEEN.append(("on_discard", {"args": args, "errors": errors}))


@shigoto.worker(encrypted=True, backoff=_fast)
def charge(card: str, amount: int = 1) -> dict[str, Any]:
    """Records its args as the perform and `current_job()` see them."""
    SEEN.append(("charge", {"card": card, "amount": amount,
                            "current": dict(shigoto.current_job().args)}))  # fmt: skip
    return {"charged": amount}


@shigoto.worker(encrypted=True, max_attempts=2, backoff=_fast, on_discard=_discarded)
def leaky(card: str) -> None:
    """Fails with its args in the message and traceback: the classic leak."""
    raise ValueError(f"card {card} was declined")


@shigoto.worker(encrypted=True, encrypted_result=True)
def echo(card: str) -> dict[str, Any]:
    """Returns its args: the result must be stored sealed."""
    return {"card": card}


@shigoto.worker(encrypted=True, encrypted_result=True, isolation="process")
def isolated(card: str) -> dict[str, Any]:
    """In a child process: gets plaintext through the pipe, returns it as its (sealed) result."""
    return {"card": card, "seen": dict(shigoto.current_job().args)}


@shigoto.worker(encrypted=True, max_attempts=1)
def forwarded(card: str) -> dict[str, Any]:
    """Fails in its first queue; the dead-letter copy records and completes."""
    queue = shigoto.current_job().queue
    if queue == "enc-main":
        raise RuntimeError("declined")
    SEEN.append(("forwarded", {"card": card, "queue": queue}))
    return {"queue": queue}


@shigoto.worker(encrypted=True)
def child(name: str) -> None:
    """Records the parents' results it was given."""
    SEEN.append(("child", dict(shigoto.current_job().parent_results)))


@shigoto.worker
def plain(card: str) -> None:
    """Not encrypted itself: sealed only when its queue is."""
    SEEN.append(("plain", {"card": card}))


@shigoto.worker(encrypted=True)
def slow(card: str, seconds: float = 0.05) -> dict[str, Any]:
    """Takes a little time, so a rotation overlaps jobs in flight."""
    import time

    time.sleep(seconds)
    return {"ok": True}


@shigoto.worker(queue="bench")
async def bench_plain(n: int, card: str) -> None:
    """The benchmark's plain job (tests/support/encryption_bench.py): nothing but the job."""


@shigoto.worker(queue="bench", encrypted=True)
async def bench_sealed(n: int, card: str) -> None:
    """The benchmark's encrypted job: the same, sealed."""


@shigoto.worker(max_attempts=1)
def plain_fails(card: str) -> None:
    """Not encrypted; fails once, to be forwarded."""
    raise RuntimeError("declined")


@shigoto.worker
def batch_done(card: str, batch: dict[str, Any]) -> None:
    """A plain batch callback."""
    SEEN.append(("batch_done", {"card": card, "total": batch["total"]}))


@shigoto.worker(encrypted=True)
def gated(card: str, gate: str) -> dict[str, Any]:
    """Holds its job executing until the file `gate` exists (at most a minute), so a test
    controls which jobs are in flight while it rotates keys."""
    import os
    import time

    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)
    return {"ok": True}
