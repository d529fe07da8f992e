-- Shigoto 0010: batches (shigoto.batch). A batch counts its jobs by outcome and, once it is
-- sealed and every job has finished, enqueues its callback jobs exactly once.
-- Runs with search_path set to the configured schema; never qualify names here. The functions
-- keep that search_path (SET search_path FROM CURRENT): they run inside triggers fired by
-- connections whose own search_path may name another schema.
--
-- Exactness comes from the batch row: every change to a batch's counts is an UPDATE of that
-- row in the transaction that finished (or deleted) the job, so concurrent runners
-- queue on its row lock and the last of them sees the final counts. The callbacks are
-- enqueued by whichever transaction first finds the batch sealed and finished, guarded by
-- `finished_at IS NULL` under the same lock: once, whether the seal or the last job is last.

CREATE TABLE IF NOT EXISTS shigoto_batches (
    id           bigserial   PRIMARY KEY,
    -- The jobs to enqueue when the batch finishes: a list of {"when", "worker", "args",
    -- "queue", "priority", "max_attempts", "timeout", "tags"}, validated by the client.
    -- "when" is "finished" (callback), "completed" (on_complete: every job completed) or
    -- "discarded" (on_discard: at least one job discarded).
    callbacks    jsonb       NOT NULL DEFAULT '[]'::jsonb,
    -- Jobs in the batch, counted by the seal (less those deleted unfinished afterwards), and
    -- how many of them are in each final state now: a retried job leaves its count again.
    total        integer     NOT NULL DEFAULT 0,
    completed    integer     NOT NULL DEFAULT 0,
    discarded    integer     NOT NULL DEFAULT 0,
    cancelled    integer     NOT NULL DEFAULT 0,
    inserted_at  timestamptz NOT NULL DEFAULT now(),
    -- Set when the `with` block that filled the batch exits without error: no job may join
    -- after, and only a sealed batch can finish.
    sealed_at    timestamptz,
    -- Set, once, by the transaction that enqueued the callbacks; their ids in callback_ids.
    finished_at  timestamptz,
    callback_ids bigint[],
    CONSTRAINT shigoto_batches_callbacks_check CHECK (jsonb_typeof(callbacks) = 'array'),
    CONSTRAINT shigoto_batches_counts_check CHECK (
        total >= 0 AND completed >= 0 AND discarded >= 0 AND cancelled >= 0)
);

-- Pruning asks whether a batch still has jobs, in either table; plain jobs (batch_id NULL)
-- never enter these indexes.
-- @step
CREATE INDEX CONCURRENTLY IF NOT EXISTS shigoto_jobs_batch_idx ON shigoto_jobs (batch_id)
    WHERE batch_id IS NOT NULL;
-- @step
CREATE INDEX CONCURRENTLY IF NOT EXISTS shigoto_jobs_archive_batch_idx ON shigoto_jobs_archive (batch_id)
    WHERE batch_id IS NOT NULL;
-- @step

-- Enqueue the callbacks of batch `b` (a row already locked by the caller's UPDATE) if it is
-- sealed, every job of it has finished and nobody enqueued them yet. Returns whether it did.
CREATE OR REPLACE FUNCTION shigoto_batch_finish(b shigoto_batches) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    cb jsonb;
    counts jsonb;
    new_id bigint;
    ids bigint[] := '{}';
BEGIN
    IF b.sealed_at IS NULL OR b.finished_at IS NOT NULL
       OR b.completed + b.discarded + b.cancelled < b.total THEN
        RETURN false;
    END IF;
    -- The guard again, on the row itself: exactly one transaction gets past it.
    UPDATE shigoto_batches SET finished_at = now() WHERE id = b.id AND finished_at IS NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    counts := jsonb_build_object('id', b.id, 'total', b.total, 'completed', b.completed,
                                 'discarded', b.discarded, 'cancelled', b.cancelled);
    FOR cb IN SELECT value FROM jsonb_array_elements(b.callbacks) LOOP
        CONTINUE WHEN cb->>'when' = 'completed' AND b.completed <> b.total;
        CONTINUE WHEN cb->>'when' = 'discarded' AND b.discarded = 0;
        INSERT INTO shigoto_jobs (queue, worker, args, state, priority, max_attempts, timeout,
                                  scheduled_at, tags, meta)
        VALUES (cb->>'queue', cb->>'worker',
                coalesce(cb->'args', '{}'::jsonb) || jsonb_build_object('batch', counts),
                'available', coalesce((cb->>'priority')::integer, 0),
                (cb->>'max_attempts')::integer, (cb->>'timeout')::double precision, now(),
                ARRAY(SELECT jsonb_array_elements_text(coalesce(cb->'tags', '[]'::jsonb))),
                jsonb_build_object('batch_callback',
                                   jsonb_build_object('batch_id', b.id, 'when', cb->>'when')))
        RETURNING id INTO new_id;
        ids := ids || new_id;
        -- Woken like any other insert; delivered at commit.
        PERFORM pg_notify('shigoto_insert', current_schema() || '.' || (cb->>'queue'));
    END LOOP;
    UPDATE shigoto_batches SET callback_ids = ids WHERE id = b.id;
    RETURN true;
END
$$;

-- Seal batch `batch`: no job may join it afterwards, and its total is fixed. If every job
-- already finished, the callbacks are enqueued now, by the seal. Returns the row (NULL for an
-- unknown id).
CREATE OR REPLACE FUNCTION shigoto_batch_seal(batch bigint) RETURNS shigoto_batches
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    b shigoto_batches;
BEGIN
    -- FOR UPDATE waits for every transaction still inserting jobs into the batch (they hold
    -- FOR KEY SHARE on its row, see shigoto_batch_joins); the count below, a new statement,
    -- sees all of them. Jobs already moved to the archive count too.
    PERFORM 1 FROM shigoto_batches WHERE id = batch FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('shigoto.joined_batch', '', true);
    UPDATE shigoto_batches
    SET sealed_at = now(),
        total = (SELECT count(*) FROM shigoto_jobs WHERE batch_id = batch)
              + (SELECT count(*) FROM shigoto_jobs_archive WHERE batch_id = batch)
    WHERE id = batch AND sealed_at IS NULL
    RETURNING * INTO b;
    IF FOUND THEN
        PERFORM shigoto_batch_finish(b);
    END IF;
    SELECT * INTO b FROM shigoto_batches WHERE id = batch;
    RETURN b;
END
$$;

-- A job joined its batch, which must exist and be unsealed. FOR KEY SHARE holds off the seal
-- (FOR UPDATE) until this transaction ends, yet lets the counting UPDATEs of other jobs pass.
-- Once held, the lock cannot go stale before the transaction ends, so the check is remembered
-- in a transaction-local setting and the next jobs of the same batch (a COPY of thousands)
-- skip the query; the seal forgets it, for a caller that seals in the same transaction.
-- Nothing is written here: the total is counted once, by the seal.
CREATE OR REPLACE FUNCTION shigoto_batch_joins() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    mine text := current_schema() || '.' || NEW.batch_id;
BEGIN
    IF current_setting('shigoto.joined_batch', true) = mine THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM shigoto_batches WHERE id = NEW.batch_id AND sealed_at IS NULL
    FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % cannot join batch %: it is sealed or does not exist',
                        NEW.id, NEW.batch_id
            USING ERRCODE = 'foreign_key_violation',
                  HINT = 'enqueue into a batch only inside its with block';
    END IF;
    PERFORM set_config('shigoto.joined_batch', mine, true);
    RETURN NULL;
END
$$;

-- A job of a batch enters or leaves a final state (completed, discarded, cancelled; leaving
-- is a retry): its counts move in this same transaction, and the batch may finish.
CREATE OR REPLACE FUNCTION shigoto_batch_counted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    b shigoto_batches;
BEGIN
    UPDATE shigoto_batches
    SET completed = completed + (NEW.state = 'completed')::integer
                              - (OLD.state = 'completed')::integer,
        discarded = discarded + (NEW.state = 'discarded')::integer
                              - (OLD.state = 'discarded')::integer,
        cancelled = cancelled + (NEW.state = 'cancelled')::integer
                              - (OLD.state = 'cancelled')::integer
    WHERE id = NEW.batch_id
    RETURNING * INTO b;
    IF FOUND THEN
        PERFORM shigoto_batch_finish(b);
    END IF;
    RETURN NULL;
END
$$;

-- A job of a batch deleted before it finished will never finish: it leaves the batch, which
-- may finish without it. Before the seal there is nothing to do (the seal counts the jobs
-- that are there); finished jobs that move to the archive stay counted.
CREATE OR REPLACE FUNCTION shigoto_batch_left() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    b shigoto_batches;
BEGIN
    UPDATE shigoto_batches SET total = total - 1
    WHERE id = OLD.batch_id AND sealed_at IS NOT NULL
    RETURNING * INTO b;
    IF FOUND THEN
        PERFORM shigoto_batch_finish(b);
    END IF;
    RETURN NULL;
END
$$;

-- The archive story: a batch row goes when the last of its jobs is deleted from the archive
-- (the pruner's second step, after the archive retention), so batches live exactly as long as
-- their jobs' history. A batch that never had a job (an empty one, or one whose block raised
-- before its first enqueue) goes once it is older than the archived rows being deleted.
-- A statement trigger: it runs once per pruning statement, never on the hot path.
CREATE OR REPLACE FUNCTION shigoto_batch_pruned() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM shigoto_batches AS b
    WHERE (b.id IN (SELECT DISTINCT batch_id FROM gone WHERE batch_id IS NOT NULL)
           OR (b.total = 0 AND b.inserted_at < (SELECT max(archived_at) FROM gone)))
      AND NOT EXISTS (SELECT 1 FROM shigoto_jobs AS j WHERE j.batch_id = b.id)
      AND NOT EXISTS (SELECT 1 FROM shigoto_jobs_archive AS a WHERE a.batch_id = b.id);
    RETURN NULL;
END
$$;

-- The WHEN clauses keep plain jobs (batch_id NULL) from ever calling a function.
-- AFTER, not BEFORE: a BEFORE row trigger on a table turns every COPY into it, plain ones
-- included, into row-by-row inserts (PostgreSQL cannot batch them), while an AFTER trigger's
-- WHEN clause is checked as each row is written and queues nothing for plain jobs.
DROP TRIGGER IF EXISTS shigoto_batch_joins ON shigoto_jobs;
CREATE TRIGGER shigoto_batch_joins AFTER INSERT ON shigoto_jobs
    FOR EACH ROW WHEN (NEW.batch_id IS NOT NULL)
    EXECUTE FUNCTION shigoto_batch_joins();

DROP TRIGGER IF EXISTS shigoto_batch_counted ON shigoto_jobs;
CREATE TRIGGER shigoto_batch_counted AFTER UPDATE OF state ON shigoto_jobs
    FOR EACH ROW WHEN (NEW.batch_id IS NOT NULL AND OLD.state IS DISTINCT FROM NEW.state
                       AND (NEW.state IN ('completed', 'discarded', 'cancelled')
                            OR OLD.state IN ('completed', 'discarded', 'cancelled')))
    EXECUTE FUNCTION shigoto_batch_counted();

DROP TRIGGER IF EXISTS shigoto_batch_left ON shigoto_jobs;
CREATE TRIGGER shigoto_batch_left AFTER DELETE ON shigoto_jobs
    FOR EACH ROW WHEN (OLD.batch_id IS NOT NULL
                       AND OLD.state NOT IN ('completed', 'discarded', 'cancelled'))
    EXECUTE FUNCTION shigoto_batch_left();

DROP TRIGGER IF EXISTS shigoto_batch_pruned ON shigoto_jobs_archive;
CREATE TRIGGER shigoto_batch_pruned AFTER DELETE ON shigoto_jobs_archive
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION shigoto_batch_pruned();
