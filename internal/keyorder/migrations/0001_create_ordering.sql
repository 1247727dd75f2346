-- Per-key ordering (consumer.OrderingByKey): the keys blocked behind a message
-- in a retry tier, and the messages parked behind it, in arrival order.
CREATE TABLE IF NOT EXISTS idem_ordering_heads (
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    msg_key        bytea       NOT NULL,
    head_key       text        NOT NULL,
    since          timestamptz NOT NULL DEFAULT now(),
    pending        jsonb,
    PRIMARY KEY (consumer_group, topic, msg_key)
);
CREATE TABLE IF NOT EXISTS idem_ordering_parked (
    seq              bigserial   PRIMARY KEY,
    consumer_group   text        NOT NULL,
    topic            text        NOT NULL,
    msg_key          bytea       NOT NULL,
    idempotency_key  text        NOT NULL,
    "partition"      int         NOT NULL,
    "offset"         bigint      NOT NULL,
    record_time      timestamptz NOT NULL,
    value            bytea,
    headers          jsonb       NOT NULL,
    parked_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (consumer_group, topic, msg_key, idempotency_key)
);
CREATE INDEX IF NOT EXISTS idem_ordering_parked_key_seq
    ON idem_ordering_parked (consumer_group, topic, msg_key, seq);
