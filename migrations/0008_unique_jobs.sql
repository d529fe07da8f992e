-- Shigoto 0008: unique jobs (enqueue's `unique=` option).
-- Runs with search_path set to the configured schema; never qualify names here. The function
-- keeps that search_path (SET search_path FROM CURRENT): clients call it schema-qualified from
-- connections whose own search_path may name another schema.
--
-- A unique job stores its key in `unique_key` ('unique:' and a hash of the chosen fields), the
-- column cron's slot keys already use, so the unique index shigoto_jobs_unique_key_idx holds at
-- most one job per key: that job is the key's holder. Before inserting, the client calls
-- shigoto_unique_resolve in the inserting transaction. It takes a transaction advisory lock
-- per key, then compares each key's holder with the enqueue's options:
--   * the holder matches (its state is one of `states`, and it was inserted within `period`
--     seconds, or `period` is null): the enqueue is a conflict, the holder is returned (after
--     `replace` and `debounce` are applied to it if it has not started yet);
--   * it does not match: its key is released (set to NULL) so the new job can take it.
-- A key with no holder (never used, or its job pruned to the archive) returns nothing: the
-- client inserts the job, and the lock, held until commit, makes every other enqueue of the
-- key wait for that commit and then see the new holder.

-- `entries` is a JSON array with one object per distinct key, keys need not be sorted:
--   {"key": "unique:...", "states": ["available", ...], "period": seconds | null,
--    "replace": ["args", ...], "debounce": seconds | null,
--    "args": {...}, "queue": "...", "priority": n, "max_attempts": n | null,
--    "timeout": seconds | null, "tags": [...], "meta": {...},
--    "scheduled_at": timestamptz | null, "delay": seconds}
-- The values after "debounce" are the new enqueue's, read only for the fields in "replace".
-- Returns the matching holders (each after its update), as whole rows.
CREATE OR REPLACE FUNCTION shigoto_unique_resolve(entries jsonb) RETURNS SETOF shigoto_jobs
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
    k text;
    e jsonb;
    holder shigoto_jobs;
    changed shigoto_jobs;
    states text[];
    period float8;
    rep text[];
    debounce float8;
    at timestamptz;
BEGIN
    -- Every lock first, in one order for everybody: two bulk enqueues that share keys wait
    -- for each other instead of deadlocking.
    FOR k IN SELECT DISTINCT x->>'key' FROM jsonb_array_elements(entries) AS x ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(current_schema() || '.' || k, 0));
    END LOOP;

    -- This function is VOLATILE: under READ COMMITTED each statement below takes a new
    -- snapshot, so it sees what another enqueue of the same key committed while we waited.
    FOR e IN SELECT x FROM jsonb_array_elements(entries) AS x LOOP
        k := e->>'key';
        states := ARRAY(SELECT jsonb_array_elements_text(e->'states'));
        period := (e->>'period')::float8;
        rep := ARRAY(SELECT jsonb_array_elements_text(coalesce(e->'replace', '[]')));
        debounce := (e->>'debounce')::float8;
        -- A runner may move the holder between our read and our write; each write is guarded
        -- by the state we read, and a guard that fails makes us decide again.
        LOOP
            SELECT * INTO holder FROM shigoto_jobs WHERE unique_key = k;
            EXIT WHEN NOT FOUND;
            IF holder.state = ANY(states)
               AND (period IS NULL OR holder.inserted_at > now() - make_interval(secs => period))
            THEN
                -- replace and debounce only touch a job that has not started yet; a workflow
                -- child still waiting for its parents keeps its time.
                IF (cardinality(rep) > 0 OR debounce IS NOT NULL)
                   AND holder.state IN ('scheduled', 'available', 'retryable') THEN
                    at := holder.scheduled_at;
                    IF NOT (holder.state = 'scheduled' AND holder.depends_on IS NOT NULL) THEN
                        IF 'scheduled_at' = ANY(rep) THEN
                            at := coalesce((e->>'scheduled_at')::timestamptz,
                                           now() + make_interval(secs => (e->>'delay')::float8));
                        END IF;
                        IF debounce IS NOT NULL THEN
                            at := greatest(at, now() + make_interval(secs => debounce));
                        END IF;
                    END IF;
                    UPDATE shigoto_jobs AS j SET
                        args = CASE WHEN 'args' = ANY(rep) THEN e->'args' ELSE j.args END,
                        queue = CASE WHEN 'queue' = ANY(rep) THEN e->>'queue' ELSE j.queue END,
                        priority = CASE WHEN 'priority' = ANY(rep)
                                        THEN (e->>'priority')::integer ELSE j.priority END,
                        max_attempts = CASE WHEN 'max_attempts' = ANY(rep)
                                            THEN (e->>'max_attempts')::integer
                                            ELSE j.max_attempts END,
                        timeout = CASE WHEN 'timeout' = ANY(rep)
                                       THEN (e->>'timeout')::float8 ELSE j.timeout END,
                        tags = CASE WHEN 'tags' = ANY(rep)
                                    THEN ARRAY(SELECT jsonb_array_elements_text(e->'tags'))
                                    ELSE j.tags END,
                        meta = CASE WHEN 'meta' = ANY(rep) THEN e->'meta' ELSE j.meta END,
                        scheduled_at = at,
                        state = CASE WHEN j.state IN ('scheduled', 'available')
                                     THEN CASE WHEN at <= now() THEN 'available'
                                               ELSE 'scheduled' END
                                     ELSE j.state END
                    WHERE j.id = holder.id AND j.state = holder.state
                    RETURNING j.* INTO changed;
                    CONTINUE WHEN NOT FOUND;
                    -- Made available, or moved to another queue: wake that queue's runners
                    -- (delivered at commit, like every insert's).
                    IF changed.state = 'available'
                       AND (holder.state <> 'available' OR changed.queue <> holder.queue) THEN
                        PERFORM pg_notify('shigoto_insert', current_schema() || '.' || changed.queue);
                    END IF;
                    holder := changed;
                END IF;
                RETURN NEXT holder;
                EXIT;
            END IF;
            -- Not a match: the holder lets go of the key, the new job takes it.
            UPDATE shigoto_jobs SET unique_key = NULL
            WHERE id = holder.id AND state = holder.state AND unique_key = k;
            EXIT WHEN FOUND;
        END LOOP;
    END LOOP;
END
$$;
