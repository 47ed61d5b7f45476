-- Each measured template setting keeps the measurement method of its readings (engine/harness/verdicts.py
-- CPU_MEASUREMENT_METHOD): readings of different methods are not comparable, so a reading taken by a newer
-- method replaces the setting's older ones and an older method's reading is not folded into a newer row.
-- Every reading already folded was taken before outcomes named their method (LEGACY_METHOD, 1), so the
-- default is right for every existing row and nothing needs refolding.
ALTER TABLE lesson_settings ADD COLUMN method integer NOT NULL DEFAULT 1;
