-- Shigoto 0001: the jobs table, its archive and the runner nodes.
-- Runs with search_path set to the configured schema; never qualify names here.

CREATE TABLE shigoto_jobs (
    id            bigserial PRIMARY KEY,
    queue         text        NOT NULL DEFAULT 'default',
    worker        text        NOT NULL,
    args          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    state         text        NOT NULL DEFAULT 'available',
    priority      integer     NOT NULL DEFAULT 0,
    attempt       integer     NOT NULL DEFAULT 0,
    -- NULL means "the worker's own setting", resolved when the job runs: a service that
    -- enqueues by name need not know the worker's defaults.
    max_attempts  integer,
    timeout       double precision,
    scheduled_at  timestamptz NOT NULL DEFAULT now(),
    inserted_at   timestamptz NOT NULL DEFAULT now(),
    attempted_at  timestamptz,
    completed_at  timestamptz,
    -- Set on entering any final state (completed, discarded, cancelled): pruning ages jobs by
    -- when they finished, not when they were inserted.
    finished_at   timestamptz,
    attempted_by  text,
    errors        jsonb       NOT NULL DEFAULT '[]'::jsonb,
    result        jsonb,
    tags          text[]      NOT NULL DEFAULT '{}',
    meta          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    progress      integer,
    CONSTRAINT shigoto_jobs_state_check CHECK (state IN (
        'scheduled', 'available', 'executing', 'retryable', 'completed', 'discarded', 'cancelled')),
    CONSTRAINT shigoto_jobs_queue_check CHECK (char_length(queue) BETWEEN 1 AND 128),
    CONSTRAINT shigoto_jobs_worker_check CHECK (char_length(worker) BETWEEN 1 AND 255),
    CONSTRAINT shigoto_jobs_args_check CHECK (jsonb_typeof(args) = 'object'),
    CONSTRAINT shigoto_jobs_meta_check CHECK (jsonb_typeof(meta) = 'object'),
    CONSTRAINT shigoto_jobs_attempts_check CHECK (max_attempts IS NULL OR max_attempts >= 1),
    CONSTRAINT shigoto_jobs_timeout_check CHECK (timeout IS NULL OR timeout > 0),
    CONSTRAINT shigoto_jobs_progress_check CHECK (progress IS NULL OR progress BETWEEN 0 AND 100)
);

-- The claim reads only available rows in claim order; finished rows never enter this index,
-- so a table full of completed jobs does not slow the claim.
CREATE INDEX shigoto_jobs_claim_idx ON shigoto_jobs (queue, priority DESC, scheduled_at, id)
    WHERE state = 'available';

-- The stager looks for scheduled and retryable jobs whose time has come.
CREATE INDEX shigoto_jobs_stage_idx ON shigoto_jobs (scheduled_at)
    WHERE state IN ('scheduled', 'retryable');

-- Rescue and shutdown find the jobs a node is executing.
CREATE INDEX shigoto_jobs_executing_idx ON shigoto_jobs (attempted_by)
    WHERE state = 'executing';

-- The pruner moves finished jobs in order of their finishing time.
CREATE INDEX shigoto_jobs_finished_idx ON shigoto_jobs (finished_at)
    WHERE state IN ('completed', 'discarded', 'cancelled');

-- Operators filter jobs by tag (retry/cancel by tag, dashboards).
CREATE INDEX shigoto_jobs_tags_idx ON shigoto_jobs USING gin (tags);

-- Finished jobs older than the retention move here; same columns plus when they were archived.
CREATE TABLE shigoto_jobs_archive (
    LIKE shigoto_jobs INCLUDING DEFAULTS,
    archived_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id)
);
CREATE INDEX shigoto_jobs_archive_archived_idx ON shigoto_jobs_archive (archived_at);

-- One row per live runner process; heartbeats keep last_seen_at fresh.
CREATE TABLE shigoto_nodes (
    id            text        PRIMARY KEY,
    hostname      text        NOT NULL,
    pid           integer     NOT NULL,
    queues        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    started_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now()
);
