-- Live controls (package internal/control): the partitions an operator
-- paused, the re-drives of a window under a replay epoch, and the fleet's
-- heartbeats. A change to a pause or a re-drive NOTIFYs the schema's
-- channel (idem_control_<oid of the schema>) with the consumer group as its
-- payload; the group's members LISTEN on it, and re-read every 30 s besides.

-- One row per paused topic ("partition" -1) or partition of a consumer
-- group. Pausing inserts the row (ON CONFLICT DO NOTHING: a second pause of
-- the same thing changes nothing); resuming deletes it.
CREATE TABLE IF NOT EXISTS idem_control_pauses (
    consumer_group text        NOT NULL CHECK (consumer_group <> ''),
    topic          text        NOT NULL CHECK (topic <> ''),
    "partition"    integer     NOT NULL CHECK ("partition" >= -1),
    paused_by      text        NOT NULL,
    reason         text        NOT NULL DEFAULT '',
    paused_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, "partition")
);

-- A re-drive: a group's records of a topic read again from start_offset
-- (per partition) to end_offset (fixed when it was asked), each under the
-- replay epoch, which the inbox keys them by. At most one runs per group
-- and topic. Rows are kept after the end: a record of a window keeps its
-- epoch when it is read again (a redelivery, a retry tier).
CREATE TABLE IF NOT EXISTS idem_control_redrives (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_group text        NOT NULL CHECK (consumer_group <> ''),
    topic          text        NOT NULL CHECK (topic <> ''),
    epoch          bigint      NOT NULL CHECK (epoch > 0),
    state          text        NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'done', 'cancelled')),
    from_time      timestamptz,
    until_time     timestamptz,
    rate           integer     NOT NULL DEFAULT 0 CHECK (rate >= 0),
    requested_by   text        NOT NULL,
    reason         text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz,
    finished_by    text        NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX IF NOT EXISTS idem_control_redrives_running ON idem_control_redrives (consumer_group, topic) WHERE state = 'running';
CREATE INDEX IF NOT EXISTS idem_control_redrives_group ON idem_control_redrives (consumer_group, created_at DESC);

-- A re-drive's window and progress in one partition: every record below
-- next_offset reached its outcome under the epoch; the partition's owner
-- goes on from there (after a crash or a rebalance too).
CREATE TABLE IF NOT EXISTS idem_control_redrive_parts (
    redrive_id   bigint      NOT NULL REFERENCES idem_control_redrives (id) ON DELETE CASCADE,
    "partition"  integer     NOT NULL CHECK ("partition" >= 0),
    start_offset bigint      NOT NULL,
    end_offset   bigint      NOT NULL,
    next_offset  bigint      NOT NULL,
    member       text        NOT NULL DEFAULT '',
    updated_at   timestamptz NOT NULL DEFAULT now(),
    done_at      timestamptz,
    PRIMARY KEY (redrive_id, "partition"),
    CHECK (0 <= start_offset AND start_offset <= next_offset AND next_offset <= end_offset)
);

-- One row per running consumer.Run with Config.Controls, written every
-- beat_every_ms and when its partitions change, deleted when it stops.
CREATE TABLE IF NOT EXISTS idem_control_members (
    consumer_group text        NOT NULL,
    member         text        NOT NULL,
    instance_id    text        NOT NULL DEFAULT '',
    kafka_member   text        NOT NULL DEFAULT '',
    host           text        NOT NULL DEFAULT '',
    version        text        NOT NULL DEFAULT '',
    started_at     timestamptz NOT NULL,
    beat_at        timestamptz NOT NULL DEFAULT now(),
    beat_every_ms  integer     NOT NULL CHECK (beat_every_ms > 0),
    status         jsonb       NOT NULL DEFAULT '{}',
    PRIMARY KEY (consumer_group, member)
);

CREATE OR REPLACE FUNCTION idem_control_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    grp text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        grp := OLD.consumer_group;
    ELSE
        grp := NEW.consumer_group;
    END IF;
    PERFORM pg_notify('idem_control_' || (SELECT relnamespace::text FROM pg_class WHERE oid = TG_RELID), grp);
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS idem_control_pauses_notify ON idem_control_pauses;
CREATE TRIGGER idem_control_pauses_notify AFTER INSERT OR UPDATE OR DELETE ON idem_control_pauses
    FOR EACH ROW EXECUTE FUNCTION idem_control_notify();
DROP TRIGGER IF EXISTS idem_control_redrives_notify ON idem_control_redrives;
CREATE TRIGGER idem_control_redrives_notify AFTER INSERT OR UPDATE OR DELETE ON idem_control_redrives
    FOR EACH ROW EXECUTE FUNCTION idem_control_notify();
