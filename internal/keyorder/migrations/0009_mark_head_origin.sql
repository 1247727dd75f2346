-- A drain's marked parked rows name their head's origin too (mark_head's
-- record: where it was first produced in its source topic), so that a revert
-- at claim (Resolve) that blocks the key again behind mark_head restores the
-- head as that one record, not as any record with its idempotency key: a
-- producer's duplicate of the head read after the revert is then parked
-- behind the head, as before the drain, instead of being taken for it. NULL:
-- not known (a row marked before this migration), and the restored head is
-- any record with mark_head's idempotency key, as before.
ALTER TABLE idem_ordering_parked
    ADD COLUMN mark_head_partition int,
    ADD COLUMN mark_head_offset bigint;
