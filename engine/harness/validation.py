"""Validation: is a compiled candidate correct? Judged here, in the trusted parent, never in the child.

For every validation shape × seed × input distribution the parent generates fresh inputs (from a seed it
records) and writes them into the sandbox. The worker (engine/harness/child.py) places every buffer inside
a larger allocation with random guard bytes before and after it, fills outputs with NaN, calls the
candidate, and hands back the whole allocation. The parent then regenerates the inputs from their seed
(the child could have rewritten its files), computes the float64 reference, rounds it to the output dtype
and compares (``|got - ref| <= atol + rtol·|ref|``), checks the guard bytes and that inputs are unchanged.
The reference answer never exists in the candidate's process.

All trials of one shape run back to back in the same buffers, so a kernel that caches results across
calls (by pointer, say) returns the previous trial's answer and fails. The first failing trial stops the
run: its evidence (shape, seed, distribution, max abs/rel error, worst index) is the verdict's.

:class:`HarnessRun` is the plumbing shared with benchmarking: a sandbox, the libraries and the plan in it,
the progress the worker reports, and the verdict of a child that crashed, hung or broke a rule.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import UserError
from engine.harness.cpu import artifact_path, harness_shim
from engine.harness.sandbox import Sandbox, SandboxLimits, SandboxOutcome
from engine.harness.verdicts import CaseEvidence, ValidationReport, Verdict
from engine.problems import DTYPES, Problem

GUARD_BYTES = 1024
DEFAULT_CALL_TIMEOUT_S = 10.0
# The parent keeps generated inputs in memory up to this much, rather than generating them again to check.
KEPT_INPUT_BYTES = 256 << 20
# A fatal signal with the address space within this fraction of its limit is an allocation that failed:
# a worker normally uses well under half of it (the limit is several times the largest trial).
MEMORY_MARGIN_FRACTION = 0.25


class ArtifactNotFound(UserError):
    """An artifact id with no compiled library in this machine's cache."""


class SandboxFailure(RuntimeError):
    """The sandbox itself could not be set up: the machine's fault, not the candidate's (retry elsewhere)."""


@dataclass(frozen=True)
class Trial:
    """One validation call: which inputs (shape, distribution, seed) in which phase."""

    id: str
    phase: str
    shape: dict[str, int]
    distribution: str
    seed: int


def trial_seed(base_seed: int, phase: str, shape_index: int, distribution: str, repeat: int) -> int:
    """A seed for Problem.make_inputs, distinct per trial and reproducible from the evidence."""
    text = f"{base_seed}/{phase}/{shape_index}/{distribution}/{repeat}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & ((1 << 63) - 1)


def plan_trials(problem: Problem, phase: str, seeds: int, base_seed: int) -> list[list[Trial]]:
    """Trials grouped by shape (a group shares buffers): every shape × distribution × ``seeds`` seeds.

    Distributions alternate within a group, so consecutive trials in the same buffers differ."""
    groups = []
    for s, shape in enumerate(problem.validation_shapes):
        group = [
            Trial(f"{phase[0]}{s}-{d}-{r}", phase, shape, dist, trial_seed(base_seed, phase, s, dist, r))
            for r in range(seeds)
            for d, dist in enumerate(problem.distributions)
        ]
        groups.append(group)
    return groups


def _array_bytes(problem: Problem, shape: dict[str, int]) -> int:
    return sum(
        int(np.prod(p.dims(shape), dtype=np.int64)) * np.dtype(DTYPES[p.dtype]).itemsize
        for p in problem.params
        if p.is_array
    )


def write_validation_phase(
    problem: Problem,
    directory: Path,
    label: str,
    groups: list[list[Trial]],
    keep: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Generate the inputs of every trial into ``directory`` and return the plan's phase entry. Inputs
    are also kept in ``keep`` (by trial id) while they add up to less than KEPT_INPUT_BYTES."""
    plan_groups = []
    kept = 0
    for group in groups:
        cases = []
        for trial in group:
            inputs = problem.make_inputs(trial.shape, trial.distribution, trial.seed)
            size = sum(v.nbytes for v in inputs.values() if isinstance(v, np.ndarray))
            if keep is not None and kept + size <= KEPT_INPUT_BYTES:
                keep[trial.id] = inputs
                kept += size
            files, scalars = {}, {}
            for p in problem.params:
                if p.role in ("in", "inout"):
                    files[p.name] = f"{trial.id}.{p.name}.npy"
                    np.save(directory / files[p.name], inputs[p.name])
                elif p.role == "scalar":
                    scalars[p.name] = float(inputs[p.name]) if "float" in p.dtype else int(inputs[p.name])
            cases.append({"id": trial.id, "inputs": files, "scalars": scalars})
        plan_groups.append({"shape": group[0].shape, "cases": cases})
    return {"kind": "validate", "label": label, "guard_file": "guard.bin", "groups": plan_groups}


def compare_output(
    name: str, got: np.ndarray, reference: np.ndarray, atol: float, rtol: float
) -> tuple[bool, dict[str, Any]]:
    """Compare one output to its reference (rounded to the output dtype) elementwise; return whether it
    passes and the evidence fields (max abs/rel error, worst index, expected, got, message)."""
    ref = np.asarray(reference).astype(got.dtype).astype(np.float64)
    out = got.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        # Fast path for the common case, everything within tolerance (NaN compares False and falls through).
        if np.all(np.abs(out - ref) <= atol + rtol * np.abs(ref)):
            return True, {"output": name}
    finite = np.isfinite(ref)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(out - ref)
        err = np.where(np.isnan(err), np.inf, err)
        allowed = atol + rtol * np.abs(ref)
        special_ok = (out == ref) | (np.isnan(out) & np.isnan(ref))
        bad = np.where(finite, ~(err <= allowed), ~special_ok)
        severity = np.where(bad, np.where(finite, err / np.maximum(allowed, 1e-300), np.inf), 0.0)
        rel = err / np.maximum(np.abs(ref), np.finfo(np.float64).tiny)
    finite_err = err[finite]
    max_abs = float(finite_err.max()) if finite_err.size else 0.0
    max_rel = float(rel[finite].max()) if finite_err.size else 0.0
    n_bad = int(bad.sum())
    evidence: dict[str, Any] = {"output": name, "max_abs_err": max_abs, "max_rel_err": max_rel}
    if n_bad == 0:
        return True, evidence
    worst = np.unravel_index(int(np.argmax(severity)), got.shape) if got.ndim else ()
    index = [int(i) for i in worst]
    expected, value = float(ref[tuple(index)]), float(out[tuple(index)])
    nans = int(np.isnan(out).sum())
    message = (
        f"{name} differs from the reference at {tuple(index)}: got {value:.9g}, expected {expected:.9g} "
        f"(allowed |err| <= {atol:g} + {rtol:g}·|expected|); {n_bad} of {got.size} elements outside "
        f"tolerance, max abs err {max_abs:.3g}, max rel err {max_rel:.3g}"
    )
    if nans:
        message += f"; {nans} element(s) are NaN (the harness pre-fills outputs with NaN: never written?)"
    evidence |= {"worst_index": index, "expected": _jsonable(expected), "got": _jsonable(value), "message": message}
    return False, evidence


def _jsonable(value: float) -> float | None:
    # NaN/inf do not survive JSON event payloads; the message keeps the exact text.
    return value if np.isfinite(value) else None


class TrialChecker:
    """Judges each finished trial from the child's dumps; deletes the files it has judged."""

    def __init__(
        self,
        problem: Problem,
        directory: Path,
        guard: bytes,
        trials: Sequence[Trial],
        inputs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.problem = problem
        self.directory = directory
        self.guard = np.frombuffer(guard, dtype=np.uint8)
        self.trials = {t.id: t for t in trials}
        # Inputs kept from generation (never read back from the sandbox, which the child can write);
        # a trial not kept here is generated again from its seed.
        self.inputs = inputs if inputs is not None else {}
        self.checked = 0

    def check(self, trial_id: str) -> CaseEvidence | None:
        trial = self.trials[trial_id]
        try:
            return self._check(trial)
        finally:
            for path in self.directory.glob(f"{trial_id}.*"):
                path.unlink(missing_ok=True)

    def _evidence(self, trial: Trial, check: str, **fields: Any) -> CaseEvidence:
        return CaseEvidence(
            phase=trial.phase,
            check=check,
            shape=trial.shape,
            seed=trial.seed,
            distribution=trial.distribution,
            **fields,
        )

    def _check(self, trial: Trial) -> CaseEvidence | None:
        problem = self.problem
        inputs = self.inputs.pop(trial.id, None)
        if inputs is None:
            inputs = problem.make_inputs(trial.shape, trial.distribution, trial.seed)
        g = len(self.guard)
        outputs: dict[str, np.ndarray] = {}
        for p in problem.params:
            if not p.is_array:
                continue
            dims = p.dims(trial.shape)
            dtype = np.dtype(DTYPES[p.dtype])
            nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
            try:
                raw = np.fromfile(self.directory / f"{trial.id}.{p.name}.bin", dtype=np.uint8)
            except OSError:
                raw = np.zeros(0, dtype=np.uint8)
            if raw.size != g + nbytes + g:
                return self._evidence(trial, "harness", output=p.name, message=f"buffer {p.name} was not returned")
            for where, guard in (("guard_before", raw[:g]), ("guard_after", raw[g + nbytes :])):
                changed = np.flatnonzero(guard != self.guard)
                if changed.size:
                    offset = int(changed[0]) - g if where == "guard_before" else int(changed[0])
                    side = "before the start" if where == "guard_before" else "past the end"
                    return self._evidence(
                        trial,
                        where,
                        output=p.name,
                        worst_index=[offset],
                        message=(
                            f"wrote {side} of {p.name}: {changed.size} guard byte(s) changed, the first "
                            f"{abs(offset) if where == 'guard_before' else offset} byte(s) "
                            f"{'before' if where == 'guard_before' else 'after'} the buffer"
                        ),
                    )
            data = raw[g : g + nbytes].view(dtype).reshape(dims)
            if p.role == "in":
                original = np.asarray(inputs[p.name])
                if data.tobytes() != original.tobytes():
                    diff = np.flatnonzero(data.view(np.uint8) != original.view(np.uint8).reshape(-1))
                    element = int(diff[0]) // dtype.itemsize
                    index = [int(i) for i in np.unravel_index(element, dims)]
                    return self._evidence(
                        trial,
                        "input_modified",
                        output=p.name,
                        worst_index=index,
                        message=f"the candidate modified its input {p.name} (first change at {tuple(index)})",
                    )
            else:
                outputs[p.name] = data
        reference = problem.reference(inputs, trial.shape)
        for p in problem.outputs:
            atol, rtol = problem.tolerance(p.dtype, trial.shape, inputs)
            passed, fields = compare_output(p.name, outputs[p.name], reference[p.name], atol, rtol)
            if not passed:
                return self._evidence(trial, "output", **fields)
        self.checked += 1
        return None


@dataclass
class ProgressState:
    """What the worker has reported so far (progress.jsonl), read incrementally while it runs."""

    offset: int = 0
    partial: bytes = b""
    phase: str = ""
    current: str | None = None
    current_since: float = 0.0
    bench_index: int | None = None
    finished: bool = False
    problems: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


class HarnessRun:
    """One sandboxed run of the harness worker on a plan; see the module docstring."""

    def __init__(
        self,
        problem: Problem,
        *,
        threads: int,
        cache_dir: Path | None,
        isolation: str = "auto",
        exclusive_wait_s: float = 0.0,
    ) -> None:
        self.problem = problem
        self.cache_dir = cache_dir
        self.sandbox = Sandbox(threads=threads, isolation=isolation, exclusive_wait_s=exclusive_wait_s)
        self.dir = self.sandbox.dir
        self.threads = threads
        self.guard = os.urandom(GUARD_BYTES)
        (self.dir / "guard.bin").write_bytes(self.guard)
        self.state = ProgressState()
        shim = harness_shim(cache_dir)
        self.shim = None
        if shim is not None:
            shutil.copyfile(shim, self.dir / "kf_shim.so")
            self.shim = "kf_shim.so"

    def __enter__(self) -> HarnessRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sandbox.close()

    def add_library(self, label: str, artifact_id: str, copies: int = 1) -> dict[str, Any]:
        """Copy an artifact into the sandbox ``copies`` times; each copy is loaded separately, at its own
        address (even A/A gets independent loads, and timing can average over code placement)."""
        source = artifact_path(artifact_id, self.cache_dir)
        if not source.is_file():
            raise ArtifactNotFound(
                f"artifact {artifact_id} is not in this machine's cache ({source}); compile the source here "
                "first (engine.harness.cpu.compile_source)"
            )
        names = [f"{label}.{copy}.so" for copy in range(copies)]
        for name in names:
            shutil.copyfile(source, self.dir / name)
        return {"label": label, "kind": "artifact", "libraries": names}

    def add_problem_module(self) -> str:
        shutil.copyfile(self.problem.folder / "problem.py", self.dir / "problem.py")
        return "problem.py"

    def plan(
        self, contenders: list[dict[str, Any]], phases: list[dict[str, Any]], *, problem_py: bool
    ) -> dict[str, Any]:
        return {
            "entry": self.problem.entry,
            "params": [
                {"name": p.name, "role": p.role, "dtype": p.dtype, "shape": list(p.shape)} for p in self.problem.params
            ],
            "contenders": contenders,
            "threads": self.threads,
            "cpus": self.sandbox.cpus,
            "process_check": "namespace" if self.sandbox.isolation == "namespaces" else "children",
            "shim": self.shim,
            "problem_py": self.add_problem_module() if problem_py else None,
            "phases": phases,
        }

    def run(
        self,
        plan: dict[str, Any],
        limits: SandboxLimits,
        on_event: Callable[[dict[str, Any]], str | None],
        *,
        call_timeout_s: float,
        poll_s: float = 0.02,
    ) -> SandboxOutcome:
        """Run the worker on ``plan``; ``on_event`` sees each progress event and may return a reason to stop."""
        (self.dir / "plan.json").write_text(json.dumps(plan))
        state = self.state
        stop: list[str] = []

        def watch() -> str | None:
            reason = self._read_progress(on_event)
            if reason:
                stop.append(reason)
                return reason
            if state.current is not None and time.monotonic() - state.current_since > call_timeout_s:
                reason = f"timeout: one call ran longer than {call_timeout_s:g}s"
                stop.append(reason)
                return reason
            return None

        outcome = self.sandbox.run(
            self.sandbox.worker_command(str(self.dir / "plan.json")), limits, watch=watch, poll_s=poll_s
        )
        if not stop:
            self._read_progress(on_event)
        if outcome.setup_error:
            raise SandboxFailure(outcome.setup_error)
        return outcome

    def _read_progress(self, on_event: Callable[[dict[str, Any]], str | None]) -> str | None:
        state = self.state
        try:
            with open(self.dir / "progress.jsonl", "rb") as log:
                log.seek(state.offset)
                chunk = log.read()
        except FileNotFoundError:
            return None
        state.offset += len(chunk)
        data = state.partial + chunk
        lines = data.split(b"\n")
        state.partial = lines.pop()
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a candidate may write garbage into an inherited descriptor; ignore it
            if not isinstance(event, dict):
                continue
            kind = event.get("ev")
            if kind == "start":
                state.current, state.current_since = str(event.get("case")), time.monotonic()
            elif kind == "done":
                state.current = None
            elif kind == "phase":
                state.phase = str(event.get("phase"))
            elif kind == "bench_start":
                state.bench_index = int(event.get("index", 0))
                state.current, state.current_since = None, time.monotonic()
            elif kind == "finished":
                state.finished = True
            elif kind in ("violation", "error", "fatal"):
                state.problems.append(event)
            reason = on_event(event)
            if reason:
                return reason
        return None


def verdict_from_outcome(
    outcome: SandboxOutcome,
    state: ProgressState,
    limits: SandboxLimits,
    where: Callable[[str, str], CaseEvidence],
) -> tuple[Verdict, CaseEvidence, int | None] | None:
    """The verdict of a child that did not finish cleanly (crash, timeout, rule broken), with evidence;
    None when it finished and left nothing behind. ``where(check, message)`` fills in the trial."""
    problems = state.problems
    violation = next((p for p in problems if p.get("ev") == "violation"), None)
    if outcome.killed and outcome.killed.startswith(("timeout", "wall-clock")):
        return Verdict.timeout, where("timeout", f"stopped: {outcome.killed}"), None
    if violation is not None:
        return Verdict.resource_limit, where(str(violation.get("check")), str(violation.get("message"))), None
    error = next((p for p in problems if p.get("ev") == "error"), None)
    fatal = next((p for p in problems if p.get("ev") == "fatal"), None)
    signum = outcome.signal or (int(fatal["signal"]) if fatal else None)
    if error is not None and error.get("kind") == "memory":
        return Verdict.resource_limit, where("memory", str(error.get("message"))), None
    if signum is not None:
        name = _signal_name(signum)
        peak = int(fatal.get("vm_peak_kb", 0)) * 1024 if fatal else 0
        if signum == signal.SIGXCPU:
            return (
                Verdict.timeout,
                where("timeout", f"CPU-time limit of {limits.cpu_seconds}s reached ({name})"),
                signum,
            )
        if signum == signal.SIGXFSZ:
            return Verdict.resource_limit, where("file_size", f"wrote a file past the size limit ({name})"), signum
        if peak >= limits.address_space_bytes * (1 - MEMORY_MARGIN_FRACTION):
            return (
                Verdict.resource_limit,
                where(
                    "memory",
                    f"died from {name} with its address space at {peak >> 20} MiB of the "
                    f"{limits.address_space_bytes >> 20} MiB limit: an allocation failed",
                ),
                signum,
            )
        if signum == signal.SIGKILL:
            return (
                Verdict.resource_limit,
                where("signal", "killed by SIGKILL: the CPU-time hard limit or the machine ran out of memory"),
                signum,
            )
        address = f" at address {fatal['address']}" if fatal and signum in (signal.SIGSEGV, signal.SIGBUS) else ""
        return Verdict.crash, where("signal", f"crashed with {name} (signal {signum}){address}"), signum
    if error is not None:
        check = "load" if error.get("kind") == "load" else "harness"
        return Verdict.crash, where(check, f"the harness child failed: {error.get('message')}"), None
    if outcome.leftover or outcome.status.get("refused_forks"):
        refused = outcome.status.get("refused_forks") or 0
        return (
            Verdict.resource_limit,
            where(
                "processes",
                f"the candidate started processes: {outcome.leftover} still alive at the end"
                + (f", {refused} fork(s) refused by the process limit" if refused else ""),
            ),
            None,
        )
    if not state.finished:
        code = outcome.exit_code
        return Verdict.crash, where("exit", f"the process exited (status {code}) before finishing"), None
    return None


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def address_space_limit(problem: Problem, shapes: Sequence[dict[str, int]], extra: int = 0) -> int:
    """Address space for the worker: Python + numpy, a few copies of the largest trial, and ``extra``."""
    largest = max((_array_bytes(problem, s) for s in shapes), default=0)
    return max(2 << 30, (1 << 30) + 6 * largest + extra)


def validate_artifact(
    problem: Problem,
    artifact_id: str,
    *,
    seeds: int = 3,
    base_seed: int = 0,
    threads: int = 1,
    cache_dir: Path | None = None,
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    isolation: str = "auto",
) -> ValidationReport:
    """Run the candidate on every validation shape × ``seeds`` seeds × distribution, in the sandbox."""
    started = time.perf_counter()
    with HarnessRun(problem, threads=threads, cache_dir=cache_dir, isolation=isolation) as run:
        groups = plan_trials(problem, "validation", seeds, base_seed)
        trials = [t for g in groups for t in g]
        kept: dict[str, dict[str, Any]] = {}
        phase = write_validation_phase(problem, run.dir, "validation", groups, kept)
        plan = run.plan([run.add_library("candidate", artifact_id)], [phase], problem_py=False)
        limits = SandboxLimits(
            wall_seconds=120 + 2 * len(trials) * call_timeout_s / 10,
            cpu_seconds=int(150 + 2 * len(trials) * call_timeout_s / 10),
            address_space_bytes=address_space_limit(problem, problem.validation_shapes),
            file_size_bytes=max(64 << 20, 2 * max(_array_bytes(problem, s) for s in problem.validation_shapes)),
        )
        checker = TrialChecker(problem, run.dir, run.guard, trials, kept)
        failures: list[CaseEvidence] = []

        def on_event(event: dict[str, Any]) -> str | None:
            if event.get("ev") == "done" and event.get("case") in checker.trials:
                evidence = checker.check(str(event["case"]))
                if evidence is not None:
                    failures.append(evidence)
                    return "stop: incorrect"
            return None

        outcome = run.run(plan, limits, on_event, call_timeout_s=call_timeout_s)
        return report_validation(run, outcome, limits, failures, checker, trials, started)


def report_validation(
    run: HarnessRun,
    outcome: SandboxOutcome,
    limits: SandboxLimits,
    failures: list[CaseEvidence],
    checker: TrialChecker,
    trials: Sequence[Trial],
    started: float,
) -> ValidationReport:
    common = {
        "trials": checker.checked,
        "output_tail": outcome.output_tail[-2000:],
        "isolation": str(outcome.isolation),
        "seconds": time.perf_counter() - started,
    }
    if failures:
        first = failures[0]
        return ValidationReport(verdict=Verdict.incorrect, cases=failures, message=first.message, **common)
    by_id = {t.id: t for t in trials}

    def where(check: str, message: str) -> CaseEvidence:
        trial = by_id.get(run.state.current or "")
        if trial is None:
            return CaseEvidence(phase=run.state.phase or "validation", check=check, message=message)
        return CaseEvidence(
            phase=trial.phase,
            check=check,
            shape=trial.shape,
            seed=trial.seed,
            distribution=trial.distribution,
            message=message,
        )

    failed = verdict_from_outcome(outcome, run.state, limits, where)
    if failed is not None:
        verdict, evidence, signum = failed
        return ValidationReport(verdict=verdict, cases=[evidence], signal=signum, message=evidence.message, **common)
    return ValidationReport(
        verdict=Verdict.ok, message=f"{checker.checked} trials passed on {len(trials)} planned", **common
    )
