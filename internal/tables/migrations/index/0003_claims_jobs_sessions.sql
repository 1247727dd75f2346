-- Actions that happen once (issue 29). A replay or an edit-and-retry claims
-- its records in the statement that selects them: status 'replaying', under
-- a job (idem_dlq_jobs) that publishes them one by one and marks each
-- 'replayed'. A record whose publish was started records where it went
-- (publish_topic, publish_partition) and that partition's end offset before
-- the send (publish_from), so a job resumed after a crash looks there for
-- the record before publishing it again.
ALTER TABLE idem_dlq_records DROP CONSTRAINT IF EXISTS idem_dlq_records_status_check;
ALTER TABLE idem_dlq_records ADD CONSTRAINT idem_dlq_records_status_check
    CHECK (status IN ('unresolved', 'replaying', 'replayed', 'resolved', 'archived'));
ALTER TABLE idem_dlq_records
    ADD COLUMN IF NOT EXISTS job_id bigint,
    ADD COLUMN IF NOT EXISTS publish_topic text,
    ADD COLUMN IF NOT EXISTS publish_partition int,
    ADD COLUMN IF NOT EXISTS publish_from bigint;
CREATE INDEX IF NOT EXISTS idem_dlq_records_claimed ON idem_dlq_records (job_id, id) WHERE status = 'replaying';
-- Per DLQ partition, the first record not dealt with: the offset the admin
-- group ("<dlq>.admin") may move up to, so idem_dlq_depth follows the index.
CREATE INDEX IF NOT EXISTS idem_dlq_records_open_at ON idem_dlq_records (dlq_topic, dlq_partition, dlq_offset)
    WHERE status IN ('unresolved', 'replaying');

-- An edit's value is stored before it is published (published_* NULL until
-- then), so a job resumed after a crash publishes the same value.
ALTER TABLE idem_dlq_versions
    ALTER COLUMN published_to DROP NOT NULL,
    ALTER COLUMN published_partition DROP NOT NULL,
    ALTER COLUMN published_offset DROP NOT NULL;

-- Jobs: replays and edits that publish. A job runs in the process that
-- holds it (owner, heartbeat_at); one whose holder stopped (owner NULL) or
-- died (heartbeat too old) is taken over and resumed by another console.
CREATE TABLE IF NOT EXISTS idem_dlq_jobs (
    id               bigserial   PRIMARY KEY,
    action           text        NOT NULL CHECK (action IN ('replay', 'edit-retry')),
    actor            text        NOT NULL,
    reason           text        NOT NULL DEFAULT '',
    detail           text        NOT NULL DEFAULT '',
    to_topic         text        NOT NULL DEFAULT '',
    rate             int         NOT NULL DEFAULT 0,
    record_ids       bigint[]    NOT NULL DEFAULT '{}',
    state            text        NOT NULL DEFAULT 'running'
                     CHECK (state IN ('running', 'done', 'cancelled', 'failed')),
    matched          int         NOT NULL DEFAULT 0,
    claimed          int         NOT NULL DEFAULT 0,
    done             int         NOT NULL DEFAULT 0,
    skipped          int         NOT NULL DEFAULT 0,
    skipped_stubs    bigint[]    NOT NULL DEFAULT '{}',
    errors           text[]      NOT NULL DEFAULT '{}',
    cancel_requested boolean     NOT NULL DEFAULT false,
    cancelled_by     text        NOT NULL DEFAULT '',
    owner            text,
    heartbeat_at     timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz
);
CREATE INDEX IF NOT EXISTS idem_dlq_jobs_running ON idem_dlq_jobs (heartbeat_at) WHERE state = 'running';

-- Console sessions: a login creates one, a logout revokes it, and a
-- session cookie is accepted only while its row says so.
CREATE TABLE IF NOT EXISTS idem_console_sessions (
    id         text        PRIMARY KEY,
    name       text        NOT NULL,
    role       int         NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    revoked_at timestamptz
);
CREATE INDEX IF NOT EXISTS idem_console_sessions_expiry ON idem_console_sessions (expires_at);

-- The per-group counts learn the new status.
ALTER TABLE idem_dlq_groups ADD COLUMN IF NOT EXISTS replaying bigint NOT NULL DEFAULT 0;

CREATE OR REPLACE FUNCTION idem_dlq_groups_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
        INSERT INTO idem_dlq_groups AS g (consumer_group, dlq_topic, fingerprint, kind,
            unresolved, replaying, replayed, resolved, archived, first_seen, last_seen, sample_error)
        SELECT n.consumer_group, n.dlq_topic, n.fingerprint, n.kind,
            count(*) FILTER (WHERE n.status = 'unresolved'), count(*) FILTER (WHERE n.status = 'replaying'),
            count(*) FILTER (WHERE n.status = 'replayed'),
            count(*) FILTER (WHERE n.status = 'resolved'), count(*) FILTER (WHERE n.status = 'archived'),
            min(n.last_failure_at), max(n.last_failure_at), (array_agg(n.error ORDER BY n.last_failure_at DESC))[1]
        FROM new_rows n
        GROUP BY 1, 2, 3, 4
        ORDER BY 1, 2, 3, 4
        ON CONFLICT (consumer_group, dlq_topic, fingerprint, kind) DO UPDATE SET
            unresolved = g.unresolved + excluded.unresolved, replaying = g.replaying + excluded.replaying,
            replayed = g.replayed + excluded.replayed,
            resolved = g.resolved + excluded.resolved, archived = g.archived + excluded.archived,
            first_seen = least(g.first_seen, excluded.first_seen),
            last_seen = greatest(g.last_seen, excluded.last_seen),
            sample_error = CASE WHEN excluded.last_seen >= g.last_seen THEN excluded.sample_error ELSE g.sample_error END;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION idem_dlq_groups_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
        UPDATE idem_dlq_groups g SET
            unresolved = g.unresolved - d.unresolved, replaying = g.replaying - d.replaying,
            replayed = g.replayed - d.replayed,
            resolved = g.resolved - d.resolved, archived = g.archived - d.archived
        FROM (
            SELECT o.consumer_group, o.dlq_topic, o.fingerprint, o.kind,
                count(*) FILTER (WHERE o.status = 'unresolved') AS unresolved,
                count(*) FILTER (WHERE o.status = 'replaying') AS replaying,
                count(*) FILTER (WHERE o.status = 'replayed') AS replayed,
                count(*) FILTER (WHERE o.status = 'resolved') AS resolved,
                count(*) FILTER (WHERE o.status = 'archived') AS archived
            FROM old_rows o WHERE EXISTS (SELECT 1 FROM new_rows n WHERE n.id = o.id AND n.status <> o.status)
            GROUP BY 1, 2, 3, 4
        ) d
        WHERE g.consumer_group = d.consumer_group AND g.dlq_topic = d.dlq_topic AND g.fingerprint = d.fingerprint AND g.kind = d.kind;
        INSERT INTO idem_dlq_groups AS g (consumer_group, dlq_topic, fingerprint, kind,
            unresolved, replaying, replayed, resolved, archived, first_seen, last_seen, sample_error)
        SELECT n.consumer_group, n.dlq_topic, n.fingerprint, n.kind,
            count(*) FILTER (WHERE n.status = 'unresolved'), count(*) FILTER (WHERE n.status = 'replaying'),
            count(*) FILTER (WHERE n.status = 'replayed'),
            count(*) FILTER (WHERE n.status = 'resolved'), count(*) FILTER (WHERE n.status = 'archived'),
            min(n.last_failure_at), max(n.last_failure_at), (array_agg(n.error ORDER BY n.last_failure_at DESC))[1]
        FROM new_rows n WHERE EXISTS (SELECT 1 FROM old_rows o WHERE o.id = n.id AND o.status <> n.status)
        GROUP BY 1, 2, 3, 4
        ORDER BY 1, 2, 3, 4
        ON CONFLICT (consumer_group, dlq_topic, fingerprint, kind) DO UPDATE SET
            unresolved = g.unresolved + excluded.unresolved, replaying = g.replaying + excluded.replaying,
            replayed = g.replayed + excluded.replayed,
            resolved = g.resolved + excluded.resolved, archived = g.archived + excluded.archived,
            first_seen = least(g.first_seen, excluded.first_seen),
            last_seen = greatest(g.last_seen, excluded.last_seen),
            sample_error = g.sample_error;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION idem_dlq_groups_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
        UPDATE idem_dlq_groups g SET
            unresolved = g.unresolved - d.unresolved, replaying = g.replaying - d.replaying,
            replayed = g.replayed - d.replayed,
            resolved = g.resolved - d.resolved, archived = g.archived - d.archived
        FROM (
            SELECT o.consumer_group, o.dlq_topic, o.fingerprint, o.kind,
                count(*) FILTER (WHERE o.status = 'unresolved') AS unresolved,
                count(*) FILTER (WHERE o.status = 'replaying') AS replaying,
                count(*) FILTER (WHERE o.status = 'replayed') AS replayed,
                count(*) FILTER (WHERE o.status = 'resolved') AS resolved,
                count(*) FILTER (WHERE o.status = 'archived') AS archived
            FROM old_rows o
            GROUP BY 1, 2, 3, 4
        ) d
        WHERE g.consumer_group = d.consumer_group AND g.dlq_topic = d.dlq_topic AND g.fingerprint = d.fingerprint AND g.kind = d.kind;
    RETURN NULL;
END
$$;
