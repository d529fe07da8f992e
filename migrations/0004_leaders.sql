-- Leadership as a lease row instead of a session advisory lock. Any role that can connect may
-- take an advisory lock, so a role with no grants could squat the leader lock and stop rescue,
-- pruning and cron for good. Writing this table needs INSERT/UPDATE on it, which only the
-- roles Shigoto runs as are granted. A lease also expires on its own: a leader whose session
-- dropped cannot keep confirming a lock its new session does not hold.
CREATE TABLE IF NOT EXISTS shigoto_leaders (
    name text PRIMARY KEY,
    leader_id text NOT NULL,
    elected_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
