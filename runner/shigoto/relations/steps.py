"""Where and in which order the relations act on a job: their steps, run inside PostgreSQL.

A relation's work at a job's insert and at its final transition is a plain SQL function, a
*step*, and each event has one trigger on `shigoto_jobs`, a dispatcher that calls its steps
in a fixed order (migration 0024). The dispatchers are the one place the steps run, whichever
path writes the row (an enqueue, the completer, `cancel_by`, the rescuer, a fan-out finish, a
workflow cascade), always in the transaction of that write:

=====================  =======================  ===========================================
event                  dispatcher (trigger)     steps, in order, each with its condition
=====================  =======================  ===========================================
INSERT, per row        `shigoto_jobs_admit`     1. batches, `shigoto_batch_join`: the job
                                                has a batch this transaction has not joined
                                                yet; it must be open, and is held open (a
                                                share lock) until commit.
                                                2. workflows, `shigoto_workflow_admit`: the
                                                job has parents; it waits, is cancelled at
                                                once, or runs.
UPDATE OF state, per   `shigoto_jobs_finalize`  1. batches, `shigoto_batch_count`: the job
row, into or out of                             has a batch; its counts move (back, on a
a final state                                   retry), and a sealed batch whose jobs all
                                                finished enqueues its callbacks.
                                                2. forwarding, `shigoto_forward_copy`: the
                                                job was discarded or cancelled, or completed
                                                in a queue noted as forwarding completed
                                                jobs (0029); a copy goes to the queue its
                                                queue forwards that state to.
                                                3. workflows, `shigoto_workflow_resolve`: the
                                                job has waiting children; they are
                                                cancelled or released.
=====================  =======================  ===========================================

Unique jobs have no step: the client calls `shigoto_unique_resolve` (migration 0008) in the
inserting transaction before the INSERT (`relations.unique`), and a final transition leaves
the key on its row for the next enqueue of the key to judge against its `states`.

Why this order. At a final transition, counting and forwarding act on the job itself, while
resolving moves its children into new states, and each child's own finalize runs nested
inside that step; resolving last makes a cascade depth first, a job's own steps done before
its descendants', so callback and copy ids follow the order of the transitions that caused
them. (A cascade's `workflow.cancel` event is the exception: it is sent for each row the
cancelling UPDATE returns, after that UPDATE ran the children's own steps.) Counting and
forwarding read nothing the other writes, and batches first is the order every schema before
0024 ran them in. At insert, joining comes first because admitting may cancel the new job at
once, which counts it in its batch: it is a member of an open batch before anything counts it.

Each trigger's WHEN clause is the union of its steps' conditions, so a job none of them
concerns (nearly every job: no batch, no waiting children, completed in a queue that does not
forward completed jobs) calls no function at all; the dispatcher tests each condition again
and calls only the steps that apply. Whether a queue forwards completed jobs is a lookup a
WHEN clause cannot make, so `NOTE_TRIGGER`, before the first UPDATE of `state` in a
transaction, notes those queues in a transaction-local setting that the WHEN clause reads.

Left outside the dispatchers, each the only one of its kind: the statement-level check of
encrypted queues after an INSERT (migration 0018), and batches' two DELETE triggers (0010: a
job deleted unfinished leaves its batch; a batch row goes with its last archived job).

`ADMIT` and `FINALIZE` name the steps in their order, for tests that hold the dispatchers to
this table.
"""

from __future__ import annotations

#: The statement trigger that notes, once per transaction, which queues forward completed
#: jobs (migration 0029), so the finalize trigger's WHEN clause lets a completion through only
#: in those queues: a plain completion still calls no function.
NOTE_TRIGGER = "shigoto_jobs_note_forwards"
#: The row trigger (and function) that runs the steps at insert.
ADMIT_TRIGGER = "shigoto_jobs_admit"
#: The row trigger (and function) that runs the steps at a transition into or out of a final
#: state.
FINALIZE_TRIGGER = "shigoto_jobs_finalize"

#: (relation, step function) at insert, in the order they run.
ADMIT: tuple[tuple[str, str], ...] = (
    ("batches", "shigoto_batch_join"),
    ("workflows", "shigoto_workflow_admit"),
)
#: (relation, step function) at a final transition, in the order they run.
FINALIZE: tuple[tuple[str, str], ...] = (
    ("batches", "shigoto_batch_count"),
    ("forwarding", "shigoto_forward_copy"),
    ("workflows", "shigoto_workflow_resolve"),
)
