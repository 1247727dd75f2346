-- attempts counts every failed publish of a row (outages included) and sets
-- its retry backoff; rejections counts only the publishes Kafka refused for
-- the row itself (record too large, invalid record). A row moves to 'failed'
-- after Relay.MaxAttempts rejections; outages (brokers down, SASL or
-- authorization failures, unknown topic) never fail a row.
ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS rejections int NOT NULL DEFAULT 0;
