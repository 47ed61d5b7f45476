"""Candidates: a kernel source with its flags, identified by content, with its lineage."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, Field


def candidate_id(source: str, flags: list[str] | None) -> str:
    """The content hash that identifies a candidate: the same source and flags are the same candidate."""
    body = json.dumps({"source": source, "flags": flags}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def short_name(label: str, candidate_id: str) -> str:
    """How people see a candidate in one line: its label and the first 12 characters of its id."""
    return f"{label} ({candidate_id[:12]})"


class Candidate(BaseModel):
    """One kernel to evaluate, and where it came from."""

    candidate_id: str
    """sha-256 of the source and flags; the idempotency keys of its steps derive from it."""
    source: str
    """The C (or CUDA) source of the kernel, exporting the problem's entry point."""
    flags: list[str] | None = None
    """Compiler flags; `None` uses the backend's defaults."""
    label: str
    """A short human name: `seed`, `template ONLINE=1 UNROLL=4`, `llm explorer #3`."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Template parameter values that produced the source, if it came from a template."""
    parent_id: str | None = None
    """The candidate this one was derived from (usually the incumbent when it was proposed)."""
    tags: list[str] = Field(default_factory=list)
    """The changes that produced it, e.g. `online-softmax`, `UNROLL=8`, `simd`."""
    proposer: str
    """Which agent proposed it: `seed`, `random`, `search`, `llm:explorer:<model>`, …"""
    rationale: str = ""
    """Why the proposer thought it worth trying."""

    @classmethod
    def create(cls, source: str, flags: list[str] | None = None, **fields: Any) -> Candidate:
        """A candidate whose id is computed from its source and flags."""
        return cls(candidate_id=candidate_id(source, flags), source=source, flags=flags, **fields)
