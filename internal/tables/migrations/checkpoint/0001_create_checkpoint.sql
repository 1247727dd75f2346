-- One row per batch job: the key of the last row of the last committed chunk.
-- It is advanced in the same transaction as the chunk's effects.
CREATE TABLE IF NOT EXISTS idem_checkpoint (
    job         text        PRIMARY KEY,
    cursor      text        NOT NULL DEFAULT '',
    rows_done   bigint      NOT NULL DEFAULT 0,
    chunks_done bigint      NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
