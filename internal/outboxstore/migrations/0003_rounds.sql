-- Relay.ExactlyOnce: before a round is published in a Kafka transaction, the
-- ids of its rows are recorded here under the round's number (an identity:
-- never reused); the transaction commits that number as the relay's progress
-- mark. A new leader deletes the rows of the round the mark names (they were
-- published) and then every round record (the other rounds never committed:
-- their rows are still pending and go out again). One small row per round,
-- rather than a label on each outbox row, which would double the dead tuples
-- the relay's reads must skip. Unused by the default (at-least-once) relay.
CREATE TABLE IF NOT EXISTS {{.Rounds}} (
    round      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ids        bigint[]    NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
