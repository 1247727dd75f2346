-- One row per durable step that ran to an end (package step): the step
-- named step of the message with idempotency_key in consumer_group. done:
-- result holds what the step returned (JSON); failed: it failed
-- permanently and error says why. A row is written on its own connection,
-- committed before the handler's transaction goes on, and read instead of
-- running the step again. Swept by recorded_at with the inbox's retention.
CREATE TABLE IF NOT EXISTS idem_steps (
    consumer_group  text        NOT NULL,
    idempotency_key text        NOT NULL,
    step            text        NOT NULL,
    status          text        NOT NULL CHECK (status IN ('done', 'failed')),
    result          jsonb,
    error           text        NOT NULL DEFAULT '',
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, idempotency_key, step)
);
CREATE INDEX IF NOT EXISTS idem_steps_recorded_at_idx ON idem_steps (recorded_at);
