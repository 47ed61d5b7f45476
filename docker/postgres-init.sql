-- The event log's two roles and database, created once when the postgres service of docker-compose.yml
-- initialises its data folder (it runs /docker-entrypoint-initdb.d/ as the superuser).
--
--   kf_owner  owns the database and every object of the event log; the one-shot `migrate` service (`kf up`)
--             connects as it (KF_DATABASE_OWNER_URL) to apply the migrations.
--   kf_app    what the workers and the CLI connect as (KF_DATABASE_URL): migrations/0005 lets it INSERT and
--             SELECT on the log, and nothing else there.
--
-- Change both passwords for anything but a demo, and the URLs in docker-compose.yml with them.
CREATE ROLE kf_owner LOGIN PASSWORD 'kf_owner';
CREATE ROLE kf_app LOGIN PASSWORD 'kf_app';
-- The database's owner owns its public schema (PostgreSQL 15+), so kf_owner may create the log there.
CREATE DATABASE kf OWNER kf_owner;
