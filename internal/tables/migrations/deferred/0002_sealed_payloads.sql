-- Payload encryption at rest (internal/seal, consumer.Config.EncryptionKeyFile):
-- a deferred message's value and headers may be sealed as one blob (sealed)
-- under a data key of idem_seal_keys (key_id), its value and header columns
-- then left empty; key_id NULL: stored in clear. dlq_topic is where the
-- scheduler dead-letters a stub of the message when its payload cannot be
-- opened for good (its key destroyed): the dead-letter topic the consumer's
-- retry policy gives its origin. Empty: the default "<origin>.<group>.dlq".
ALTER TABLE idem_deferred ADD COLUMN IF NOT EXISTS key_id bigint;
ALTER TABLE idem_deferred ADD COLUMN IF NOT EXISTS sealed bytea;
ALTER TABLE idem_deferred ADD COLUMN IF NOT EXISTS dlq_topic text NOT NULL DEFAULT '';
-- The rows of one data key: what `idem keys list` counts.
CREATE INDEX IF NOT EXISTS idem_deferred_key ON idem_deferred (key_id) WHERE key_id IS NOT NULL;
