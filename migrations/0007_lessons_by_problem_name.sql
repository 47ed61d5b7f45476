-- Lessons are keyed by the problem's NAME (problem.py's NAME, or its folder's name), never by the path a
-- search was started with: `kf search start ./my/rmsnorm_fused` and `kf search start rmsnorm_fused` teach
-- the same problem, and `kf lessons --problem rmsnorm_fused` finds both. search.started now records
-- problem_name; older events are mapped by loading the problem they name.
--
-- The view is a projection of the log, so it is emptied and its checkpoint reset: the next read folds
-- the whole log again under the new key (engine/evidence/lessons_projection.py), losing nothing.

TRUNCATE lesson_searches, lesson_candidates, lesson_stats, lesson_failures, candidate_evidence, lesson_settings;
UPDATE projection_checkpoints SET position = 0, updated_at = now() WHERE name = 'lessons';
