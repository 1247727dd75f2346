-- The owner of each claimed partition (consumer.Config.Transactions): a claim
-- writes its own token here before it settles the marks its predecessors
-- left (Resolve with claim), and every marked step (a drain's DoneAt and
-- PromoteAt, an owed hook) checks, in its own transaction, that the token of
-- its mark is still the partition's owner. A member frozen past its session
-- timeout (a zombie) cannot commit in Kafka, but could still write marks;
-- without this fence its successor's next commit would take them for its
-- own (their offsets below the one it commits) and settle steps whose
-- forwards were aborted, leaving a key blocked behind a head that never
-- comes back.
CREATE TABLE IF NOT EXISTS idem_ordering_claims (
    consumer_group  text        NOT NULL,
    topic           text        NOT NULL,
    partition       int         NOT NULL,
    owner           text        NOT NULL,
    claimed_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, partition)
);
