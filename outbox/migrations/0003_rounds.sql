-- Relay.ExactlyOnce: before a round is published in a Kafka transaction, its
-- rows are labelled with the round's number (round), drawn from this
-- sequence so that no two rounds ever share one; the transaction commits that
-- number as the relay's progress mark. A new leader deletes the rows of the
-- round the mark names (published) and publishes every other row again. The
-- default (at-least-once) relay leaves round NULL.
ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS round bigint;
CREATE SEQUENCE IF NOT EXISTS {{.RoundSeq}};
