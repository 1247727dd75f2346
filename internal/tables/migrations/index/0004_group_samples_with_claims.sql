-- 0002 (masking) made the per-group counts name their sample record
-- (sample_id); 0003 (claims) taught them the 'replaying' status by
-- redefining the same insert trigger function, without sample_id. Each was
-- written without the other, so whichever ran last won. This definition
-- keeps both; it runs after 0002 and 0003 whatever order those two ran in.
-- (0003's update trigger leaves sample_id as it is, as 0002's did.) Groups
-- counted in between keep sample_id NULL ("not known", as before 0002) until
-- a newer failure replaces their sample.
CREATE OR REPLACE FUNCTION idem_dlq_groups_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
        INSERT INTO idem_dlq_groups AS g (consumer_group, dlq_topic, fingerprint, kind,
            unresolved, replaying, replayed, resolved, archived, first_seen, last_seen, sample_error, sample_id)
        SELECT n.consumer_group, n.dlq_topic, n.fingerprint, n.kind,
            count(*) FILTER (WHERE n.status = 'unresolved'), count(*) FILTER (WHERE n.status = 'replaying'),
            count(*) FILTER (WHERE n.status = 'replayed'),
            count(*) FILTER (WHERE n.status = 'resolved'), count(*) FILTER (WHERE n.status = 'archived'),
            min(n.last_failure_at), max(n.last_failure_at),
            (array_agg(n.error ORDER BY n.last_failure_at DESC, n.id DESC))[1],
            (array_agg(n.id ORDER BY n.last_failure_at DESC, n.id DESC))[1]
        FROM new_rows n
        GROUP BY 1, 2, 3, 4
        ORDER BY 1, 2, 3, 4
        ON CONFLICT (consumer_group, dlq_topic, fingerprint, kind) DO UPDATE SET
            unresolved = g.unresolved + excluded.unresolved, replaying = g.replaying + excluded.replaying,
            replayed = g.replayed + excluded.replayed,
            resolved = g.resolved + excluded.resolved, archived = g.archived + excluded.archived,
            first_seen = least(g.first_seen, excluded.first_seen),
            last_seen = greatest(g.last_seen, excluded.last_seen),
            sample_error = CASE WHEN excluded.last_seen >= g.last_seen THEN excluded.sample_error ELSE g.sample_error END,
            sample_id = CASE WHEN excluded.last_seen >= g.last_seen THEN excluded.sample_id ELSE g.sample_id END;
    RETURN NULL;
END
$$;

