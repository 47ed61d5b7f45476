-- The evidence log: one append-only table of events, hash-chained per stream.
--
-- Everything that makes the log trustworthy is enforced here, in the database, so it holds for every
-- writer (the Python store, psql, a future service in another language), not by convention:
--   * positions are assigned in commit order with no gaps a reader could ever observe;
--   * stream versions are contiguous (version n needs version n-1 of the same stream);
--   * the hash chain is computed by the database over its own canonical text of each event;
--   * UPDATE, DELETE and TRUNCATE are refused.

CREATE TABLE events (
    -- Global position: 1, 2, 3, ... in the order appends commit. Assigned by events_before_insert.
    position        bigint      PRIMARY KEY,
    -- The writer's idempotency key: appending the same id again returns the stored event.
    event_id        text        NOT NULL UNIQUE CHECK (event_id <> ''),
    -- The stream (aggregate) the event belongs to. "C" collation so prefix searches use the index.
    stream_id       text        COLLATE "C" NOT NULL CHECK (stream_id <> ''),
    -- 1-based, contiguous version of the event within its stream.
    stream_version  integer     NOT NULL CHECK (stream_version >= 1),
    -- Registered event type name, e.g. 'candidate.compiled'.
    type            text        NOT NULL CHECK (type <> ''),
    -- Version of the payload's schema for this type, for upcasting old events.
    schema_version  integer     NOT NULL DEFAULT 1 CHECK (schema_version >= 1),
    -- The fact itself.
    payload         jsonb       NOT NULL,
    -- Who wrote it: workflow id, run id, activity id, attempt, worker, hardware, code version.
    metadata        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- When the append took the log's write lock (so it grows with position).
    recorded_at     timestamptz NOT NULL,
    -- Hash of the previous event of the stream; 64 zeros for a stream's first event.
    prev_hash       text        NOT NULL,
    -- sha-256 (hex) of this event's canonical text, which includes prev_hash: the chain link.
    hash            text        NOT NULL,
    UNIQUE (stream_id, stream_version)
);

COMMENT ON TABLE events IS 'Append-only, hash-chained evidence log of Kernel Factory (see migrations/0001).';

-- The one definition of an event's hash, used by the insert trigger and by EventStore.verify().
-- The canonical text is a JSON array built by jsonb: jsonb normalises its text form (key order, no
-- duplicate keys, fixed spacing), so the same stored event always hashes the same way, whatever text
-- the writer sent. recorded_at enters as seconds since the epoch, which no session time zone changes.
CREATE FUNCTION kf_event_hash(
    p_position bigint,
    p_event_id text,
    p_stream_id text,
    p_stream_version integer,
    p_type text,
    p_schema_version integer,
    p_payload jsonb,
    p_metadata jsonb,
    p_recorded_at timestamptz,
    p_prev_hash text
) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
RETURN encode(sha256(convert_to(jsonb_build_array(
    p_prev_hash, p_position, p_event_id, p_stream_id, p_stream_version, p_type, p_schema_version,
    extract(epoch FROM p_recorded_at), p_payload, p_metadata
)::text, 'UTF8')), 'hex');

-- Largest payload (and metadata) the log accepts, as bytes of its jsonb text. Bulk content (sources, binaries, logs,
-- raw samples) is stored content-addressed and only its hash goes into an event.
CREATE FUNCTION kf_max_payload_bytes() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 1048576;

CREATE FUNCTION events_before_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    previous text;
BEGIN
    -- Why a lock: a position taken from a sequence is allocated when the INSERT runs, but becomes
    -- visible when the transaction commits. Two writers can take 7 and 8 and commit 8 first; a reader
    -- tailing "position > 6" then sees 8, moves its cursor to 8 and never sees 7. Taking one
    -- transaction-level advisory lock before a position is chosen serialises appends: the next writer
    -- cannot choose a position until this transaction has committed (or rolled back), so positions
    -- become visible strictly in order and are contiguous (max + 1, no sequence holes on rollback).
    -- The price is one writer at a time; batches keep that cheap. The lock is re-entrant, so taking it
    -- once per row costs nothing after the first. The key is shared with engine/eventstore.py.
    PERFORM pg_advisory_xact_lock(7171001);
    -- Whatever the writer sent for these columns is replaced: the database is the only authority.
    SELECT coalesce(max(e.position), 0) + 1 INTO NEW.position FROM events e;
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

-- Why enable_seqscan = off: PL/pgSQL plans the queries above once per session and keeps the plan. A
-- session that starts on a small table would keep a sequential-scan plan while the table grows, and
-- every append would then read the whole log. Both lookups are meant to be single index probes.
ALTER FUNCTION events_before_insert() SET enable_seqscan = off;

CREATE TRIGGER events_before_insert
    BEFORE INSERT ON events
    FOR EACH ROW EXECUTE FUNCTION events_before_insert();

-- Readers tail by position; NOTIFY only wakes them up (they re-read by position), so one notification
-- per statement, without a payload, is enough. It is delivered when the transaction commits.
CREATE FUNCTION events_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('kf_events', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER events_notify
    AFTER INSERT ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_notify();

CREATE FUNCTION events_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% on events is refused: the event log is append-only', TG_OP
        USING ERRCODE = 'KF003',
              HINT = 'Record a correction as a new event instead of changing or removing old ones.';
END;
$$;

-- Statement-level, so even an UPDATE or DELETE that matches no row is refused.
CREATE TRIGGER events_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_refuse_change();

-- ENABLE ALWAYS: the refusal also holds under session_replication_role = replica, which otherwise
-- silences triggers. Only an owner who explicitly disables the trigger can change rows, and verify()
-- then finds the change.
ALTER TABLE events ENABLE ALWAYS TRIGGER events_append_only;
