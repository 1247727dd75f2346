-- Deferred messages (handler.DeferUntil): one row per message to publish
-- again, inserted by schedule.Defer in the transaction that settles the
-- message's consumption, published by the group's schedule.Scheduler when
-- due_at comes (database clock) and deleted once Kafka acknowledged it.
-- deferred_until is the time the handler asked for (kept for operators);
-- due_at is the next time the scheduler tries it: deferred_until, then later
-- after a failed publish (attempts, last_error).
CREATE TABLE IF NOT EXISTS idem_deferred (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_group    text        NOT NULL CHECK (consumer_group <> ''),
    topic             text        NOT NULL CHECK (topic <> ''),
    partition         int         NOT NULL,
    key               bytea,
    value             bytea,
    header_keys       text[]      NOT NULL DEFAULT '{}',
    header_values     bytea[]     NOT NULL DEFAULT '{}',
    record_timestamp  timestamptz,
    idempotency_key   text        NOT NULL DEFAULT '',
    origin_topic      text        NOT NULL DEFAULT '',
    origin_partition  int         NOT NULL DEFAULT 0,
    origin_offset     bigint      NOT NULL DEFAULT 0,
    deferred_until    timestamptz NOT NULL,
    due_at            timestamptz NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    attempts          int         NOT NULL DEFAULT 0,
    last_error        text
);
-- The scheduler of a group reads its due rows in time order, and asks for
-- its next due time, through this index only.
CREATE INDEX IF NOT EXISTS idem_deferred_due_idx ON idem_deferred (consumer_group, due_at, id);
-- Wake the leaders at COMMIT (never for a rolled-back insert), so a row
-- due sooner than the time a leader sleeps until is not late. The channel
-- names the table by its oid: tables in other schemas do not wake each other.
CREATE OR REPLACE FUNCTION idem_deferred_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idem_deferred_' || TG_RELID::text, '');
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS idem_deferred_notify_trg ON idem_deferred;
CREATE TRIGGER idem_deferred_notify_trg AFTER INSERT ON idem_deferred FOR EACH STATEMENT EXECUTE FUNCTION idem_deferred_notify();
