"""Validation: is a compiled candidate correct? Judged here, in the trusted parent, never in the child.

For every validation shape × seed × input distribution the parent generates fresh inputs (from a seed it
records) and sends them to the worker over its pipe. The worker (engine/harness/worker.py) places every
buffer inside a larger allocation with random guard bytes before and after it, fills outputs with NaN,
calls the candidate, and sends the whole allocation back on the pipe before any more candidate code runs.
The parent computes the float64 reference, rounds it to the output dtype and compares
(``|got - ref| <= atol + rtol·|ref|``), checks the guard bytes and that inputs are unchanged. The reference
answer never exists in the candidate's process, and nothing is read back from a folder it can write.

All trials of one shape run back to back in the same buffers, so a kernel that caches results across
calls (by pointer, say) returns the previous trial's answer and fails. The first trial of each shape is
also run twice more, in the same buffers:

- on identical inputs with a different NaN pre-fill: the outputs must be bitwise identical (uninitialised
  reads and races show up), unless the problem declares itself nondeterministic (``DETERMINISTIC = False``);
- with a few randomly chosen inner elements of one input changed: the output must follow (a kernel that
  caches its answer keyed on a sample of its input returns the stale one).

The first failing trial stops the run: its evidence (shape, seed, distribution, max abs/rel error, worst
index) is the verdict's.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from pydantic import BaseModel

from engine.errors import ProblemDefinitionError
from engine.harness import protocol as p
from engine.harness.driver import ArtifactNotFound, Contender, Failed, SandboxFailure
from engine.harness.sandbox import CpuLease, SandboxLimits
from engine.harness.verdicts import CaseEvidence, ValidationReport, Verdict
from engine.problems import DTYPES, Problem, bf16_to_float32, changed_input, float32_to_bf16

__all__ = ["ArtifactNotFound", "SandboxFailure", "validate_artifact"]

GUARD_BYTES = 1024
DEFAULT_CALL_TIMEOUT_S = 10.0
# Inner elements of one input changed by the sampled-caching check.
PERTURBED_ELEMENTS = 3
# Judges one call's returned regions: None when it passed, else the evidence.
Judge = Callable[[dict[str, np.ndarray]], CaseEvidence | None]


@dataclass(frozen=True)
class Trial:
    """One validation call: which inputs (shape, distribution, seed) in which phase."""

    id: str
    phase: str
    shape: dict[str, int]
    distribution: str
    seed: int
    shifts: tuple[tuple[str, int], ...] = ()
    """Bytes each array's data lies past a 64-byte boundary (absent: 0), the same for every trial of a shape."""


def trial_seed(base_seed: int, phase: str, shape_index: int, distribution: str, repeat: int) -> int:
    """A seed for Problem.make_inputs, distinct per trial and reproducible from the evidence."""
    text = f"{base_seed}/{phase}/{shape_index}/{distribution}/{repeat}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & ((1 << 63) - 1)


def plan_trials(problem: Problem, phase: str, seeds: int, base_seed: int, *, shifted: bool = True) -> list[list[Trial]]:
    """Trials grouped by shape (a group shares buffers): every shape × distribution × ``seeds`` seeds.

    Distributions alternate within a group, so consecutive trials in the same buffers differ. ``shifted``:
    every other shape's arrays are placed off their 64-byte boundaries (:func:`_shifts`); False where the
    worker places them itself (the CUDA child)."""
    groups = []
    for s, shape in enumerate(problem.validation_shapes):
        shifts = _shifts(problem, trial_seed(base_seed, phase, s, "shifts", 0)) if shifted and s % 2 else ()
        group = [
            Trial(f"{phase[0]}{s}-{d}-{r}", phase, shape, dist, trial_seed(base_seed, phase, s, dist, r), shifts)
            for r in range(seeds)
            for d, dist in enumerate(problem.distributions)
        ]
        groups.append(group)
    return groups


def _shifts(problem: Problem, seed: int) -> tuple[tuple[str, int], ...]:
    """Where each array of a shape's trials starts past a 64-byte boundary: a multiple of its element size,
    drawn for each array on its own. Every other shape is placed so (the rest start on 64-byte boundaries):
    a caller's arrays are aligned only to their elements (numpy's to 16 bytes, a view anywhere), and a kernel
    that assumes more -- aligned loads, or x and y at the same offset from a vector boundary -- crashes or
    misreads there while passing on aligned buffers."""
    rng = np.random.default_rng(seed)
    shifts = []
    for q in problem.params:
        if q.is_array:
            size = np.dtype(DTYPES[q.dtype]).itemsize
            shifts.append((q.name, size * int(rng.integers(0, 64 // size))))
    return tuple(shifts)


def _array_bytes(problem: Problem, shape: dict[str, int]) -> int:
    return sum(
        int(np.prod(q.dims(shape), dtype=np.int64)) * np.dtype(DTYPES[q.dtype]).itemsize
        for q in problem.params
        if q.is_array
    )


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


def accepts_zeros(reference: np.ndarray, atol: float, rtol: float) -> float | None:
    """The largest finite |reference| value when (atol, rtol) would pass an all-zero output against ``reference``
    (which is not all zero): every finite reference value within the tolerance of 0; else None. Such a tolerance
    checks nothing of an answer's values (kf problem check's benchmark_tolerance check asks more: that a bfloat16
    rounding fails it)."""
    ref = np.asarray(reference, dtype=np.float64)
    finite = np.abs(ref[np.isfinite(ref)])
    if not finite.size or not finite.max() > 0:
        return None
    return float(finite.max()) if bool(np.all(finite <= atol + rtol * finite)) else None


def constant_answer(references: Sequence[tuple[np.ndarray, float, float]]) -> list[float] | None:
    """For each output ``(reference, atol, rtol)`` of one call, a value that, written to every element, passes
    the tolerance against the whole reference (the middle of its range); None when some output has no such value
    or the outputs hold one element in all. Where every output has one, the call's answers check nothing of a
    kernel that writes those values without reading its inputs (relu of inputs that are all negative)."""
    if sum(np.asarray(reference).size for reference, _, _ in references) < 2:
        return None
    values = []
    for reference, atol, rtol in references:
        ref = np.asarray(reference, dtype=np.float64)
        if not ref.size or not np.all(np.isfinite(ref)):
            return None
        middle = (float(ref.min()) + float(ref.max())) / 2
        if not bool(np.all(np.abs(ref - middle) <= atol + rtol * np.abs(ref))):
            return None
        values.append(middle)
    return values


def output_values(problem: Problem, name: str, got: np.ndarray, reference: Any) -> tuple[np.ndarray, np.ndarray]:
    """An output and its reference as :func:`compare_output` takes them. A ``bfloat16`` output (stored as its
    bits) is decoded to float32 (Problem.decode_output) and its reference rounded to bfloat16 first, which is
    what "rounded to the output dtype" means for it; any other output is returned unchanged."""
    param = next((q for q in problem.params if q.name == name), None)
    if param is None or param.dtype != "bfloat16":
        return got, np.asarray(reference)
    rounded = bf16_to_float32(float32_to_bf16(np.asarray(reference, dtype=np.float32)))
    return problem.decode_output(name, got), rounded


def _jsonable(value: float) -> float | None:
    # NaN/inf do not survive JSON event payloads; the message keeps the exact text.
    return value if np.isfinite(value) else None


class TrialChecker:
    """Judges each finished trial from the regions the worker sent back."""

    def __init__(self, problem: Problem, guard: bytes) -> None:
        self.problem = problem
        self.guard = np.frombuffer(guard, dtype=np.uint8)
        self.checked = 0

    def evidence(self, trial: Trial, check: str, **fields: Any) -> CaseEvidence:
        return CaseEvidence(
            phase=trial.phase,
            check=check,
            shape=trial.shape,
            seed=trial.seed,
            distribution=trial.distribution,
            **fields,
        )

    def outputs(self, trial: Trial, regions: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The output arrays inside their regions."""
        g = len(self.guard)
        found = {}
        for q in self.problem.outputs:
            dims = q.dims(trial.shape)
            dtype = np.dtype(DTYPES[q.dtype])
            nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
            found[q.name] = regions[q.name][g : g + nbytes].view(dtype).reshape(dims)
        return found

    def check(
        self,
        trial: Trial,
        inputs: dict[str, Any],
        regions: dict[str, np.ndarray],
        note: str = "",
        output_check: str = "output",
    ) -> CaseEvidence | None:
        """None when the trial passed; else the evidence of its first failed check."""
        problem = self.problem
        g = len(self.guard)
        outputs: dict[str, np.ndarray] = {}
        for q in problem.params:
            if not q.is_array:
                continue
            dims = q.dims(trial.shape)
            dtype = np.dtype(DTYPES[q.dtype])
            nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
            raw = regions.get(q.name, np.zeros(0, dtype=np.uint8))
            if raw.size != g + nbytes + g:
                return self.evidence(trial, "harness", output=q.name, message=f"buffer {q.name} was not returned")
            for where, guard in (("guard_before", raw[:g]), ("guard_after", raw[g + nbytes :])):
                changed = np.flatnonzero(guard != self.guard)
                if changed.size:
                    offset = int(changed[0]) - g if where == "guard_before" else int(changed[0])
                    side = "before the start" if where == "guard_before" else "past the end"
                    return self.evidence(
                        trial,
                        where,
                        output=q.name,
                        worst_index=[offset],
                        message=(
                            f"wrote {side} of {q.name}: {changed.size} guard byte(s) changed, the first "
                            f"{abs(offset) if where == 'guard_before' else offset} byte(s) "
                            f"{'before' if where == 'guard_before' else 'after'} the buffer"
                        ),
                    )
            data = raw[g : g + nbytes].view(dtype).reshape(dims)
            if q.role == "in":
                original = np.ascontiguousarray(inputs[q.name])
                if data.tobytes() != original.tobytes():
                    diff = np.flatnonzero(data.view(np.uint8).reshape(-1) != original.view(np.uint8).reshape(-1))
                    element = int(diff[0]) // dtype.itemsize
                    index = [int(i) for i in np.unravel_index(element, dims)]
                    return self.evidence(
                        trial,
                        "input_modified",
                        output=q.name,
                        worst_index=index,
                        message=f"the candidate modified its input {q.name} (first change at {tuple(index)})",
                    )
            else:
                outputs[q.name] = data
        reference = problem.reference(inputs, trial.shape)
        for q in problem.outputs:
            atol, rtol = problem.tolerance(q.dtype, trial.shape, inputs)
            got, expected = output_values(problem, q.name, outputs[q.name], reference[q.name])
            passed, fields = compare_output(q.name, got, expected, atol, rtol)
            if not passed:
                if note:
                    fields["message"] = f"{note}: {fields['message']}"
                if any(shift for _, shift in trial.shifts):
                    placed = ", ".join(f"{name} +{shift}" for name, shift in trial.shifts)
                    fields["message"] += f" (arrays placed past a 64-byte boundary by: {placed} bytes)"
                return self.evidence(trial, output_check, **fields)
        self.checked += 1
        return None


def _same_draw(problem: Problem, trial: Trial, first: dict[str, Any], again: dict[str, Any]) -> None:
    """Raise ProblemDefinitionError when drawing a trial's inputs again from its seed gave other inputs: the
    judge redraws inputs from seeds to check outputs (this repeat, timed outputs), so a make_inputs that does
    not draw from its rng would have a kernel judged on inputs it never saw."""
    name = changed_input(first, again)
    if name is not None:
        raise ProblemDefinitionError(
            f"{problem.folder / 'problem.py'} make_inputs({trial.shape}, {trial.distribution!r}) gave a "
            f"different {name!r} for the same seed: draw every random number from its rng argument (never "
            "np.random.* directly, the time or a counter)"
        )


def _perturbed(problem: Problem, trial: Trial, inputs: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The inputs with a few randomly chosen inner elements of one input changed so that the reference
    changes, and a note saying which; None when no such change exists (e.g. a one-element input)."""
    target = next((q for q in problem.params if q.role in ("in", "inout") and "float" in q.dtype and q.is_array), None)
    if target is None:
        return None
    original = np.asarray(inputs[target.name])
    flat = original.reshape(-1)
    if flat.size < 3:
        return None
    rng = np.random.default_rng(trial.seed ^ 0x5EED)
    reference = problem.reference(inputs, trial.shape)
    for _ in range(5):
        count = min(PERTURBED_ELEMENTS, flat.size - 2)
        where = rng.choice(np.arange(1, flat.size - 1), size=count, replace=False)  # never the ends
        changed = flat.copy()
        # Another element's value: still a plausible input of the same distribution.
        changed[where] = flat[rng.integers(0, flat.size, size=count)]
        same = changed[where] == flat[where]
        changed[where[same]] = flat[where[same]] * np.float32(0.5) + np.float32(0.25)
        candidate = {**inputs, target.name: changed.reshape(original.shape)}
        after = problem.reference(candidate, trial.shape)
        if any(not np.allclose(after[q.name], reference[q.name], rtol=1e-4, atol=1e-5) for q in problem.outputs):
            index = [tuple(int(i) for i in np.unravel_index(int(w), original.shape)) for w in where]
            return candidate, f"after {count} element(s) of {target.name} at {index} were changed"
    return None


class TrialChannel(Protocol):
    """The worker a TrialRunner talks to: a CPU contender (engine/harness/driver.py) or the CUDA child
    (engine/harness/cuda/child.py, ModuleTrials), which both answer a Trial with its regions (TrialDone)."""

    def post(self, command: BaseModel, *payload: bytes | memoryview, what: str = "a call") -> None: ...

    def collect(self, *, timeout: float, what: str = "a call") -> tuple[BaseModel, bytearray]: ...


class TrialRunner:
    """Sends trials to a candidate's worker and judges them; one per sandboxed run."""

    def __init__(
        self, problem: Problem, contender: TrialChannel, call_timeout_s: float, guard_bytes: int = GUARD_BYTES
    ) -> None:
        """``guard_bytes``: the guard before and after every array (a GPU's are larger: cuda/layout.py)."""
        self.problem = problem
        self.contender = contender
        self.call_timeout_s = call_timeout_s
        self.guard = np.random.default_rng().integers(0, 256, guard_bytes, dtype=np.uint8).tobytes()
        self.checker = TrialChecker(problem, self.guard)
        self.current: Trial | None = None

    def post(self, trial: Trial, inputs: dict[str, Any], *, poison: int = 0) -> None:
        """Send one trial to the worker (its regions come back through :meth:`collect`)."""
        self.current = trial
        arrays, specs, scalars = [], [], {}
        for q in self.problem.params:
            if q.role in ("in", "inout"):
                array = np.ascontiguousarray(inputs[q.name], dtype=DTYPES[q.dtype])
                arrays.append(array.reshape(-1).view(np.uint8).data)
                specs.append(p.ArraySpec(name=q.name, dtype=q.dtype, dims=list(array.shape), nbytes=array.nbytes))
            elif q.role == "scalar":
                value = inputs[q.name]
                scalars[q.name] = float(value) if "float" in q.dtype else int(value)
        command = p.Trial(
            id=trial.id,
            shape=trial.shape,
            scalars=scalars,
            inputs=specs,
            guard=len(self.guard),
            shifts=dict(trial.shifts),
            poison=poison,
            payload_bytes=len(self.guard) + sum(s.nbytes for s in specs),
        )
        self.contender.post(command, self.guard, *arrays)

    def collect(self, trial: Trial) -> dict[str, np.ndarray]:
        """The regions of the trial posted last, by parameter name."""
        reply, data = self.contender.collect(timeout=self.call_timeout_s)
        if not isinstance(reply, p.TrialDone) or reply.id != trial.id:
            raise Failed(Verdict.forbidden, "protocol", f"a trial was answered with {getattr(reply, 'kind', reply)}")
        regions, offset = {}, 0
        for spec in reply.regions:
            regions[spec.name] = np.frombuffer(data, dtype=np.uint8, count=spec.nbytes, offset=offset)
            offset += spec.nbytes
        return regions

    def run(self, groups: list[list[Trial]], *, extra_checks: bool = True) -> CaseEvidence | None:
        """Every trial, then (``extra_checks``) two more calls on each shape's first trial's inputs; the first
        failure's evidence. Pipelined: the next call is sent as soon as the previous one's regions are here,
        and those are judged while the worker runs it (they left the worker before it did)."""
        pending: tuple[Trial, Judge] | None = None
        for trial, inputs, poison, judge in self._steps(groups, extra_checks):
            if pending is not None:
                regions = self.collect(pending[0])
                self.post(trial, inputs, poison=poison)
                failure = pending[1](regions)
                if failure is not None:
                    return failure
            else:
                self.post(trial, inputs, poison=poison)
            pending = (trial, judge)
        if pending is not None:
            failure = pending[1](self.collect(pending[0]))
            if failure is not None:
                return failure
        self.current = None
        return None

    def _steps(
        self, groups: list[list[Trial]], extra_checks: bool
    ) -> Iterator[tuple[Trial, dict[str, Any], int, Judge]]:
        """(trial, inputs, pre-fill, judge) for every call, in order."""
        check = self.checker.check
        for group in groups:
            first: dict[str, np.ndarray] = {}
            drawn: dict[str, Any] = {}
            for k, trial in enumerate(group):
                inputs = self.problem.make_inputs(trial.shape, trial.distribution, trial.seed)
                if k == 0:
                    drawn = inputs

                def judge(
                    regions: dict[str, np.ndarray],
                    trial: Trial = trial,
                    inputs: dict[str, Any] = inputs,
                    k: int = k,
                    first: dict[str, np.ndarray] = first,
                ) -> CaseEvidence | None:
                    failure = check(trial, inputs, regions)
                    if failure is None and k == 0:
                        first.update({n: a.copy() for n, a in self.checker.outputs(trial, regions).items()})
                    return failure

                yield trial, inputs, 0, judge
            if not extra_checks:
                continue
            trial = group[0]
            inputs = self.problem.make_inputs(trial.shape, trial.distribution, trial.seed)
            _same_draw(self.problem, trial, drawn, inputs)

            def judge_repeat(
                regions: dict[str, np.ndarray],
                trial: Trial = trial,
                inputs: dict[str, Any] = inputs,
                first: dict[str, np.ndarray] = first,
            ) -> CaseEvidence | None:
                failure = check(trial, inputs, regions, "called again on the same inputs", "repeated_call")
                return failure or self._compare_bits(trial, first, regions)

            # The first trial's inputs again, with another pre-fill: bitwise the same outputs as that trial.
            yield trial, inputs, 1, judge_repeat
            changed = _perturbed(self.problem, trial, inputs)
            if changed is not None:
                perturbed, note = changed

                def judge_changed(
                    regions: dict[str, np.ndarray],
                    trial: Trial = trial,
                    perturbed: dict[str, Any] = perturbed,
                    note: str = note,
                ) -> CaseEvidence | None:
                    return check(trial, perturbed, regions, note, "sampled_input")

                # A few inner elements of one input changed: the output must follow.
                yield trial, perturbed, 0, judge_changed

    def _compare_bits(
        self, trial: Trial, before: dict[str, np.ndarray], regions: dict[str, np.ndarray]
    ) -> CaseEvidence | None:
        """Evidence when a repeated call's outputs differ in any bit (unless the problem is nondeterministic)."""
        if not self.problem.deterministic:
            return None
        for name, earlier in before.items():
            later = self.checker.outputs(trial, regions)[name]
            if earlier.tobytes() != later.tobytes():
                diff = np.flatnonzero(earlier.view(np.uint8).reshape(-1) != later.view(np.uint8).reshape(-1))
                index = [int(i) for i in np.unravel_index(int(diff[0]) // earlier.dtype.itemsize, earlier.shape)]
                return self.checker.evidence(
                    trial,
                    "nondeterministic",
                    output=name,
                    worst_index=index,
                    message=(
                        f"two calls on identical inputs gave different bits in {name} (first at "
                        f"{tuple(index)}): uninitialised reads or a race; a problem whose kernels may "
                        "legitimately differ run to run declares DETERMINISTIC = False"
                    ),
                )
        return None

    def where(self, check: str, message: str, phase: str) -> CaseEvidence:
        """Evidence naming the trial that was running when the worker failed."""
        trial = self.current
        if trial is None:
            return CaseEvidence(phase=phase, check=check, message=message)
        return CaseEvidence(
            phase=trial.phase,
            check=check,
            shape=trial.shape,
            seed=trial.seed,
            distribution=trial.distribution,
            message=message,
        )


def address_space_limit(problem: Problem, shapes: Sequence[dict[str, int]], extra: int = 0) -> int:
    """Address space for the worker: Python + numpy, a few copies of the largest trial, and ``extra``."""
    largest = max((_array_bytes(problem, s) for s in shapes), default=0)
    return max(2 << 30, (1 << 30) + 6 * largest + extra)


def validation_limits(problem: Problem, trials: int, call_timeout_s: float) -> SandboxLimits:
    """Limits of a validation worker: time for every trial (three calls for each shape's first), memory
    for a few copies of the largest trial."""
    return SandboxLimits(
        wall_seconds=120 + 3 * trials * call_timeout_s / 10,
        cpu_seconds=int(150 + 3 * trials * call_timeout_s / 10),
        address_space_bytes=address_space_limit(problem, problem.validation_shapes),
        file_size_bytes=64 << 20,
    )


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
    groups = plan_trials(problem, "validation", seeds, base_seed)
    limits = validation_limits(problem, sum(len(g) for g in groups), call_timeout_s)
    lease = CpuLease(threads)
    contender: Contender | None = None
    runner: TrialRunner | None = None
    try:
        contender = Contender(
            problem,
            label="candidate",
            kind="artifact",
            artifact_id=artifact_id,
            threads=threads,
            cpus=lease.cpus,
            limits=limits,
            cache_dir=cache_dir,
            isolation=isolation,
        )
        runner = TrialRunner(problem, contender, call_timeout_s)
        failure = runner.run(groups)
        try:
            contender.close()
        except Failed:
            if failure is None:
                raise  # it did not end as told after its last trial: that, not "ok", is the verdict
        exited = contender.exited
        common = {
            "trials": runner.checker.checked,
            "output_tail": exited.output_tail[-2000:] if exited is not None else "",
            "isolation": str(contender.sandbox.isolation),
        }
        if failure is not None:
            return ValidationReport(
                verdict=Verdict.incorrect,
                cases=[failure],
                message=failure.message,
                seconds=time.perf_counter() - started,
                **common,
            )
        return ValidationReport(
            verdict=Verdict.ok,
            message=f"{runner.checker.checked} trials passed",
            seconds=time.perf_counter() - started,
            **common,
        )
    except Failed as failed:
        evidence = (
            runner.where(failed.check, failed.message, "validation")
            if runner is not None
            else CaseEvidence(phase="validation", check=failed.check, message=failed.message)
        )
        tail = contender.exited.output_tail[-2000:] if contender is not None and contender.exited else ""
        return ValidationReport(
            verdict=failed.verdict,
            cases=[evidence],
            signal=failed.signal,
            message=failed.message,
            trials=runner.checker.checked if runner is not None else 0,
            output_tail=tail,
            isolation=str(contender.sandbox.isolation) if contender is not None else "",
            seconds=time.perf_counter() - started,
        )
    finally:
        if contender is not None:
            contender.discard()
        lease.release()
