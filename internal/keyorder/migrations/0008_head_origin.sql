-- A key's head is one record, not one idempotency key (issue 28, soak seeds
-- 1796388943105795458 and …468): head_partition and head_offset are where
-- the head's record was first produced in its source topic (the origin every
-- copy of it carries). Another record with the head's idempotency key (a
-- producer's duplicate) is then parked behind the head instead of being
-- taken for it. revert_partition and revert_offset are the origin of
-- revert_head. NULL: not known (a head blocked before this migration, or
-- blocked again by a revert), and any record with the head's idempotency key
-- is taken for the head, as before.
ALTER TABLE idem_ordering_heads
    ADD COLUMN head_partition int,
    ADD COLUMN head_offset bigint,
    ADD COLUMN revert_partition int,
    ADD COLUMN revert_offset bigint;
