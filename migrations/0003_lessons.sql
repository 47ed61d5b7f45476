-- The lessons projection (engine/lessons_projection.py): what the evidence log teaches, per problem
-- family, target and change, and the index of recorded compile and validation evidence that lets a later
-- search reuse it.
--
-- Every table here is a view of the event log: it is written only by the projection, in the same
-- transaction as its checkpoint in projection_checkpoints (name 'lessons'), and rebuilding it from
-- position 0 gives the same rows. No column holds a clock time or anything else that a rebuild could
-- change.

-- The searches the projection has seen: which problem, family, target and problem definition their
-- step outcomes belong to.
CREATE TABLE lesson_searches (
    -- The search's event stream, 'search-<search_id>'.
    stream_id            text PRIMARY KEY,
    -- The problem's name (or folder) as the search's spec gave it.
    problem              text NOT NULL,
    -- The problem's family (e.g. 'row-reduction'); the problem itself when it declares none.
    family               text NOT NULL,
    -- The resolved target (e.g. 'cpu-x86_64-avx512'); the spec's target until target_resolved arrives.
    target               text NOT NULL,
    -- Hash of the problem folder's files: evidence is reusable only under the same definition.
    problem_fingerprint  text NOT NULL DEFAULT ''
);

-- Candidates as proposed in each search, with the changes they carry and the ones they introduced
-- relative to their parent.
CREATE TABLE lesson_candidates (
    -- The search's event stream.
    stream_id      text NOT NULL,
    -- The candidate's content hash.
    candidate_id   text NOT NULL,
    -- Its parent in that search (usually the incumbent when it was proposed), or NULL.
    parent_id      text,
    -- Template parameter values that produced it.
    params         jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- Every change it carries: its tags and its parameter values as 'NAME=value', sorted.
    changes        text[] NOT NULL DEFAULT '{}',
    -- The changes that differ from its parent (all of them when the parent has no parameters).
    introduced     text[] NOT NULL DEFAULT '{}',
    -- Position of the candidate.proposed event.
    position       bigint NOT NULL,
    PRIMARY KEY (stream_id, candidate_id)
);

CREATE INDEX lesson_candidates_by_id ON lesson_candidates (candidate_id, position);

-- Per (family, problem, target, change) statistics. change '*' holds every candidate of the problem.
-- A compile or validation outcome counts once per candidate, target and problem definition (a reused
-- or repeated outcome is the same fact); every benchmark counts, as each is a new measurement.
CREATE TABLE lesson_stats (
    -- The problem's family.
    family               text NOT NULL,
    -- The problem.
    problem              text NOT NULL,
    -- The resolved target.
    target               text NOT NULL,
    -- A tag ('online-softmax', 'seed') or a parameter value ('UNROLL=8'); '*' for all candidates.
    change               text NOT NULL,
    -- Distinct candidates carrying the change whose compile outcome is recorded.
    attempts             integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- Of those, how many compiled.
    compiled             integer NOT NULL DEFAULT 0 CHECK (compiled >= 0),
    -- Distinct candidates carrying the change whose validation outcome is recorded.
    validated            integer NOT NULL DEFAULT 0 CHECK (validated >= 0),
    -- Of those, how many were correct.
    correct              integer NOT NULL DEFAULT 0 CHECK (correct >= 0),
    -- Benchmarks against a parent of candidates that introduced the change.
    versus_parent        integer NOT NULL DEFAULT 0 CHECK (versus_parent >= 0),
    -- Of those, how many were faster than the parent with confidence (interval's lower end above 1).
    beats_parent         integer NOT NULL DEFAULT 0 CHECK (beats_parent >= 0),
    -- ln(speedup over the parent) of the most recent benchmarks of candidates that introduced the change,
    -- oldest first (bounded, see LESSON_SAMPLES in engine/lessons_projection.py).
    log_ratio_samples    double precision[] NOT NULL DEFAULT '{}',
    -- ln(speedup over the numpy baseline) of the most recent benchmarks of candidates carrying the change,
    -- oldest first (bounded the same way).
    log_speedup_samples  double precision[] NOT NULL DEFAULT '{}',
    -- Position of the last event that changed this row.
    last_position        bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (family, problem, target, change)
);

CREATE INDEX lesson_stats_by_target ON lesson_stats (target, family);

-- How candidates carrying a change failed: compile error categories, failing validation checks and
-- shapes, benchmark verdicts that did not count.
CREATE TABLE lesson_failures (
    -- The problem's family.
    family         text NOT NULL,
    -- The problem.
    problem        text NOT NULL,
    -- The resolved target.
    target         text NOT NULL,
    -- The change ('*' for all candidates).
    change         text NOT NULL,
    -- compile, validation or benchmark.
    kind           text NOT NULL CHECK (kind IN ('compile', 'validation', 'benchmark')),
    -- The pattern: a compile error category ('undeclared'), a failing check at a shape
    -- ('incorrect: output at cols=1 rows=1'), a benchmark verdict.
    pattern        text NOT NULL,
    -- How many distinct failures showed it.
    count          integer NOT NULL DEFAULT 0 CHECK (count >= 0),
    -- The most recent failure's one-line message.
    example        text NOT NULL DEFAULT '',
    -- Position of the last event that changed this row.
    last_position  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (family, problem, target, change, kind, pattern)
);

-- The first recorded compile and validation outcome of each candidate on each target, under each
-- problem definition: a later search reuses these instead of compiling and validating again.
CREATE TABLE candidate_evidence (
    -- The candidate's content hash (source and flags).
    candidate_id          text NOT NULL,
    -- The resolved target.
    target                text NOT NULL,
    -- Hash of the problem folder's files under which the outcome was judged.
    problem_fingerprint   text NOT NULL,
    -- The problem.
    problem               text NOT NULL,
    -- Stream of the search that recorded the compile outcome.
    stream_id             text NOT NULL,
    -- Verdict of the compile step: ok or compile_error.
    compile_verdict       text,
    -- The artifact built (content hash), when it compiled.
    artifact_id           text,
    -- One line: the first compile error or the artifact.
    compile_summary       text NOT NULL DEFAULT '',
    -- Event id of the original compile outcome.
    compile_event_id      text,
    -- Its position in the log.
    compile_position      bigint,
    -- Verdict of the validation step (ok, incorrect, crash, timeout, resource_limit).
    validation_verdict    text,
    -- The artifact that was validated.
    validated_artifact_id text,
    -- One line: the first failing case or the number of trials.
    validation_summary    text NOT NULL DEFAULT '',
    -- Event id of the original validation outcome.
    validation_event_id   text,
    -- Its position in the log.
    validation_position   bigint,
    PRIMARY KEY (candidate_id, target, problem_fingerprint)
);
