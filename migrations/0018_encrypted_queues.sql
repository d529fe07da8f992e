-- Shigoto 0018: encrypted queues (docs/encryption.md). `shigoto_queues.encrypted` makes every
-- job enqueued into the queue store its args sealed, whatever its worker says. Clients learn
-- it without a query per enqueue: the trigger below refuses plaintext args for such a queue
-- (exact, whatever a client believes), and a refused client remembers the queue and seals
-- its jobs from then on (shigoto.db.inserts retries an autocommit enqueue once).
-- Runs with search_path set to the configured schema; re-runnable: IF NOT EXISTS, CREATE OR
-- REPLACE, and the trigger dropped (if present) before it is created.

ALTER TABLE shigoto_queues ADD COLUMN IF NOT EXISTS encrypted boolean NOT NULL DEFAULT false;

-- One call per INSERT statement, not per row: a transition table holds the statement's rows,
-- and a schema without encrypted queues returns after one lookup in the (small) queue table,
-- so plain COPYs of thousands of rows pay one call. Rows already sealed (the marker key) pass.
-- So do the rows the database makes itself: a forwarded copy (copying args verbatim) and a
-- batch callback (args from shigoto_batches), inserted from a trigger (pg_trigger_depth() > 1)
-- or from the seal of a batch whose jobs all finished, and marked in their meta. It holds no
-- key to seal them, and refusing would fail the completion that made them, over and over.
-- SET search_path FROM CURRENT pins the schema the migration ran in.
CREATE OR REPLACE FUNCTION shigoto_jobs_refuse_plaintext() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    refused text;
BEGIN
    IF pg_trigger_depth() > 1 OR NOT EXISTS (SELECT 1 FROM shigoto_queues WHERE encrypted) THEN
        RETURN NULL;
    END IF;
    SELECT n.queue INTO refused
    FROM shigoto_inserted_rows n
    JOIN shigoto_queues q ON q.name = n.queue AND q.encrypted
    WHERE NOT (n.args ? '$shigoto_enc')
      AND NOT (n.meta ? 'forwarded_from') AND NOT (n.meta ? 'batch_callback')
    LIMIT 1;
    IF refused IS NOT NULL THEN
        -- The client maps this constraint name to EncryptedQueueError; DETAIL is the queue.
        RAISE EXCEPTION 'queue % is encrypted and refuses plaintext args', refused
            USING ERRCODE = 'check_violation', CONSTRAINT = 'shigoto_jobs_encrypted_queue',
                  DETAIL = refused,
                  HINT = 'enqueue from a process with SHIGOTO_ENCRYPTION_KEYS set';
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS shigoto_jobs_encrypted_queue ON shigoto_jobs;
CREATE TRIGGER shigoto_jobs_encrypted_queue
    AFTER INSERT ON shigoto_jobs
    REFERENCING NEW TABLE AS shigoto_inserted_rows
    FOR EACH STATEMENT EXECUTE FUNCTION shigoto_jobs_refuse_plaintext();
