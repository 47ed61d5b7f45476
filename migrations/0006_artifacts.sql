-- Built artifacts (a CPU backend's shared libraries, a CUDA backend's cubins, ...) as immutable blobs, so that
-- whichever worker validates or benchmarks a candidate can fetch what another worker compiled
-- (engine/evidence/artifacts.py). A worker's local folder of artifacts is only a cache in front of this table.
--
-- As for the event log, what makes a blob trustworthy is enforced here, for every writer:
--   * the digest is the sha-256 of the bytes, checked on insert, so no row can name bytes it does not hold;
--   * an artifact id, once stored, names the same bytes forever: UPDATE, DELETE and TRUNCATE are refused.
-- Readers still recompute the digest of what they fetch: the check above does not protect against a
-- change made with the trigger disabled, nor against corruption on disk or on the wire.

CREATE TABLE artifacts (
    -- The backend's id of the build: a hash of everything that determined it (source, flags, compiler, target).
    artifact_id  text        PRIMARY KEY CHECK (artifact_id <> ''),
    -- What the bytes are, so a worker knows how to load them: 'shared_library', 'cubin', ...
    kind         text        NOT NULL CHECK (kind <> ''),
    -- sha-256 (hex) of data.
    digest       text        NOT NULL CONSTRAINT artifacts_digest_is_sha256_of_data
                                      CHECK (digest = encode(sha256(data), 'hex')),
    -- Length of data in bytes.
    size         bigint      NOT NULL CONSTRAINT artifacts_size_is_length_of_data CHECK (size = octet_length(data)),
    -- The artifact itself.
    data         bytea       NOT NULL,
    -- When the first writer stored it.
    stored_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

COMMENT ON TABLE artifacts IS 'Immutable, content-checked build artifacts of Kernel Factory (see migrations/0006).';

CREATE FUNCTION artifacts_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% on artifacts is refused: a stored artifact is immutable', TG_OP
        USING ERRCODE = 'KF003',
              HINT = 'A different build is a different artifact id; store it under its own id.';
END;
$$;

-- Statement-level, so even an UPDATE or DELETE that matches no row is refused.
CREATE TRIGGER artifacts_immutable
    BEFORE UPDATE OR DELETE OR TRUNCATE ON artifacts
    FOR EACH STATEMENT EXECUTE FUNCTION artifacts_refuse_change();

-- ENABLE ALWAYS: the refusal also holds under session_replication_role = replica, which otherwise silences
-- triggers. Only an owner who explicitly disables the trigger can change a row; a reader then finds bytes that
-- no longer hash to their digest, and the compile outcome in the event log records the digest it stored.
ALTER TABLE artifacts ENABLE ALWAYS TRIGGER artifacts_immutable;

-- The application (kf_app, migrations/0005) may store and fetch artifacts, nothing more; the owner's default
-- privileges would grant the same, but this table's rule is stated where the table is.
REVOKE ALL ON artifacts FROM PUBLIC;
GRANT SELECT, INSERT ON artifacts TO kf_app;
