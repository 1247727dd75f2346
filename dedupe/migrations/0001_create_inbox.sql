-- The inbox: one row per (consumer group, idempotency key) whose effects are recorded.
-- status is 'done' for a recorded outcome, 'in_progress' for a PostgresLease claim.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    consumer_group  text        NOT NULL,
    idempotency_key text        NOT NULL,
    topic           text,
    "partition"     int,
    "offset"        bigint,
    processed_at    timestamptz NOT NULL DEFAULT now(),
    status          text        NOT NULL DEFAULT 'done' CHECK (status IN ('done', 'in_progress')),
    lease_until     timestamptz,
    lease_owner     text,
    PRIMARY KEY (consumer_group, idempotency_key)
);
CREATE INDEX IF NOT EXISTS {{.ProcessedAtIndex}} ON {{.Table}} (processed_at);
