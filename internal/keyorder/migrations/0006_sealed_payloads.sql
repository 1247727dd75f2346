-- Payload encryption at rest (internal/seal, consumer.Config.EncryptionKeyFile):
-- a parked message's value and headers may be sealed as one blob (sealed)
-- under a data key of idem_seal_keys (key_id), its value and header columns
-- then left empty. key_id NULL: stored in clear. A pending head's record
-- (idem_ordering_heads.pending, JSON) carries its sealed blob and key id in
-- the JSON itself.
ALTER TABLE idem_ordering_parked ADD COLUMN IF NOT EXISTS key_id bigint;
ALTER TABLE idem_ordering_parked ADD COLUMN IF NOT EXISTS sealed bytea;
-- The rows of one data key: what `idem keys list` counts.
CREATE INDEX IF NOT EXISTS idem_ordering_parked_key ON idem_ordering_parked (key_id) WHERE key_id IS NOT NULL;
