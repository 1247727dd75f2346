-- The correlation id a saga carries to every step and compensation (the
-- ctx of Start's, or the saga's id when it had none): their ctx holds it,
-- so the commands they enqueue through the outbox carry it on.
ALTER TABLE idem_saga ADD COLUMN IF NOT EXISTS correlation_id text NOT NULL DEFAULT '';
