-- Where each projection (leaderboard, lessons, ...) has read the event log up to.
--
-- A projection updates its own view tables and this row in ONE transaction (engine/projections.py),
-- so after a crash the view and the checkpoint always agree: no event is applied twice or skipped.
-- Rebuilding a projection means emptying its view and setting its position back to 0.

CREATE TABLE projection_checkpoints (
    -- The projection's name, e.g. 'lessons'.
    name        text        PRIMARY KEY CHECK (name <> ''),
    -- Position of the last event the projection's view includes; 0 before the first.
    position    bigint      NOT NULL DEFAULT 0 CHECK (position >= 0),
    -- When the checkpoint last moved.
    updated_at  timestamptz NOT NULL DEFAULT now()
);
