-- Payload encryption at rest (internal/seal): a record's value and headers,
-- and an edited version's value, may be sealed under a data key of
-- idem_seal_keys. key_id names that key; NULL means stored in clear (every
-- row written before encryption was turned on).
ALTER TABLE idem_dlq_records ADD COLUMN IF NOT EXISTS key_id bigint;
ALTER TABLE idem_dlq_versions ADD COLUMN IF NOT EXISTS key_id bigint;
-- The rows of one data key: what `idem keys list` counts and a destroyed
-- key leaves unreadable.
CREATE INDEX IF NOT EXISTS idem_dlq_records_key ON idem_dlq_records (key_id) WHERE key_id IS NOT NULL;

-- Masking: a failure group's sample error is the error of one record, and
-- the console masks in it the values masked in that record's payload, so the
-- group row names that record.
ALTER TABLE idem_dlq_groups ADD COLUMN IF NOT EXISTS sample_id bigint;

CREATE OR REPLACE FUNCTION idem_dlq_groups_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
        INSERT INTO idem_dlq_groups AS g (consumer_group, dlq_topic, fingerprint, kind,
            unresolved, replayed, resolved, archived, first_seen, last_seen, sample_error, sample_id)
        SELECT n.consumer_group, n.dlq_topic, n.fingerprint, n.kind,
            count(*) FILTER (WHERE n.status = 'unresolved'), count(*) FILTER (WHERE n.status = 'replayed'),
            count(*) FILTER (WHERE n.status = 'resolved'), count(*) FILTER (WHERE n.status = 'archived'),
            min(n.last_failure_at), max(n.last_failure_at),
            (array_agg(n.error ORDER BY n.last_failure_at DESC, n.id DESC))[1],
            (array_agg(n.id ORDER BY n.last_failure_at DESC, n.id DESC))[1]
        FROM new_rows n
        GROUP BY 1, 2, 3, 4
        ORDER BY 1, 2, 3, 4
        ON CONFLICT (consumer_group, dlq_topic, fingerprint, kind) DO UPDATE SET
            unresolved = g.unresolved + excluded.unresolved, replayed = g.replayed + excluded.replayed,
            resolved = g.resolved + excluded.resolved, archived = g.archived + excluded.archived,
            first_seen = least(g.first_seen, excluded.first_seen),
            last_seen = greatest(g.last_seen, excluded.last_seen),
            sample_error = CASE WHEN excluded.last_seen >= g.last_seen THEN excluded.sample_error ELSE g.sample_error END,
            sample_id = CASE WHEN excluded.last_seen >= g.last_seen THEN excluded.sample_id ELSE g.sample_id END;
    RETURN NULL;
END
$$;
