"""SearchSpec: everything a user can ask of a search. Every field but ``problem`` has a default, so the
single JSON ``{"problem": "softmax"}`` typed into the Temporal UI is a complete search.

Every field is bounded here, once: `kf search start` and a payload typed into the Temporal UI are validated
by these models, so both refuse the same values with the same message (engine/input_errors.py). Numbers
must be finite (an infinite wall-time budget once overflowed every workflow task, forever), integers must
be integers (JSON ``true`` or ``"3"`` is not a generation count) and text is length-limited (everything
here travels in Temporal payloads and LLM prompts).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

ProposerKind = Literal["random", "search", "gp", "llm", "mixed"]

MAX_THREADS = 1024
"""Most cores one kernel may use (a fixed cap: the spec is checked before any worker is known; `kf evaluate`
also checks the CPUs of its own machine)."""
MAX_BENCHMARK_SECONDS = 600.0
"""Most seconds of timing for one candidate's benchmark (also `kf evaluate --budget`)."""
MAX_WALL_MINUTES = 7 * 24 * 60
"""Longest wall-time budget: a week (the workflow itself times out after 30 days)."""
MAX_CANDIDATES = 100_000
"""Most candidates one search's budget may allow."""
MAX_LLM_USD = 10_000.0
"""Largest LLM spending limit one search's budget may set, in US dollars."""
MAX_SEED = 2**32 - 1
"""Largest proposer seed (numpy seeds are non-negative; 32 bits also stay exact in the UI's JavaScript)."""
MAX_HINTS = 100
"""Most human hints one search holds (`add_hint` refuses more): all of them go into every LLM prompt."""
MAX_HINT_CHARS = 1000
"""Longest hint, in characters."""
MAX_FLAGS = 64
"""Most compiler flags per candidate."""
MAX_FLAG_CHARS = 256
"""Longest compiler flag, in characters."""
MAX_MODELS = 16
"""Most LLM model names per search."""
MAX_NAME_CHARS = 255
"""Longest model name."""
MAX_PROBLEM_CHARS = 4096
"""Longest problem name or folder path: Linux's PATH_MAX. A path under it with a component over NAME_MAX is
refused by the problem loader, which names the component."""
MAX_SEARCH_ID_CHARS = 1000
"""Longest search id: Temporal's default limit on a workflow id."""

Hint = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_HINT_CHARS)]
"""A human hint for the proposers: non-empty text of at most `MAX_HINT_CHARS` characters."""
CompilerFlag = Annotated[str, StringConstraints(min_length=1, max_length=MAX_FLAG_CHARS)]
"""One compiler flag (which flags are allowed is the backend's allow-list, checked at compile time)."""
CompilerFlags = Annotated[list[CompilerFlag], Field(max_length=MAX_FLAGS)]
"""A candidate's compiler flags."""
ModelName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS)]
"""A litellm model name, e.g. `openai/gpt-4o`."""
ProblemName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PROBLEM_CHARS)]
"""A built-in problem name or a problem folder."""
# Searches started from the Temporal UI may carry any id the user typed there, so this only refuses what no
# workflow id should hold (control characters) and what Temporal itself would refuse (length).
SearchId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_SEARCH_ID_CHARS, pattern=r"^[^\x00-\x1f\x7f]+$"),
    Field(description="without control characters"),
]
"""The id of a search (its workflow id): 1 to 1000 characters, no control characters."""

_TARGET_SHAPE = re.compile(r"cpu|(cpu|cuda)-[A-Za-z0-9_.-]+")


def known_target_shape(value: str) -> str:
    """``value`` if it is shaped like a target; ValueError naming the shapes there are otherwise."""
    if not _TARGET_SHAPE.fullmatch(value):
        raise ValueError(f"target {value!r} is not `cpu`, `cpu-<arch>-<isa>` or `cuda-sm<NN>`")
    return value


Target = Annotated[str, StringConstraints(max_length=64), AfterValidator(known_target_shape)]
"""Hardware to search on: `cpu`, `cpu-<arch>-<isa>` or `cuda-sm<NN>`."""


class ProposerSettings(BaseModel):
    """Which agents propose candidates, and with which models."""

    model_config = ConfigDict(extra="forbid")

    kind: ProposerKind = "gp"
    """`gp` (the offline default): explores the template space with a Gaussian process over its settings, lessons
    as its evidence; `search`: the same loop with a Bayesian linear model of effects per value and pair (the
    default before gp, which scores higher on the replayed landscapes of six of the eight built-in problems);
    `random`: uniform draws from it (the control); `llm`: LLM roles through litellm; `mixed`: both in one
    generation."""
    models: list[ModelName] = Field(default_factory=list, max_length=MAX_MODELS)
    """litellm model names for LLM proposers (e.g. `openai/gpt-4o`); empty means `KF_MODELS`."""


class Budget(BaseModel):
    """Limits that stop a search before its generations are used up. `None` means no limit."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_candidates: int | None = Field(default=None, ge=1, le=MAX_CANDIDATES, strict=True)
    """Most candidates evaluated (the seed kernel counts; a duplicate never does)."""
    max_wall_minutes: float | None = Field(default=None, gt=0, le=MAX_WALL_MINUTES, strict=True)
    """Most minutes of wall time since the search started, measured by the workflow's clock."""
    max_llm_usd: float | None = Field(default=None, ge=0, le=MAX_LLM_USD, strict=True)
    """Most US dollars spent on LLM calls, counting spent plus in-flight calls."""


class PromotionPolicy(BaseModel):
    """When a candidate replaces the incumbent."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    margin: float = Field(default=0.02, ge=0, le=1, strict=True)
    """Required speedup over the incumbent beyond 1.0: 0.02 asks for the interval to clear 1.02."""
    confidence: float = Field(default=0.95, gt=0.5, lt=1, strict=True)
    """Confidence level of the interval on the speedup ratio whose lower end must clear the margin."""
    confirm_halfwidth: float = Field(default=0.05, ge=0, le=1, strict=True)
    """A promotion whose reading is shaky -- the interval of its ratio over the incumbent is wider than this
    (relative half-width), or its timing shared its cores with other work -- is re-measured against the
    incumbent with the playoff's larger budget first, and promotes only if the re-measurement clears the
    margin too. 0 re-measures every promotion; 1 only those timed on shared cores."""
    steering_remeasures: int = Field(default=1, ge=0, le=256, strict=True)
    """How many of a generation's shaky readings (as confirm_halfwidth defines them; fastest first) are
    re-measured against the incumbent with the playoff's larger budget before anything uses them: the
    generation's promotion and, through the lessons (which fold a re-measurement as another reading of the
    setting), the next proposal. One load spike then neither lures the search nor promotes. 0: none (a
    shaky promotion is still confirmed)."""


class SearchSpec(BaseModel):
    """A search for a faster kernel for one problem on one target."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    problem: ProblemName
    """A built-in problem name (softmax, rmsnorm, …) or the path of a problem folder on the workers."""
    target: Target = "cpu"
    """Hardware to search on: `cpu` (resolved to a worker's ISA), `cpu-x86_64-avx512`, `cuda-sm90`, …"""
    generations: int = Field(default=3, ge=1, le=10_000, strict=True)
    """Generations to run after the seed kernel (generation 0) has been evaluated."""
    candidates_per_generation: int = Field(default=4, ge=1, le=256, strict=True)
    """Candidates proposed per generation."""
    parallelism: int = Field(default=2, ge=1, le=64, strict=True)
    """Candidates of one generation evaluated at once."""
    proposer: ProposerSettings = Field(default_factory=ProposerSettings)
    """Which agents propose."""
    budget: Budget = Field(default_factory=Budget)
    """Limits beyond the number of generations."""
    promotion: PromotionPolicy = Field(default_factory=PromotionPolicy)
    """When a candidate becomes the incumbent."""
    flags: CompilerFlags | None = None
    """Compiler flags for every candidate; `None` uses the backend's defaults."""
    threads: int = Field(default=1, ge=1, le=MAX_THREADS, strict=True)
    """Cores a kernel may use while validated and timed."""
    benchmark_seconds: float = Field(default=1.0, gt=0, le=MAX_BENCHMARK_SECONDS, strict=True)
    """Timing budget of one candidate's benchmark, across its shapes. The timing itself has a minimum: every
    shape times at least 10 rounds of batches lasting at least 100 handshakes (or 1 ms) of the fastest
    contender, so a short budget is exceeded (at 0.2 s, softmax's three shapes time for about 2.7 s on the
    2-core development machine); starting the sandboxes, the input pools and the revalidation come on top."""
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED, strict=True)
    """Seeds the proposers' randomness: the same spec and evidence propose the same candidates. None (the
    default): the search draws a fresh one when it starts and records it in search.started, so two cold
    searches of a problem explore differently and either can be repeated exactly by giving its seed."""
    resume_from: SearchId | None = None
    """An earlier search id: start from its incumbent and skip what it already evaluated."""
    resume_latest: bool = Field(default=False, strict=True)
    """Start from the newest incumbent any earlier search of this `problem` on this `target` (both as written in
    the spec) recorded, and skip what that search evaluated, as `resume_from` would; with none recorded yet, a
    cold start from the seed kernel. What `kf schedule create` sets, so each run warm-starts from the last."""
    resume_best: bool = Field(default=False, strict=True)
    """Start from the fastest incumbent (by its recorded speedup over numpy) any earlier search of this
    `problem` on this `target` (both as written) recorded, and skip what that search evaluated, as
    `resume_from` would; with none recorded yet, a cold start from the seed kernel. A warm search that builds
    on the best known kernel instead of re-finding it."""
    hints: list[Hint] = Field(default_factory=list, max_length=MAX_HINTS)
    """Human hints that proposers see."""
    worker_wait_seconds: int = Field(default=120, ge=1, le=86_400, strict=True)
    """How long to wait for a worker serving the target before failing the search."""
    heartbeat_seconds: int = Field(default=30, ge=2, le=3600, strict=True)
    """How soon a silent (killed) worker's step is retried elsewhere."""
    continue_as_new_every: int | None = Field(default=None, ge=1, le=10_000, strict=True)
    """Generations per workflow run before continuing as new (Temporal's suggestion applies anyway)."""
    task_queue_prefix: str = Field(
        default="kf",
        max_length=64,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="of letters, digits, '_', '.' and '-'",
    )
    """Prefix of the task queues (`kf-control`, `kf-cpu-…`); tests isolate themselves with their own."""

    @model_validator(mode="after")
    def _one_resume(self) -> SearchSpec:
        # Two starting points would leave the seed of generation 0 to chance: say which one is meant.
        named = [
            name
            for name, given in (
                ("resume_from", self.resume_from is not None),
                ("resume_latest", self.resume_latest),
                ("resume_best", self.resume_best),
            )
            if given
        ]
        if len(named) > 1:
            raise ValueError(f"{' and '.join(named)} exclude each other: name one starting point, or none")
        return self


def check_hint(text: object, hints_so_far: int = 0) -> str:
    """The hint as proposers will see it (stripped). ValueError naming the bound when ``text`` is not
    non-empty text of at most `MAX_HINT_CHARS` characters, or the search already holds `MAX_HINTS` hints:
    `add_hint` checks here, so a search never holds a hint list its own spec would refuse."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a hint must be non-empty text")
    if len(text.strip()) > MAX_HINT_CHARS:
        raise ValueError(f"a hint is at most {MAX_HINT_CHARS} characters (this one has {len(text.strip())})")
    if hints_so_far >= MAX_HINTS:
        raise ValueError(f"a search holds at most {MAX_HINTS} hints and this one has {hints_so_far}")
    return text.strip()


def control_queue(prefix: str = "kf") -> str:
    """The task queue of workflows and of activities that touch no kernel hardware."""
    return f"{prefix}-control"


def target_queue(prefix: str, target: str) -> str:
    """The task queue of a target's hardware: `kf-cpu` (any CPU worker) or `kf-cpu-x86_64-avx512`, …"""
    return f"{prefix}-{target}"


def build_queue(prefix: str = "kf") -> str:
    """The task queue of builds any worker can do, GPU or not: CUDA compiles (NVRTC needs no GPU)."""
    return f"{prefix}-build"


def compile_queue(prefix: str, target: str) -> str:
    """Where a candidate for ``target`` is compiled: a CUDA source on the build queue every worker polls (its GPU
    workers stay free for validation and timing), a C source on its target's queue (it is built for that ISA)."""
    return build_queue(prefix) if target.startswith("cuda-") else target_queue(prefix, target)
