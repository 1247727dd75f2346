-- The transactional outbox: one row per event, inserted by outbox.Enqueue in
-- the transaction of the write it describes, published by outbox.Relay.
-- state: 'pending' until Kafka acknowledged it; 'published' (kept only when
-- Relay.KeepPublished > 0, then swept); 'failed' after Relay.MaxAttempts
-- publishes refused for bad input (unknown topic, too large, not authorised).
CREATE TABLE IF NOT EXISTS {{.Table}} (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id      uuid        NOT NULL DEFAULT gen_random_uuid(),
    topic         text        NOT NULL CHECK (topic <> ''),
    key           bytea,
    value         bytea,
    header_keys   text[]      NOT NULL DEFAULT '{}',
    header_values bytea[]     NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    state         text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'published', 'failed')),
    attempts      int         NOT NULL DEFAULT 0,
    last_error    text,
    retry_at      timestamptz,
    published_at  timestamptz
);
CREATE INDEX IF NOT EXISTS {{.PendingIndex}} ON {{.Table}} (id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS {{.RetryIndex}} ON {{.Table}} (retry_at) WHERE state = 'pending' AND retry_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS {{.PublishedIndex}} ON {{.Table}} (published_at) WHERE state = 'published';
-- Wake the relay at COMMIT: NOTIFY is delivered only when the inserting
-- transaction commits, never for a rolled-back one. The channel names the
-- table by its oid, so outboxes in other schemas do not wake each other.
CREATE OR REPLACE FUNCTION {{.NotifyFunc}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idem_outbox_' || TG_RELID::text, '');
    RETURN NULL;
END
$$;
CREATE TRIGGER {{.Trigger}} AFTER INSERT ON {{.Table}} FOR EACH STATEMENT EXECUTE FUNCTION {{.NotifyFunc}}();
