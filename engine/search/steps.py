"""Inputs and outputs of the search's steps: the messages between the workflow and its activities.

They carry ids, hashes, verdicts and figures; bulky evidence (compiler logs, samples) stays in the event log.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from engine.evidence.events import StreamHead
from engine.search.candidates import Candidate
from engine.search.spec import SearchSpec
from engine.search.state import Incumbent


def step_event_id(search_id: str, generation: int, candidate_id: str, step: str) -> str:
    """The idempotency key of one step's outcome: a retried or replayed step can never write twice."""
    return f"{search_id}/g{generation}/{candidate_id[:24]}/{step}"


def confirmation_event_id(search_id: str, generation: int, candidate_id: str, incumbent_artifact_id: str) -> str:
    """The idempotency key of the re-measurement that confirms (or not) a shaky promotion."""
    return f"{search_id}/g{generation}/{candidate_id[:24]}/remeasured/vs/{incumbent_artifact_id[:24]}"


def playoff_event_id(search_id: str, challenger_id: str, leader_artifact_id: str) -> str:
    """The idempotency key of one round of a search's final playoff (a challenger against the leader)."""
    return f"{search_id}/playoff/{challenger_id[:24]}/vs/{leader_artifact_id[:24]}"


class StartInput(BaseModel):
    """Opens a search's record."""

    search_id: str
    """The search (workflow) id."""
    spec: SearchSpec
    """The validated spec."""
    first_run_id: str | None = None
    """The run id of the search's first workflow run (kept across continue-as-new and retries): recorded with
    search.started, so that another search started later under the same id is told apart and refused. None from a
    workflow that predates it."""


class StartOutput(BaseModel):
    """What the search starts from."""

    problem_fingerprint: str
    """Hash of the problem folder's files, recorded so the evidence says which definition judged it."""
    seed_candidate: Candidate
    """The problem's naive seed kernel, or the resumed search's incumbent."""
    seen: list[str] = Field(default_factory=list)
    """Candidates the resumed search already evaluated; never proposed again."""
    resumed_incumbent: Incumbent | None = None
    """The resumed search's incumbent, as recorded."""
    head: StreamHead | None = None
    """The search's stream after its opening events: the witness the workflow's history keeps."""


class TargetInfo(BaseModel):
    """A worker's answer for a target: its hardware queue and fingerprint."""

    target: str
    """The resolved target, e.g. `cpu-x86_64-avx512`."""
    queue: str
    """The hardware task queue to route steps to."""
    worker: str
    """Identity of the worker that answered."""
    hardware: dict[str, Any]
    """Its hardware fingerprint."""
    machine: str | None = None
    """The machine key of its hardware for the target (engine/hardware.py machine_key); None from a worker that
    predates it. Only readings taken on this machine settle a setting for the search."""
    cpus: int | None = None
    """How many CPUs the answering worker may use (its affinity) for a CPU target: a search asking for more
    threads could never be timed there. None for a GPU target, or from a worker that predates it."""


class ProposeInput(BaseModel):
    """Asks the proposer agents for a generation's candidates."""

    search_id: str
    """The search."""
    spec: SearchSpec
    """The spec, with the hints and budget in force now."""
    target: str
    """The resolved target."""
    generation: int
    """The generation to propose."""
    count: int
    """How many candidates to propose."""
    incumbent: Candidate | None
    """The incumbent candidate."""
    seen: list[str]
    """Candidate ids never to propose again."""
    incumbent_evidence: dict[str, Any] = Field(default_factory=dict)
    """The incumbent's figures (speedup over numpy, interval, generation) for LLM prompts."""
    llm_spent_usd: float = 0.0
    """What the search has spent on LLM calls so far."""
    target_machine: str | None = None
    """The machine key of the worker that answered for the target (TargetInfo.machine): evidence taken on it
    can settle a setting; None in requests recorded before the field existed."""


class ProposeOutput(BaseModel):
    """A generation's proposal round."""

    candidates: list[Candidate] = Field(default_factory=list)
    """New candidates, none already seen."""
    spent_usd: float = 0.0
    """LLM spend of this round."""
    budget_exhausted: bool = False
    """True when the LLM budget stopped a proposal from being sent."""
    stop_reason: str = ""
    """Why proposals stopped early, in words."""
    head: StreamHead | None = None
    """The search's stream after the round's events: the witness the workflow's history keeps."""


class StepInput(BaseModel):
    """One step (compile, validate or benchmark) of one candidate."""

    search_id: str
    """The search."""
    generation: int
    """The generation the candidate belongs to."""
    problem: str
    """The problem name or folder."""
    candidate: Candidate
    """The candidate."""
    threads: int = 1
    """Cores the kernel may use."""
    artifact_id: str | None = None
    """The compiled artifact, for validate and benchmark."""
    incumbent_artifact_id: str | None = None
    """The incumbent's artifact, for benchmark; None benchmarks against numpy only."""
    benchmark_seconds: float = 1.0
    """Timing budget, for benchmark."""
    confidence: float = 0.95
    """Confidence level of the benchmark's intervals, for benchmark: the promotion policy's."""
    seed: int = 0
    """Seed of the step's fresh random inputs."""
    target: str | None = None
    """The resolved target (`cpu-x86_64-avx2`, `cuda-sm90`): a compile on the shared build queue builds for it.
    None in steps recorded before CUDA targets existed (always a CPU target)."""


class StepOutput(BaseModel):
    """One step's verdict and its figures; the full evidence is in the event log under ``event_id``."""

    step: str
    """compile, validate, benchmark, or playoff (a round of the search's final playoff)."""
    verdict: str
    """ok, compile_error, incorrect, crash, timeout, resource_limit, impossible."""
    event_id: str
    """The outcome event holding the full evidence."""
    artifact_id: str | None = None
    """Compile: the artifact built."""
    summary: str = ""
    """One line for people: the first compile error, the worst failing case, the speedup."""
    ratio: float | None = None
    """Benchmark: speedup over the incumbent (over numpy when there is none)."""
    ratio_ci_low: float | None = None
    """Benchmark: lower end of the ratio's interval."""
    ratio_ci_high: float | None = None
    """Benchmark: upper end of the ratio's interval."""
    speedup: float | None = None
    """Benchmark: speedup over numpy."""
    speedup_ci_low: float | None = None
    """Benchmark: lower end of that interval."""
    speedup_ci_high: float | None = None
    """Benchmark: upper end of that interval."""
    shared_cores: bool = False
    """Benchmark: the timing shared its cores with another sandbox (the machine was busy), so the reading is
    re-measured before it promotes."""
    method: int | None = None
    """Benchmark: how the judge took the reading (engine/harness/verdicts.py CPU_MEASUREMENT_METHOD); None in
    outcomes recorded before the field existed, which were LEGACY_METHOD readings."""
    machine: str | None = None
    """Benchmark: the machine key of the worker that took the reading (engine/hardware.py machine_key); None in
    outcomes recorded before the field existed, whose machine is unknown."""
    roofline_fraction: float | None = None
    """Benchmark: how close the candidate came to the machine's roofline (weighted geometric mean over shapes
    of bound / time; 1.0 is at the bound), None where no bound was computed."""
    reused: bool = False
    """True when the outcome was already in the event log (a retried step) and was not redone."""
    engine_seconds: float = 0.0
    """Wall time of the step's own work (compiler, sandboxed validation or timing), without orchestration."""
    head: StreamHead | None = None
    """The search's stream as of the outcome event (appended now, or found recorded): the witness the
    workflow's history keeps. Never part of the recorded payload (it names that event's own hash)."""


class RecordInput(BaseModel):
    """A workflow-level fact to append: started, promoted, generation done, finished, a message."""

    search_id: str
    """The search."""
    event_id: str
    """Deterministic idempotency key."""
    type: str
    """Event type."""
    payload: dict[str, Any]
    """Event payload."""
