-- Payload encryption at rest (internal/seal, outbox.Relay.EncryptionKeyFile):
-- a row's value and headers may be sealed as one blob (sealed) under a data
-- key of idem_seal_keys (key_id), bound to the row by its event_id; its value
-- and header columns are then left empty. key_id NULL: stored in clear.
ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS key_id bigint;
ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS sealed bytea;
