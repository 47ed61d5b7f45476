-- The lessons projection (engine/lessons_projection.py) also keeps, per template setting, the speedups
-- it was measured at: the search proposer fits a model with interaction effects from them (settings whose
-- parameter values only pay together, e.g. rmsnorm FUSED=0 with NT=1), which lesson_stats, one row per
-- single change, cannot show.
--
-- A view of the event log like the tables of 0003_lessons.sql: written only by the projection, in the
-- same transaction as its checkpoint, and rebuilding it from position 0 gives the same rows.

CREATE TABLE lesson_settings (
    -- The problem's family.
    family               text NOT NULL,
    -- The problem.
    problem              text NOT NULL,
    -- The resolved target.
    target               text NOT NULL,
    -- The candidate's content hash: one template setting of the problem.
    candidate_id         text NOT NULL,
    -- The template parameter values of that setting (never empty: hand-written candidates have no row).
    params               jsonb NOT NULL,
    -- ln(speedup over the numpy baseline) of its most recent benchmarks with verdict ok, oldest first
    -- (bounded, see LESSON_SAMPLES in engine/lessons_projection.py).
    log_speedup_samples  double precision[] NOT NULL DEFAULT '{}',
    -- Position of the last event that changed this row.
    last_position        bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (family, problem, target, candidate_id)
);

-- lessons_for reads a family's settings on one target.
CREATE INDEX lesson_settings_by_target ON lesson_settings (target, family);

-- A new table of an existing projection: the view must hold the events folded before this migration too.
-- Empty every lessons table and forget the checkpoint (as rebuild_lessons does), so the next
-- catch_up_lessons refolds the whole log from position 0. Until it has, readers see no lessons and the
-- evidence index finds no earlier outcome (a search compiles again; nothing is wrong, only slower); both
-- catch the projection up before they read, so the first of them does the rebuild.
TRUNCATE lesson_searches, lesson_candidates, lesson_stats, lesson_failures, candidate_evidence, lesson_settings;
DELETE FROM projection_checkpoints WHERE name = 'lessons';
