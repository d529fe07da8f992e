"""What a service calls: enqueue (one and many, sync and async twins) and the per-queue
settings (pause, resume, limits). It writes jobs; it never runs them."""

from shigoto.client.enqueuing import (
    EnqueueOptions,
    aenqueue,
    aenqueue_many,
    enqueue,
    enqueue_many,
)
from shigoto.client.queue_settings import (
    apause_queue,
    aresume_queue,
    aset_queue,
    pause_queue,
    resume_queue,
    set_queue,
)

__all__ = [
    "EnqueueOptions",
    "aenqueue",
    "aenqueue_many",
    "apause_queue",
    "aresume_queue",
    "aset_queue",
    "enqueue",
    "enqueue_many",
    "pause_queue",
    "resume_queue",
    "set_queue",
]
