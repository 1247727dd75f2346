-- Ordering with Kafka transactions (consumer.Config.Transactions, issue 20):
-- a drain's steps whose forward rides in a Kafka transaction are not applied
-- at once but marked with the source offset whose commit carries that
-- transaction (mark_topic, mark_partition, mark_offset: committed iff the
-- group's committed offset of that partition is above mark_offset). Resolve
-- applies them once the offset is committed, or reverts them (at claim) when
-- it is not. A marked parked row is done (dead-lettered, or promoted to head)
-- pending the commit; mark_head names the head whose drain marked it, so a
-- revert can block the key behind it again. A marked head row was promoted
-- by such a drain; revert_head is its head before. park_topic, park_partition,
-- park_offset name the record that parked the row, until its offset is
-- committed: a drained row (drained: its mark applied) stays until then, so a
-- redelivery of that record is known and skipped rather than handled again.
ALTER TABLE idem_ordering_parked
    ADD COLUMN mark_topic text,
    ADD COLUMN mark_partition int,
    ADD COLUMN mark_offset bigint,
    ADD COLUMN mark_head text,
    ADD COLUMN park_topic text,
    ADD COLUMN park_partition int,
    ADD COLUMN park_offset bigint,
    ADD COLUMN drained boolean NOT NULL DEFAULT false;
ALTER TABLE idem_ordering_heads
    ADD COLUMN mark_topic text,
    ADD COLUMN mark_partition int,
    ADD COLUMN mark_offset bigint,
    ADD COLUMN revert_head text;
CREATE INDEX idem_ordering_parked_mark
    ON idem_ordering_parked (consumer_group, mark_topic, mark_partition) WHERE mark_topic IS NOT NULL;
CREATE INDEX idem_ordering_parked_park
    ON idem_ordering_parked (consumer_group, park_topic, park_partition) WHERE park_topic IS NOT NULL;
CREATE INDEX idem_ordering_parked_drained
    ON idem_ordering_parked (consumer_group) WHERE drained;
CREATE INDEX idem_ordering_heads_mark
    ON idem_ordering_heads (consumer_group, mark_topic, mark_partition) WHERE mark_topic IS NOT NULL;
