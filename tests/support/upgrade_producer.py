"""A service enqueueing at a steady pace, timing every enqueue: `python -m
tests.support.upgrade_producer URL COUNT INTERVAL OUT`. Run with the previous release's code
on PYTHONPATH, it is a service that has not been upgraded yet; OUT gets {"ids", "waits"}."""

from __future__ import annotations

import json
import sys
import time

import psycopg

import shigoto


def main(url: str, count: int, interval: float, out: str) -> None:
    ids, waits = [], []
    with psycopg.connect(url, autocommit=True) as conn:
        for n in range(count):
            started = time.monotonic()
            job = shigoto.enqueue("tests.support.upgrade_workers.step", {"n": n}, conn=conn)
            waits.append(time.monotonic() - started)
            ids.append(job.id)
            time.sleep(interval)
    with open(out, "w", encoding="utf-8") as fh:
        json.dump({"ids": ids, "waits": waits}, fh)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
