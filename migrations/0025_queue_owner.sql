-- Shigoto 0025: which Queue resource owns a queue (issue 23), so two Queues naming one queue
-- on one database cannot both rewrite its settings and scale on its counts. The operator
-- writes `namespace/name/uid` of the owning Queue and clears it when that Queue is deleted;
-- a second Queue finds the queue owned and reports QueueNameConflict instead of acting.
-- NULL: no Queue owns it (set up with `shigoto.set_queue` or the CLI, or not at all).
--
-- Expand only: a nullable column without a default rewrites nothing and takes shigoto_queues'
-- lock for an instant; code of the previous release neither reads nor writes it.
ALTER TABLE shigoto_queues ADD COLUMN IF NOT EXISTS owner text;
