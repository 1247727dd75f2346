-- The failure index: one row per dead-letter record, unique by its position
-- in the dead-letter topic, so the indexer's inserts are idempotent.
CREATE TABLE IF NOT EXISTS idem_dlq_records (
    id               bigserial   PRIMARY KEY,
    dlq_topic        text        NOT NULL,
    dlq_partition    int         NOT NULL,
    dlq_offset       bigint      NOT NULL,
    origin_topic     text        NOT NULL DEFAULT '',
    origin_partition int         NOT NULL DEFAULT 0,
    origin_offset    bigint      NOT NULL DEFAULT 0,
    consumer_group   text        NOT NULL DEFAULT '',
    fingerprint      text        NOT NULL DEFAULT '',
    kind             text        NOT NULL DEFAULT '',
    msg_key          bytea,
    idempotency_key  text        NOT NULL DEFAULT '',
    attempts         int         NOT NULL DEFAULT 0,
    first_failure_at timestamptz NOT NULL,
    last_failure_at  timestamptz NOT NULL,
    indexed_at       timestamptz NOT NULL DEFAULT now(),
    error            text        NOT NULL DEFAULT '',
    error_type       text        NOT NULL DEFAULT '',
    stack            text        NOT NULL DEFAULT '',
    value            bytea,
    value_size       int         NOT NULL DEFAULT 0,
    value_truncated  boolean     NOT NULL DEFAULT false,
    stub             boolean     NOT NULL DEFAULT false,
    -- Every header in order, encoded by package index (uvarint length,
    -- then bytes, for each key and value).
    headers          bytea       NOT NULL DEFAULT '',
    status           text        NOT NULL DEFAULT 'unresolved'
                     CHECK (status IN ('unresolved', 'replayed', 'resolved', 'archived')),
    status_actor     text        NOT NULL DEFAULT '',
    status_reason    text        NOT NULL DEFAULT '',
    status_at        timestamptz NOT NULL DEFAULT now(),
    previous_id      bigint,
    UNIQUE (dlq_topic, dlq_partition, dlq_offset)
);

-- List pages by (last_failure_at, id) descending, with or without filters.
CREATE INDEX IF NOT EXISTS idem_dlq_records_recent ON idem_dlq_records (last_failure_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS idem_dlq_records_status ON idem_dlq_records (status, last_failure_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS idem_dlq_records_topic ON idem_dlq_records (dlq_topic, status, last_failure_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS idem_dlq_records_group ON idem_dlq_records (consumer_group, status, last_failure_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS idem_dlq_records_fingerprint ON idem_dlq_records (fingerprint, status, last_failure_at DESC, id DESC);
-- Key filters and lineage (idempotency key + origin topic + group).
CREATE INDEX IF NOT EXISTS idem_dlq_records_idem_key ON idem_dlq_records (idempotency_key, origin_topic, consumer_group, id);
CREATE INDEX IF NOT EXISTS idem_dlq_records_msg_key ON idem_dlq_records (msg_key);
-- Overview: the (group, topic) pairs (a loose index scan) and arrivals.
CREATE INDEX IF NOT EXISTS idem_dlq_records_pair ON idem_dlq_records (consumer_group, dlq_topic, last_failure_at);
-- Overview and metrics: the unresolved records per group and topic.
CREATE INDEX IF NOT EXISTS idem_dlq_records_unresolved ON idem_dlq_records (consumer_group, dlq_topic, last_failure_at)
    WHERE status = 'unresolved';
-- The retention sweep.
CREATE INDEX IF NOT EXISTS idem_dlq_records_settled ON idem_dlq_records (status_at)
    WHERE status <> 'unresolved';

-- Edits made by edit-and-retry, never overwriting the original value.
CREATE TABLE IF NOT EXISTS idem_dlq_versions (
    record_id           bigint      NOT NULL REFERENCES idem_dlq_records (id) ON DELETE CASCADE,
    n                   int         NOT NULL,
    value               bytea       NOT NULL,
    actor               text        NOT NULL,
    reason              text        NOT NULL DEFAULT '',
    at                  timestamptz NOT NULL DEFAULT now(),
    published_to        text        NOT NULL,
    published_partition int         NOT NULL,
    published_offset    bigint      NOT NULL,
    PRIMARY KEY (record_id, n)
);

-- Every action of the console and of `idem dlq` against the index.
CREATE TABLE IF NOT EXISTS idem_dlq_audit (
    id         bigserial   PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    actor      text        NOT NULL,
    action     text        NOT NULL,
    record_ids bigint[]    NOT NULL DEFAULT '{}',
    detail     text        NOT NULL DEFAULT '',
    reason     text        NOT NULL DEFAULT '',
    result     text        NOT NULL DEFAULT ''
);

-- One row per failure group (fingerprint, kind, group, DLQ topic): its
-- records by status and the span of their failures, kept by the triggers
-- below, so listing groups and the overview do not scan the records.
-- first_seen and last_seen span every record the group has had.
CREATE TABLE IF NOT EXISTS idem_dlq_groups (
    consumer_group text        NOT NULL,
    dlq_topic      text        NOT NULL,
    fingerprint    text        NOT NULL,
    kind           text        NOT NULL,
    unresolved     bigint      NOT NULL DEFAULT 0,
    replayed       bigint      NOT NULL DEFAULT 0,
    resolved       bigint      NOT NULL DEFAULT 0,
    archived       bigint      NOT NULL DEFAULT 0,
    first_seen     timestamptz NOT NULL,
    last_seen      timestamptz NOT NULL,
    sample_error   text        NOT NULL DEFAULT '',
    PRIMARY KEY (consumer_group, dlq_topic, fingerprint, kind)
);

-- The three triggers keep idem_dlq_groups: a statement's inserted rows are
-- added, deleted rows subtracted, and a status change moves a row's count.
CREATE OR REPLACE FUNCTION idem_dlq_groups_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
        INSERT INTO idem_dlq_groups AS g (consumer_group, dlq_topic, fingerprint, kind,
            unresolved, replayed, resolved, archived, first_seen, last_seen, sample_error)
        SELECT n.consumer_group, n.dlq_topic, n.fingerprint, n.kind,
            count(*) FILTER (WHERE n.status = 'unresolved'), count(*) FILTER (WHERE n.status = 'replayed'),
            count(*) FILTER (WHERE n.status = 'resolved'), count(*) FILTER (WHERE n.status = 'archived'),
            min(n.last_failure_at), max(n.last_failure_at), (array_agg(n.error ORDER BY n.last_failure_at DESC))[1]
        FROM new_rows n 
        GROUP BY 1, 2, 3, 4
        ORDER BY 1, 2, 3, 4
        ON CONFLICT (consumer_group, dlq_topic, fingerprint, kind) DO UPDATE SET
            unresolved = g.unresolved + excluded.unresolved, replayed = g.replayed + excluded.replayed,
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
            unresolved = g.unresolved - d.unresolved, replayed = g.replayed - d.replayed,
            resolved = g.resolved - d.resolved, archived = g.archived - d.archived
        FROM (
            SELECT o.consumer_group, o.dlq_topic, o.fingerprint, o.kind,
                count(*) FILTER (WHERE o.status = 'unresolved') AS unresolved,
                count(*) FILTER (WHERE o.status = 'replayed') AS replayed,
                count(*) FILTER (WHERE o.status = 'resolved') AS resolved,
                count(*) FILTER (WHERE o.status = 'archived') AS archived
            FROM old_rows o WHERE EXISTS (SELECT 1 FROM new_rows n WHERE n.id = o.id AND n.status <> o.status)
            GROUP BY 1, 2, 3, 4
        ) d
        WHERE g.consumer_group = d.consumer_group AND g.dlq_topic = d.dlq_topic AND g.fingerprint = d.fingerprint AND g.kind = d.kind;
        INSERT INTO idem_dlq_groups AS g (consumer_group, dlq_topic, fingerprint, kind,
            unresolved, replayed, resolved, archived, first_seen, last_seen, sample_error)
        SELECT n.consumer_group, n.dlq_topic, n.fingerprint, n.kind,
            count(*) FILTER (WHERE n.status = 'unresolved'), count(*) FILTER (WHERE n.status = 'replayed'),
            count(*) FILTER (WHERE n.status = 'resolved'), count(*) FILTER (WHERE n.status = 'archived'),
            min(n.last_failure_at), max(n.last_failure_at), (array_agg(n.error ORDER BY n.last_failure_at DESC))[1]
        FROM new_rows n WHERE EXISTS (SELECT 1 FROM old_rows o WHERE o.id = n.id AND o.status <> n.status)
        GROUP BY 1, 2, 3, 4
        ORDER BY 1, 2, 3, 4
        ON CONFLICT (consumer_group, dlq_topic, fingerprint, kind) DO UPDATE SET
            unresolved = g.unresolved + excluded.unresolved, replayed = g.replayed + excluded.replayed,
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
            unresolved = g.unresolved - d.unresolved, replayed = g.replayed - d.replayed,
            resolved = g.resolved - d.resolved, archived = g.archived - d.archived
        FROM (
            SELECT o.consumer_group, o.dlq_topic, o.fingerprint, o.kind,
                count(*) FILTER (WHERE o.status = 'unresolved') AS unresolved,
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

DROP TRIGGER IF EXISTS idem_dlq_groups_insert ON idem_dlq_records;
CREATE TRIGGER idem_dlq_groups_insert AFTER INSERT ON idem_dlq_records
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION idem_dlq_groups_insert();
DROP TRIGGER IF EXISTS idem_dlq_groups_update ON idem_dlq_records;
CREATE TRIGGER idem_dlq_groups_update AFTER UPDATE ON idem_dlq_records
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION idem_dlq_groups_update();
DROP TRIGGER IF EXISTS idem_dlq_groups_delete ON idem_dlq_records;
CREATE TRIGGER idem_dlq_groups_delete AFTER DELETE ON idem_dlq_records
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION idem_dlq_groups_delete();
