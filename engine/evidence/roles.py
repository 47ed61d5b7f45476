"""The database roles of the evidence log: who owns it, who appends to it, and whether a role can rewrite it.

- ``kf_owner`` runs the migrations and owns every table, trigger and function of the log.
- ``kf_app`` is what the application (workers, the CLI) connects as: INSERT and SELECT on the log, and what
  projections need on their own tables (migrations/0005_log_roles_and_positions.sql grants exactly that).

An administrator creates both once. The embedded Postgres of ``kf up`` does it with :data:`CREATE_ROLES_SQL`
(run as the superuser initdb made); docker-compose.yml does it in its Postgres init script; on another
server, README ("The event log") shows the statements.
"""

from __future__ import annotations

import asyncpg

OWNER_ROLE = "kf_owner"
"""Runs the migrations and owns the log's objects (KF_DATABASE_OWNER_URL connects as it)."""

APP_ROLE = "kf_app"
"""What the application connects as (KF_DATABASE_URL): may only append to and read the log."""

CREATE_ROLES_SQL = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{OWNER_ROLE}') THEN
        CREATE ROLE {OWNER_ROLE} LOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{APP_ROLE}') THEN
        CREATE ROLE {APP_ROLE} LOGIN;
    ELSE
        -- Migration 0005 creates it NOLOGIN when it finds no such role.
        ALTER ROLE {APP_ROLE} LOGIN;
    END IF;
END;
$$;
-- Since PostgreSQL 15 only the database's owner may create objects in its public schema.
GRANT USAGE, CREATE ON SCHEMA public TO {OWNER_ROLE};
-- Objects that earlier versions created as the superuser (they ran the migrations as it) pass to the owner,
-- so the owner can run the next migrations on them. A sequence that belongs to a table's column moves with
-- its table.
DO $$
DECLARE
    statement text;
BEGIN
    FOR statement IN
        SELECT format('ALTER %s %s OWNER TO {OWNER_ROLE}', CASE c.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END,
                      c.oid::regclass)
        FROM pg_class c
        WHERE c.relnamespace = 'public'::regnamespace
          AND c.relkind IN ('r', 'p', 'S')
          AND c.relowner = (SELECT oid FROM pg_roles WHERE rolname = current_user)
          AND NOT EXISTS (
              SELECT FROM pg_depend d
              WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype IN ('a', 'i')
          )
        UNION ALL
        SELECT format('ALTER FUNCTION %s OWNER TO {OWNER_ROLE}', p.oid::regprocedure)
        FROM pg_proc p
        WHERE p.pronamespace = 'public'::regnamespace
          AND p.proowner = (SELECT oid FROM pg_roles WHERE rolname = current_user)
    LOOP
        EXECUTE statement;
    END LOOP;
END;
$$;
"""
"""Create both roles (LOGIN, no password: for servers that authenticate local connections otherwise, as the
embedded one's Unix socket does) and let the owner create and own the log's objects in the connected
database's public schema. Run as a superuser; safe to repeat."""

_REWRITE_PRIVILEGES = """
SELECT r.rolsuper AS superuser,
       pg_has_role(current_user, c.relowner, 'USAGE') AS owner,
       has_table_privilege(c.oid, 'UPDATE') AS update,
       has_table_privilege(c.oid, 'DELETE') AS delete,
       has_table_privilege(c.oid, 'TRUNCATE') AS truncate
FROM pg_roles AS r, pg_class AS c
WHERE r.rolname = current_user AND c.oid = to_regclass('events')
"""


async def rewrite_privileges(pool: asyncpg.Pool | asyncpg.Connection) -> list[str]:
    """What the connected role holds that could change or remove stored events, in words; empty for a role
    that may only append and read (or a database without the log)."""
    row = await pool.fetchrow(_REWRITE_PRIVILEGES)
    if row is None:
        return []
    held = []
    if row["superuser"]:
        held.append("superuser")
    if row["owner"]:
        held.append("owner of the events table")
    held += [f"{name.upper()} on events" for name in ("update", "delete", "truncate") if row[name]]
    return held


def rewrite_warning(user: str, held: list[str]) -> str:
    """The warning for an application connected as a role that could rewrite the log."""
    return (
        f"the application connects to Postgres as {user!r}, which can rewrite the event log ({', '.join(held)}): "
        f"point KF_DATABASE_URL at a role with only INSERT and SELECT on it ({APP_ROLE}) and "
        "KF_DATABASE_OWNER_URL at the owner that runs migrations (README, 'The event log')"
    )
