"""SearchSpec: everything a user can ask of a search. Every field but ``problem`` has a default, so the
single JSON ``{"problem": "softmax"}`` typed into the Temporal UI is a complete search.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ProposerKind = Literal["random", "search", "llm", "mixed"]


class ProposerSettings(BaseModel):
    """Which agents propose candidates, and with which models."""

    model_config = ConfigDict(extra="forbid")

    kind: ProposerKind = "search"
    """`search` (the offline default): explores the template space with lessons as priors; `random`: uniform
    draws from it (the control); `llm`: LLM roles through litellm; `mixed`: both in one generation."""
    models: list[str] = Field(default_factory=list)
    """litellm model names for LLM proposers (e.g. `openai/gpt-4o`); empty means `KF_MODELS`."""


class Budget(BaseModel):
    """Limits that stop a search before its generations are used up. `None` means no limit."""

    model_config = ConfigDict(extra="forbid")

    max_candidates: int | None = Field(default=None, ge=1)
    """Most candidates evaluated (the seed kernel counts; a duplicate never does)."""
    max_wall_minutes: float | None = Field(default=None, gt=0)
    """Most minutes of wall time since the search started, measured by the workflow's clock."""
    max_llm_usd: float | None = Field(default=None, ge=0)
    """Most US dollars spent on LLM calls, counting spent plus in-flight calls."""


class PromotionPolicy(BaseModel):
    """When a candidate replaces the incumbent."""

    model_config = ConfigDict(extra="forbid")

    margin: float = Field(default=0.02, ge=0, le=1)
    """Required speedup over the incumbent beyond 1.0: 0.02 asks for the interval to clear 1.02."""
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    """Confidence level of the interval on the speedup ratio whose lower end must clear the margin."""


class SearchSpec(BaseModel):
    """A search for a faster kernel for one problem on one target."""

    model_config = ConfigDict(extra="forbid")

    problem: str = Field(min_length=1)
    """A built-in problem name (softmax, rmsnorm, …) or the path of a problem folder on the workers."""
    target: str = "cpu"
    """Hardware to search on: `cpu` (resolved to a worker's ISA), `cpu-x86_64-avx512`, `cuda-sm90`, …"""
    generations: int = Field(default=3, ge=1, le=10_000)
    """Generations to run after the seed kernel (generation 0) has been evaluated."""
    candidates_per_generation: int = Field(default=4, ge=1, le=256)
    """Candidates proposed per generation."""
    parallelism: int = Field(default=2, ge=1, le=64)
    """Candidates of one generation evaluated at once."""
    proposer: ProposerSettings = Field(default_factory=ProposerSettings)
    """Which agents propose."""
    budget: Budget = Field(default_factory=Budget)
    """Limits beyond the number of generations."""
    promotion: PromotionPolicy = Field(default_factory=PromotionPolicy)
    """When a candidate becomes the incumbent."""
    flags: list[str] | None = None
    """Compiler flags for every candidate; `None` uses the backend's defaults."""
    threads: int = Field(default=1, ge=1, le=1024)
    """Cores a kernel may use while validated and timed."""
    benchmark_seconds: float = Field(default=1.0, gt=0, le=600)
    """Timing budget of one candidate's benchmark, across its shapes."""
    seed: int = 0
    """Seeds the proposers' randomness: the same spec and evidence propose the same candidates."""
    resume_from: str | None = None
    """An earlier search id: start from its incumbent and skip what it already evaluated."""
    hints: list[str] = Field(default_factory=list)
    """Human hints that proposers see."""
    worker_wait_seconds: int = Field(default=120, ge=1, le=86_400)
    """How long to wait for a worker serving the target before failing the search."""
    heartbeat_seconds: int = Field(default=30, ge=2, le=3600)
    """How soon a silent (killed) worker's step is retried elsewhere."""
    continue_as_new_every: int | None = Field(default=None, ge=1)
    """Generations per workflow run before continuing as new (Temporal's suggestion applies anyway)."""
    task_queue_prefix: str = Field(default="kf", pattern=r"^[A-Za-z0-9_.-]+$")
    """Prefix of the task queues (`kf-control`, `kf-cpu-…`); tests isolate themselves with their own."""

    @field_validator("target")
    @classmethod
    def _known_target_shape(cls, value: str) -> str:
        if value != "cpu" and not value.startswith(("cpu-", "cuda-")):
            raise ValueError(f"target {value!r} is not `cpu`, `cpu-<arch>-<isa>` or `cuda-sm<NN>`")
        return value


def control_queue(prefix: str = "kf") -> str:
    """The task queue of workflows and of activities that touch no kernel hardware."""
    return f"{prefix}-control"


def target_queue(prefix: str, target: str) -> str:
    """The task queue of a target's hardware: `kf-cpu` (any CPU worker) or `kf-cpu-x86_64-avx512`, …"""
    return f"{prefix}-{target}"
