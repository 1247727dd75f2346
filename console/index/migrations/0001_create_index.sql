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
    header_keys      bytea[]     NOT NULL DEFAULT '{}',
    header_values    bytea[]     NOT NULL DEFAULT '{}',
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
