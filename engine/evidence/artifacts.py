"""The artifact store: built artifacts as immutable blobs in Postgres, so any worker can fetch what another built.

An artifact is bytes of a kind (a CPU backend's ``shared_library``, a CUDA backend's ``cubin``), stored under
its artifact id: the backend's hash of everything that determined the build (engine/harness/cpu.py). The
table (migrations/0006_artifacts.sql) keeps the sha-256 of the bytes, checked by the database on insert, and
refuses UPDATE, DELETE and TRUNCATE: an id, once stored, names the same bytes forever.

- :meth:`ArtifactStore.put` is idempotent and the first writer wins. Two workers that built the same id
  store one blob; when a second build differs byte for byte (a compiler that is not reproducible), put
  returns the stored record, and the caller adopts the stored bytes, so every worker judges and times the
  same binary under one id.
- :meth:`ArtifactStore.get` recomputes the digest of what it read and raises ArtifactCorrupt when the bytes no
  longer match: a fetched artifact is either exactly what was stored or an error, never a wrong binary.

Blobs never travel in Temporal payloads: activities pass artifact ids, and a worker's local folder of
artifacts is a cache in front of this store (activities/search.py fills it on a miss).
"""

from __future__ import annotations

import hashlib
from datetime import datetime

import asyncpg
from pydantic import BaseModel, ConfigDict

from engine.errors import ArtifactConflict, ArtifactCorrupt, MigrationError

__all__ = ["Artifact", "ArtifactStore", "StoredArtifact", "digest_of"]

_COLUMNS = "artifact_id, kind, digest, size, stored_at"


def digest_of(data: bytes) -> str:
    """The sha-256 (hex) of ``data``: the digest the store keeps and checks."""
    return hashlib.sha256(data).hexdigest()


class StoredArtifact(BaseModel):
    """What the store knows about one artifact, without its bytes."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    artifact_id: str
    """The backend's id of the build (a hash of source, flags, compiler, target…)."""
    kind: str
    """What the bytes are, so a worker knows how to load them: ``shared_library``, ``cubin``…"""
    digest: str
    """sha-256 (hex) of the bytes."""
    size: int
    """Length of the bytes."""
    stored_at: datetime
    """When the first writer stored it."""


class Artifact(StoredArtifact):
    """An artifact with its bytes, as fetched (and checked against its digest)."""

    data: bytes
    """The artifact itself."""


class ArtifactStore:
    """Built artifacts in Postgres, on a pool the caller owns (a worker shares its event store's pool)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def check_migrated(self) -> None:
        """Raise MigrationError, saying what to do, when the database has no artifacts table yet."""
        if await self._pool.fetchval("SELECT to_regclass('artifacts') IS NULL"):
            raise MigrationError(
                "the database has no artifacts table (migrations/0006_artifacts.sql): apply the migrations "
                "with `kf db migrate` (or engine.evidence.migrations.migrate(url))"
            )

    async def put(self, artifact_id: str, kind: str, data: bytes) -> StoredArtifact:
        """Store ``data`` as ``artifact_id`` unless the id is stored already; return the stored record.

        The returned digest is the stored one: when it differs from ``data``'s, another build of the same id
        was stored first and is the one every worker uses (fetch it with :meth:`get`). The same id as another
        kind is an ArtifactConflict.
        """
        stored = await self.describe(artifact_id)
        if stored is None:
            # Looked up first so a rebuilt artifact costs a lookup, not its bytes on the wire. Two first
            # writers at once: ON CONFLICT makes the second wait for the first to commit and then do nothing,
            # and the lookup after it (a new statement, a new snapshot) sees the first one's row.
            row = await self._pool.fetchrow(
                f"INSERT INTO artifacts (artifact_id, kind, digest, size, data) VALUES ($1, $2, $3, $4, $5) "
                f"ON CONFLICT (artifact_id) DO NOTHING RETURNING {_COLUMNS}",
                artifact_id,
                kind,
                digest_of(data),
                len(data),
                data,
            )
            stored = StoredArtifact(**row) if row is not None else await self.describe(artifact_id)
            assert stored is not None, "an artifact row is never deleted"
        if stored.kind != kind:
            raise ArtifactConflict(
                f"artifact {artifact_id} is stored as {stored.kind!r}, not {kind!r}: an artifact id names one "
                "build; derive the id from everything that determines the build, the backend included"
            )
        return stored

    async def describe(self, artifact_id: str) -> StoredArtifact | None:
        """The stored record of ``artifact_id`` without its bytes; None when it is not stored."""
        row = await self._pool.fetchrow(f"SELECT {_COLUMNS} FROM artifacts WHERE artifact_id = $1", artifact_id)
        return StoredArtifact(**row) if row is not None else None

    async def get(self, artifact_id: str) -> Artifact | None:
        """``artifact_id`` with its bytes, checked against the stored digest; None when it is not stored.
        Raises ArtifactCorrupt when the bytes no longer hash to the digest (or their stored size)."""
        row = await self._pool.fetchrow(f"SELECT {_COLUMNS}, data FROM artifacts WHERE artifact_id = $1", artifact_id)
        if row is None:
            return None
        data = bytes(row["data"])
        actual = digest_of(data)
        if actual != row["digest"] or len(data) != row["size"]:
            raise ArtifactCorrupt(
                f"artifact {artifact_id} in the store is corrupt: its {len(data)} bytes hash to {actual}, but "
                f"{row['size']} bytes with digest {row['digest']} were stored. It is never loaded: restore the row "
                "(from a backup, or the compiling worker's cache) and find out how it changed, since the table "
                "refuses changes unless its owner disables the artifacts_immutable trigger"
            )
        return Artifact(**{**dict(row), "data": data})
