-- Each measured template setting keeps the machine its readings were taken on (engine/hardware.py
-- machine_key): a warm search skips a setting its evidence settled only when that evidence is from the machine
-- it runs on. Readings folded before outcomes named their machine are of an unknown one (NULL): they still
-- inform the model, and settle nothing until the setting is measured again.
ALTER TABLE lesson_settings ADD COLUMN machine text;
