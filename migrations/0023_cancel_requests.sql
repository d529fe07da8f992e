-- Shigoto 0023: cancelling a running job is a request (issue 21).
-- Runs with search_path set to the configured schema; re-runnable: IF NOT EXISTS only.
--
-- A job whose perform is still running cannot be `cancelled` yet: its attempt would no longer
-- hold the job, so a retry could start a second attempt beside it, and the triggers that react
-- to a finished job (batches, forwarding, workflow children, unique keys) would act while the
-- work goes on. `cancel_by` records the request here instead; the job stays `executing` until
-- its runner has stopped the perform and writes `cancelled` itself. The columns stay on the
-- finished row as its history, and a retry clears them.
--
-- Adding nullable columns without a default rewrites nothing: the ALTER takes its lock for a
-- moment, whatever the table's size.
ALTER TABLE shigoto_jobs ADD COLUMN IF NOT EXISTS cancel_requested_at timestamptz;
ALTER TABLE shigoto_jobs ADD COLUMN IF NOT EXISTS cancel_reason text;
ALTER TABLE shigoto_jobs_archive ADD COLUMN IF NOT EXISTS cancel_requested_at timestamptz;
ALTER TABLE shigoto_jobs_archive ADD COLUMN IF NOT EXISTS cancel_reason text;
