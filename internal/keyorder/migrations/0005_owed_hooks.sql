-- Hooks a Kafka transaction owes (consumer.Config.Transactions with
-- OnDeadLettered, issue 28): a message dead-lettered in a transaction gets
-- its hook only once that transaction has committed, so the hook never runs
-- for a record a read_committed reader never sees. The row is written before
-- the forward, marked with the source offset whose commit carries it (as a
-- drain's steps are, 0004): the worker runs the hook after the commit and
-- removes the row; a claim of the mark's partition runs the rows below its
-- committed offset (committed, their member gone before the hook ran) and
-- removes those at or above it (aborted: the message is read again).
-- hook_key is the hook's inbox key (once per message); payload is what the
-- hook is called with, as the consumer encodes it.
CREATE TABLE IF NOT EXISTS idem_txn_hooks (
    consumer_group  text        NOT NULL,
    hook_key        text        NOT NULL,
    mark_topic      text        NOT NULL,
    mark_partition  int         NOT NULL,
    mark_offset     bigint      NOT NULL,
    payload         bytea       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, hook_key)
);
CREATE INDEX IF NOT EXISTS idem_txn_hooks_mark ON idem_txn_hooks (consumer_group, mark_topic, mark_partition);
