-- A re-measurement (candidate.remeasured: a shaky reading re-measured before it steers the search, or a
-- promotion's confirmation) is another reading of the setting: the lessons projection now folds it into the
-- setting's and its changes' speedup samples (issue 12 item 4). Rows folded before this migration lack the
-- re-measurements already in the log: refold the whole log (as 0004 and 0008 did), losing nothing.
TRUNCATE lesson_searches, lesson_candidates, lesson_stats, lesson_failures, candidate_evidence, lesson_settings;
DELETE FROM projection_checkpoints WHERE name = 'lessons';
