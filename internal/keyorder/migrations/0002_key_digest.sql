-- Kafka keys of any length (issue 8): a key of a few KB is too large for a
-- btree index entry, so the indexes use its sha256 digest, a generated column;
-- msg_key keeps the full key. heads.tier records the retry tier the head was
-- last sent to (0: not known), so a Run can warn about heads in a tier it no
-- longer reads.
ALTER TABLE idem_ordering_heads
    ADD COLUMN key_digest bytea GENERATED ALWAYS AS (sha256(msg_key)) STORED,
    ADD COLUMN tier int NOT NULL DEFAULT 0;
ALTER TABLE idem_ordering_heads DROP CONSTRAINT idem_ordering_heads_pkey;
ALTER TABLE idem_ordering_heads ADD CONSTRAINT idem_ordering_heads_pkey
    PRIMARY KEY (consumer_group, topic, key_digest);

ALTER TABLE idem_ordering_parked
    ADD COLUMN key_digest bytea GENERATED ALWAYS AS (sha256(msg_key)) STORED;
DO $$
DECLARE c name;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
             WHERE conrelid = 'idem_ordering_parked'::regclass AND contype = 'u' LOOP
        EXECUTE format('ALTER TABLE idem_ordering_parked DROP CONSTRAINT %I', c);
    END LOOP;
END $$;
DROP INDEX IF EXISTS idem_ordering_parked_key_seq;
ALTER TABLE idem_ordering_parked ADD CONSTRAINT idem_ordering_parked_key_ikey
    UNIQUE (consumer_group, topic, key_digest, idempotency_key);
CREATE INDEX idem_ordering_parked_key_seq
    ON idem_ordering_parked (consumer_group, topic, key_digest, seq);
