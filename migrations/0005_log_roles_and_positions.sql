-- Who may do what to the evidence log, and positions that remember the highest one committed.
--
-- Two roles (README, "The event log"):
--   * the owner: the role that runs the migrations (kf_owner in the embedded and docker-compose setups). It
--     owns every table, trigger and function here, so only it can change them;
--   * kf_app: what the application (workers, the CLI) connects as, directly or as a member. On the log it
--     may only INSERT and SELECT; on the projections' own tables, what a projection does to its view.
-- The owner can still rewrite the log (switch the append-only trigger off, change rows, recompute hashes,
-- set the counters back). Nothing inside one database can stop its owner; what catches the owner is a
-- witness outside it: each search's Temporal history records its stream's head, and `kf audit SEARCH_ID`
-- cross-checks the two.

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'kf_app') THEN
        -- NOLOGIN: it only holds the privileges. The setup (kf up, or the database's administrator) creates
        -- it with LOGIN beforehand, or grants it to the login role the application uses.
        CREATE ROLE kf_app NOLOGIN;
    END IF;
EXCEPTION
    -- Roles belong to the whole server: the migration of another database may have created it meanwhile.
    WHEN duplicate_object OR unique_violation THEN NULL;
    WHEN insufficient_privilege THEN
        RAISE EXCEPTION 'role kf_app does not exist and % may not create it', current_user
            USING HINT = 'Create it as an administrator first (CREATE ROLE kf_app LOGIN PASSWORD ...), or give '
                         'the owner CREATEROLE; see README, "The event log".';
END;
$$;

-- Why two counters. Positions come from a sequence, so a position once issued is never issued again: when
-- the log's last event is removed, the next append does not quietly take its number (max(position) + 1 did).
-- But a sequence is not transactional: an append that rolls back (a refused payload, a lost connection)
-- has used its numbers anyway. Left as they are, those holes would look exactly like removed events.
--
-- event_log_head is transactional: the insert trigger advances it in the appending transaction, so it
-- holds the highest position ever COMMITTED, and a rollback takes it back. Appends are serialised by the
-- append lock, so when the next append holds the lock, nobody else is between allocating and committing:
-- a sequence ahead of the head can only mean numbers issued to appends that rolled back (or skipped by a
-- server crash, which pre-allocates sequence values). That append sets the sequence back to the head and
-- reuses them: positions stay gap-free. Removed events cannot pass for a rollback: removing rows does not
-- move the head, so the audit (EventStore.positions) finds every stored hole below it, and a missing tail
-- as stored max(position) < head. Only an owner who also sets back both counters could hide a removed
-- tail from this check, which is why the witness outside the database exists.
CREATE SEQUENCE events_position AS bigint MINVALUE 1 CACHE 1 NO CYCLE;

CREATE TABLE event_log_head (
    -- Always true: the table holds exactly one row.
    only_row  boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    -- Highest position committed to the log; 0 for an empty log. Only ever grows.
    position  bigint  NOT NULL CHECK (position >= 0)
);

COMMENT ON TABLE event_log_head IS 'Highest position committed to the events log (see migrations/0005).';

INSERT INTO event_log_head (position) SELECT coalesce(max(position), 0) FROM events;
-- is_called = false: the next nextval() returns max + 1.
SELECT setval('events_position', coalesce(max(position), 0) + 1, false) FROM events;

CREATE OR REPLACE FUNCTION events_before_insert() RETURNS trigger
LANGUAGE plpgsql
-- Runs as the owner: the application may neither take numbers from the sequence nor move the head by
-- itself (kf_app has no privilege on either beyond reading them); only appending an event does.
SECURITY DEFINER
-- See 0001: PL/pgSQL keeps its plans for the session; every lookup here is meant to be an index probe.
SET enable_seqscan = off
AS $$
DECLARE
    previous text;
    committed bigint;
    issued bigint;
BEGIN
    -- The append lock of 0001 (shared with engine/evidence/store.py), taken before a position is chosen:
    -- positions become visible strictly in order, and while it is held no other append is in flight.
    PERFORM pg_advisory_xact_lock(7171001);
    SELECT h.position INTO committed FROM event_log_head h WHERE h.only_row;
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END INTO issued FROM events_position s;
    IF issued <> committed THEN
        -- Ahead: issued to appends that rolled back (see above); reuse them, so positions stay gap-free.
        -- Behind: set back by hand; never hand out a committed number again.
        PERFORM setval('events_position', committed + 1, false);
    END IF;
    -- Whatever the writer sent for these columns is replaced: the database is the only authority.
    NEW.position := nextval('events_position');
    UPDATE event_log_head SET position = NEW.position WHERE only_row;
    NEW.recorded_at := clock_timestamp();
    IF NEW.stream_version = 1 THEN
        NEW.prev_hash := repeat('0', 64);
    ELSE
        SELECT e.hash INTO previous
        FROM events e
        WHERE e.stream_id = NEW.stream_id AND e.stream_version = NEW.stream_version - 1;
        IF previous IS NULL THEN
            RAISE EXCEPTION 'stream % has no version %, so version % cannot be appended',
                NEW.stream_id, NEW.stream_version - 1, NEW.stream_version
                USING ERRCODE = 'KF001', HINT = 'Stream versions are contiguous: append version n+1 after n.';
        END IF;
        NEW.prev_hash := previous;
    END IF;
    IF octet_length(NEW.payload::text) > kf_max_payload_bytes() THEN
        RAISE EXCEPTION 'payload of event % is % bytes of JSON, over the limit of % bytes',
            quote_literal(NEW.event_id), octet_length(NEW.payload::text), kf_max_payload_bytes()
            USING ERRCODE = 'KF002',
                  HINT = 'Store bulk content content-addressed and put its hash in the event.';
    END IF;
    IF octet_length(NEW.metadata::text) > kf_max_payload_bytes() THEN
        RAISE EXCEPTION 'metadata of event % is % bytes of JSON, over the limit of % bytes',
            quote_literal(NEW.event_id), octet_length(NEW.metadata::text), kf_max_payload_bytes()
            USING ERRCODE = 'KF002', HINT = 'Metadata says who wrote an event; keep it small.';
    END IF;
    NEW.hash := kf_event_hash(NEW.position, NEW.event_id, NEW.stream_id, NEW.stream_version, NEW.type,
        NEW.schema_version, NEW.payload, NEW.metadata, NEW.recorded_at, NEW.prev_hash);
    RETURN NEW;
END;
$$;

-- Why a fixed search_path: a function that runs as its owner must not resolve names through the caller's
-- path. Any role may create temporary tables, and pg_temp is searched first unless it is named: a caller's
-- temporary "events" would otherwise supply the previous hash. This schema first, pg_temp last.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION events_before_insert() SET search_path = %I, pg_temp', current_schema());
END;
$$;

-- One refusal for every append-only table (0001 named only events in its message).
CREATE OR REPLACE FUNCTION events_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% on % is refused: the event log is append-only', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'KF003',
              HINT = 'Record a correction as a new event instead of changing or removing old ones.';
END;
$$;

CREATE FUNCTION event_log_head_only_grows() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.position < OLD.position THEN
        RAISE EXCEPTION 'the committed head of the event log cannot move back from % to %', OLD.position, NEW.position
            USING ERRCODE = 'KF003', HINT = 'Positions once committed stay committed: the log is append-only.';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER event_log_head_append_only
    BEFORE INSERT OR DELETE OR TRUNCATE ON event_log_head
    FOR EACH STATEMENT EXECUTE FUNCTION events_refuse_change();
CREATE TRIGGER event_log_head_only_grows
    BEFORE UPDATE ON event_log_head
    FOR EACH ROW EXECUTE FUNCTION event_log_head_only_grows();
-- As for events (0001): the refusals also hold under session_replication_role = replica.
ALTER TABLE event_log_head ENABLE ALWAYS TRIGGER event_log_head_append_only;
ALTER TABLE event_log_head ENABLE ALWAYS TRIGGER event_log_head_only_grows;

-- The application's privileges. Nothing is granted to PUBLIC on these tables; say so anyway.
REVOKE ALL ON events, event_log_head FROM PUBLIC;
REVOKE ALL ON SEQUENCE events_position FROM PUBLIC;
GRANT SELECT, INSERT ON events TO kf_app;
-- Reading the counters is how the audit finds a missing tail; moving them is the insert trigger's alone.
GRANT SELECT ON event_log_head TO kf_app;
GRANT SELECT ON SEQUENCE events_position TO kf_app;
-- Projections own their views: they insert, update, and empty them to rebuild from position 0.
GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE
    ON projection_checkpoints, lesson_searches, lesson_candidates, lesson_stats, lesson_failures,
       candidate_evidence, lesson_settings
    TO kf_app;
GRANT SELECT ON schema_migrations TO kf_app;
-- Tables later migrations create: readable and appendable by the application, nothing more. A migration
-- whose table the application must also update or empty grants that itself.
ALTER DEFAULT PRIVILEGES GRANT SELECT, INSERT ON TABLES TO kf_app;
