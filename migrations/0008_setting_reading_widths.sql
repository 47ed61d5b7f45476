-- Each measured template setting also keeps how wide each of its readings was: the half-width, in ln, of
-- the benchmark's interval on the speedup over numpy (NaN when the benchmark gave none), widened to at least
-- BUSY_READING_HALFWIDTH (engine/evidence/lessons_projection.py) when its timing shared its cores with
-- other work. The search proposer's model counts a wide or busy reading for less, so one reading taken
-- during a load spike does not steer a search (issue 12 item 4). Aligned with log_speedup_samples: the
-- i-th width belongs to the i-th speedup.
ALTER TABLE lesson_settings ADD COLUMN log_halfwidth_samples double precision[] NOT NULL DEFAULT '{}';

-- Rows folded before this migration have no widths: refold the whole log (as 0004 did), losing nothing.
TRUNCATE lesson_searches, lesson_candidates, lesson_stats, lesson_failures, candidate_evidence, lesson_settings;
DELETE FROM projection_checkpoints WHERE name = 'lessons';
