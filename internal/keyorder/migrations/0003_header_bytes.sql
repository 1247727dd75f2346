-- Header names are bytes in Kafka, not text: a name that is not valid UTF-8
-- did not survive the jsonb column. Each parked record's headers are now two
-- parallel bytea arrays (a NULL value element is a null header value, an empty
-- one an empty value), so they round-trip byte for byte.
ALTER TABLE idem_ordering_parked
    ADD COLUMN header_keys bytea[],
    ADD COLUMN header_values bytea[];
UPDATE idem_ordering_parked SET
    header_keys = CASE WHEN jsonb_typeof(headers) = 'array' THEN ARRAY(
        SELECT convert_to(e->>'k', 'UTF8')
        FROM jsonb_array_elements(headers) WITH ORDINALITY AS x(e, i) ORDER BY i) ELSE '{}' END,
    header_values = CASE WHEN jsonb_typeof(headers) = 'array' THEN ARRAY(
        SELECT decode(e->>'v', 'base64')
        FROM jsonb_array_elements(headers) WITH ORDINALITY AS x(e, i) ORDER BY i) ELSE '{}' END;
ALTER TABLE idem_ordering_parked
    ALTER COLUMN header_keys SET NOT NULL,
    ALTER COLUMN header_values SET NOT NULL,
    DROP COLUMN headers;
