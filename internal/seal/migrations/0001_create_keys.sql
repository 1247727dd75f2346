-- The data keys of payload encryption at rest (package internal/seal). Each
-- key is 32 random bytes, stored only wrapped (AES-256-GCM) by a
-- key-encryption key (KEK) that never reaches the database: kek_id names it
-- (an HMAC of the KEK, not the KEK). A sealed row carries its key_id.
-- Destroying a key clears wrapped_key and kek_id and keeps the row, with who
-- destroyed it, when and why: the rows sealed under it are unreadable from
-- then on (crypto-shredding).
CREATE TABLE IF NOT EXISTS idem_seal_keys (
    key_id           bigserial   PRIMARY KEY,
    purpose          text        NOT NULL,
    kek_id           text,
    wrapped_key      bytea,
    created_at       timestamptz NOT NULL DEFAULT now(),
    rewrapped_at     timestamptz,
    destroyed_at     timestamptz,
    destroyed_by     text        NOT NULL DEFAULT '',
    destroyed_reason text        NOT NULL DEFAULT '',
    CHECK ((wrapped_key IS NULL) = (destroyed_at IS NOT NULL)),
    CHECK ((wrapped_key IS NULL) = (kek_id IS NULL))
);

-- A writer's current key: the newest live key of its purpose.
CREATE INDEX IF NOT EXISTS idem_seal_keys_current ON idem_seal_keys (purpose, created_at DESC, key_id DESC)
    WHERE wrapped_key IS NOT NULL;
