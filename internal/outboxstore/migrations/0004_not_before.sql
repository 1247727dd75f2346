-- Message.NotBefore: not_before is the earliest time (by the database clock)
-- a row may be published, NULL for "as soon as possible". A row enqueued
-- with a future not_before also starts with retry_at = not_before, so the
-- relay's existing rule does the rest: a pending row with retry_at in the
-- future is not read and holds back the later rows of its key.
ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS not_before timestamptz;
-- The relay reads its window from two ranges instead of walking every
-- pending row in id order past the delayed ones (a million rows scheduled
-- for tomorrow must not slow today's): rows with no retry_at, in id order,
-- here; rows whose retry_at has come, from the retry index.
CREATE INDEX IF NOT EXISTS {{.ReadyIndex}} ON {{.Table}} (id) WHERE state = 'pending' AND retry_at IS NULL;
-- "Is an earlier row of this key still waiting?", asked for each candidate
-- row of a round.
CREATE INDEX IF NOT EXISTS {{.HeldIndex}} ON {{.Table}} (key, id) WHERE state = 'pending' AND retry_at IS NOT NULL;
