-- Shigoto 0016: circuit breakers held for the whole fleet. One row per breaker, keyed
-- 'worker:<name>' or 'worker:<name>:<partition>'. The state machine is pure
-- (shigoto.flow.circuit_breaker); runners lock the row to admit a probe or record an outcome.
-- Runs with search_path set to the configured schema; re-runnable.

CREATE TABLE IF NOT EXISTS shigoto_breakers (
    key           text        PRIMARY KEY,
    worker        text        NOT NULL,
    partition_key text,
    -- closed | open | half_open; a copy of state->>'status' that status views can read.
    status        text        NOT NULL DEFAULT 'closed',
    -- The machine's state: the window of calls, when it opened, the probes running.
    state         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- Until when no job of the worker can start (open, or every probe slot taken): each
    -- claim leaves the worker's jobs in place while it is in the future. NULL: not blocked.
    blocked_until timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT shigoto_breakers_status_check CHECK (status IN ('closed', 'open', 'half_open'))
);

-- The claim asks for the blocked breakers among a few keys: by primary key. Status views and
-- operators ask for the ones not closed.
CREATE INDEX IF NOT EXISTS shigoto_breakers_not_closed_idx
    ON shigoto_breakers (worker) WHERE status <> 'closed';
