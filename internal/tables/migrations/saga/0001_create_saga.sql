-- One row per saga. step is the index of the next step to run (running,
-- waiting) or to compensate (compensating; -1 when none is left).
CREATE TABLE IF NOT EXISTS idem_saga (
    id         text        PRIMARY KEY,
    type       text        NOT NULL,
    state      text        NOT NULL CHECK (state IN ('running', 'waiting', 'compensating', 'completed', 'compensated')),
    input      bytea,
    step       int         NOT NULL DEFAULT 0,
    error      text        NOT NULL DEFAULT '',
    deadline   timestamptz,
    next_at    timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS idem_saga_due_idx ON idem_saga (next_at) WHERE state IN ('running', 'waiting', 'compensating');

-- One row per step that was recorded: done (its effect happened), pending
-- (awaiting Complete or Fail), failed (no effect; not compensated) or
-- compensated.
CREATE TABLE IF NOT EXISTS idem_saga_step (
    saga_id        text        NOT NULL REFERENCES idem_saga (id) ON DELETE CASCADE,
    idx            int         NOT NULL,
    name           text        NOT NULL,
    state          text        NOT NULL CHECK (state IN ('pending', 'done', 'failed', 'compensated')),
    result         bytea,
    error          text        NOT NULL DEFAULT '',
    attempts       int         NOT NULL DEFAULT 0,
    comp_attempts  int         NOT NULL DEFAULT 0,
    finished_at    timestamptz NOT NULL DEFAULT now(),
    compensated_at timestamptz,
    PRIMARY KEY (saga_id, idx),
    UNIQUE (saga_id, name)
);
