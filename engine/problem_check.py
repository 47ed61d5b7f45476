"""``kf problem check PATH``: the generic checks a problem folder must pass before a search can trust it.

A search is only as honest as its problem: a tolerance so loose that a half-precision kernel passes, or a
baseline that fails its own tolerance, or a seed that takes a microsecond (all launch overhead) makes every
figure after it meaningless. Each check here is one such property, run on the user's folder:

- ``loads``: problem.py declares what docs/problems.md asks (the loader's own checks);
- ``baseline``: the numpy baseline, what a float32 numpy user writes, is within the tolerance of the
  float64 reference on every validation shape, distribution and two seeds (guards the tolerance from below);
- ``half_precision`` and ``bf16``: the baseline's answer rounded to float16 / bfloat16 fails the tolerance
  on at least half the validation shapes (guards it from above: a kernel computing in low precision must
  be caught);
- ``skipped_element``: the reference of inputs with one element zeroed (a kernel that skips an element of
  its loop) fails the tolerance on at least one validation trial;
- ``benchmark_answers``: on every benchmark shape, the answers for the inputs the judge times (its ``normal``
  distribution, else the first) are not one value within the tolerance (relu of inputs that are all
  negative): a kernel writing that value without reading its inputs would pass every timed check;
- ``benchmark_tolerance``: on every benchmark shape of every backend, where the timed outputs are compared,
  the reference rounded coarser than its output's dtype (to bfloat16 for float32 and float64 outputs, to 3
  mantissa bits, float8 e4m3's, for bfloat16 ones) fails the tolerance: a ``tolerance_for`` tight on the
  validation shapes cannot be loose where a kernel is timed (skipped where the answers are exact in those bits);
- ``roofline``: ``roofline(shape)`` gives a byte count > 0 and a flop count >= 0 on every benchmark shape of
  every backend (timing checks a result against that floor; this check runs without timing too);
- ``seed``: the seed kernel compiles and validates ``ok`` in the sandbox;
- ``template``: a seeded sample of allowed template settings (plus the first and last of the space) each
  compiles and validates ``ok``;
- ``seed_timing``: one call of the seed on each benchmark shape takes between :data:`MIN_CALL_NS` and
  :data:`MAX_CALL_NS` (docs/problems.md: "about 0.1 to 5 ms"), so timings measure the kernel, not the
  call, and a search's budget buys enough rounds (skipped when the seed failed its own check).

Each check reports ``ok``, ``failed`` (with a message naming the fix) or ``skipped`` (with why).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from engine.errors import ProblemDefinitionError, UserError
from engine.problems import Problem, bf16_to_float32, changed_input, float32_to_bf16, load_problem

MIN_CALL_NS = 50_000.0
"""Shortest seed call on a benchmark shape that still measures the kernel rather than the call (0.05 ms)."""
MAX_CALL_NS = 20_000_000.0
"""Longest seed call on a benchmark shape that leaves a search's budget enough rounds (20 ms)."""
TEMPLATE_SAMPLE = 4
"""Random allowed template settings compiled and validated, besides the first and the last."""
PURE_CHECKS = 7
"""The first checks, which run only the problem's own Python (an exception there is the problem's fault)."""


class CheckResult(BaseModel):
    """The outcome of one generic check of a problem folder."""

    name: str = Field(description="The check, e.g. baseline or seed_timing (see engine/problem_check.py).")
    status: Literal["ok", "failed", "skipped"] = Field(description="ok, failed, or skipped (message says why).")
    message: str = Field(description="What was checked, and on failure what is wrong and how to fix it.")


class ProblemCheck(BaseModel):
    """Every check of one problem folder."""

    problem: str = Field(description="The problem's NAME ('' when it did not load).")
    folder: str = Field(description="The folder checked, as given.")
    checks: list[CheckResult] = Field(description="In the order they ran.")

    @property
    def passed(self) -> bool:
        return all(c.status != "failed" for c in self.checks)


def _worst_ratio(
    problem: Problem,
    got: dict[str, np.ndarray],
    ref: dict[str, np.ndarray],
    shape: dict[str, int],
    inputs: Any,
    only: str | None = None,
) -> float:
    """max |got − ref| / (atol + rtol·|ref|) over every output, or the output ``only`` (≤ 1 passes; NaN counts
    as failing)."""
    worst = 0.0
    for param in problem.outputs:
        if only is not None and param.name != only:
            continue
        atol, rtol = problem.tolerance(param.dtype, shape, inputs)
        value = problem.decode_output(param.name, np.asarray(got[param.name]))
        expected = np.asarray(ref[param.name], dtype=np.float64)
        value = np.asarray(value, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.abs(value - expected) / (atol + rtol * np.abs(expected))
        # An answer equal to the reference passes whatever the tolerance, as validation has it (compare_output):
        # an exact one under atol = rtol = 0 (a copy, a gather) read 0/0, NaN, which counted as failing; and an
        # infinity or NaN where the reference has the same.
        same = (value == expected) | (np.isnan(value) & np.isnan(expected))
        ratio = np.where(same, 0.0, np.nan_to_num(ratio, nan=np.inf, posinf=np.inf))
        worst = max(worst, float(ratio.max(initial=0.0)))
    return worst


def check_baseline(problem: Problem) -> CheckResult:
    for shape in problem.validation_shapes:
        for distribution in problem.distributions:
            for seed in (0, 1):
                inputs = problem.make_inputs(shape, distribution, seed)
                if seed == 0:
                    changed = changed_input(inputs, problem.make_inputs(shape, distribution, seed))
                    if changed is not None:
                        # The harness draws each trial's inputs again from its seed to check an output: a
                        # kernel would be judged on inputs it never saw.
                        return CheckResult(
                            name="baseline",
                            status="failed",
                            message=(
                                f"{problem.folder / 'problem.py'} make_inputs({shape}, {distribution!r}, seed "
                                f"{seed}) gave a different {changed!r} on a second call with the same seed: draw "
                                "every random number from its rng "
                                "argument (never np.random.* directly, the time or a counter)"
                            ),
                        )
                worst = _worst_ratio(
                    problem, problem.baseline(inputs, shape), problem.reference(inputs, shape), shape, inputs
                )
                if worst > 1.0:
                    return CheckResult(
                        name="baseline",
                        status="failed",
                        message=(
                            f"the numpy baseline is off by {worst:.3g}x the tolerance on {shape} {distribution} "
                            f"seed {seed}: widen TOLERANCES (or tolerance_for) to what float32 numpy achieves, or "
                            "fix baseline()/reference()"
                        ),
                    )
    trials = len(problem.validation_shapes) * len(problem.distributions) * 2
    return CheckResult(name="baseline", status="ok", message=f"within tolerance on all {trials} trials")


def _rounded(values: np.ndarray, precision: str) -> np.ndarray:
    as32 = np.asarray(values, dtype=np.float32)
    if precision == "float16":
        return as32.astype(np.float16).astype(np.float32)
    return bf16_to_float32(float32_to_bf16(as32))


def check_low_precision(problem: Problem, precision: Literal["float16", "bfloat16"]) -> CheckResult:
    name = "half_precision" if precision == "float16" else "bf16"
    # Every output declared float32 or float64, whatever the baseline returns it as (a float64 array, a list):
    # a float64 output computed in half precision is as wrong as a float32 one.
    floats = {p.name for p in problem.outputs if p.dtype in ("float32", "float64")}
    if not floats:
        return CheckResult(name=name, status="skipped", message="no float32 or float64 output to round")
    distribution = problem.timed_distribution
    failed = unchanged = 0
    for shape in problem.validation_shapes:
        inputs = problem.make_inputs(shape, distribution, 0)
        got = problem.baseline(inputs, shape)
        rounded = {k: (_rounded(v, precision) if k in floats else v) for k, v in got.items()}
        unchanged += all(np.array_equal(rounded[k], np.asarray(got[k], dtype=np.float32)) for k in floats)
        failed += _worst_ratio(problem, rounded, problem.reference(inputs, shape), shape, inputs) > 1.0
    needed = max(1, len(problem.validation_shapes) // 2)
    if failed >= needed:
        return CheckResult(
            name=name,
            status="ok",
            message=f"{precision} answers fail on {failed} of {len(problem.validation_shapes)} shapes",
        )
    if unchanged > len(problem.validation_shapes) - needed:
        # No tolerance could fail an answer the rounding left as it was: the inputs are the fault, not TOLERANCES.
        return CheckResult(
            name=name,
            status="failed",
            message=(
                f"rounding to {precision} changes no answer on {unchanged} of {len(problem.validation_shapes)} "
                f"validation shapes: the '{distribution}' inputs' answers are exact in {precision} (zeros, small "
                "integers), so no tolerance can tell a kernel computing in it; make the distribution these checks "
                "and the timed calls draw ('normal' if DISTRIBUTIONS has it, else the first) one whose answers are "
                "typical"
            ),
        )
    return CheckResult(
        name=name,
        status="failed",
        message=(
            f"a {precision} answer passes the tolerance on {len(problem.validation_shapes) - failed} of "
            f"{len(problem.validation_shapes)} validation shapes (fails on {failed}, needs {needed}): the tolerance "
            "cannot catch a kernel computing in low precision; tighten TOLERANCES or add larger validation shapes"
        ),
    )


def check_skipped_element(problem: Problem) -> CheckResult:
    # bfloat16 too: its zero is the bits 0, as float zero is, so the same element can be left out.
    floats = ("float32", "float64", "bfloat16")
    arrays = [p for p in problem.params if p.role in ("in", "inout") and p.dtype in floats]
    if not arrays:
        return CheckResult(name="skipped_element", status="skipped", message="no floating-point input array")
    for shape in problem.validation_shapes:
        for distribution in problem.distributions:
            inputs = problem.make_inputs(shape, distribution, 0)
            for param in arrays:
                array = np.asarray(inputs[param.name])
                if array.size < 2:
                    continue
                skipped = dict(inputs)
                changed = array.copy()
                # The last element, as a loop with an off-by-one bound would leave it out.
                changed.reshape(-1)[-1] = 0
                skipped[param.name] = changed
                ref = problem.reference(inputs, shape)
                if _worst_ratio(problem, problem.reference(skipped, shape), ref, shape, inputs) > 1.0:
                    return CheckResult(
                        name="skipped_element",
                        status="ok",
                        message=f"skipping the last element of {param.name} fails on {shape} {distribution}",
                    )
    return CheckResult(
        name="skipped_element",
        status="failed",
        message=(
            "no validation trial catches a kernel that skips the last element of an input (zeroed, it changes no "
            "answer beyond the tolerance): add validation shapes or distributions where every element matters "
            "(odd sizes, one row; for a maximum or an argmax, rows whose largest element is the last) or tighten "
            "the tolerance"
        ),
    )


def benchmark_shapes(problem: Problem) -> list[dict[str, int]]:
    """Every shape the judge times on: BENCHMARK_SHAPES, and CUDA_BENCHMARK_SHAPES where the folder declares a
    CUDA kernel, each once."""
    shapes: list[dict[str, int]] = []
    for backend in problem.backends:
        shapes += [s for s, _ in problem.for_backend(backend).benchmark_shapes if s not in shapes]
    return shapes


COARSER_BITS = {"float32": 7, "float64": 7, "bfloat16": 3}
"""Mantissa bits an answer keeps in the benchmark_tolerance check, per output dtype: bfloat16's for a float32 or
float64 output, float8 e4m3's for a bfloat16 one (which is allowed a bfloat16 step of its own)."""


def _with_mantissa(values: np.ndarray, bits: int) -> np.ndarray:
    """Finite ``values`` as float32 rounded to ``bits`` mantissa bits (to nearest, ties to even)."""
    raw = np.asarray(values, dtype=np.float32).view(np.uint32)
    drop = np.uint32(23 - bits)
    # As float32_to_bf16 rounds: add half a step less one plus the lowest kept bit, then clear the dropped bits.
    half = (np.uint32(1) << (drop - np.uint32(1))) - np.uint32(1)
    kept = ((raw + half + ((raw >> drop) & np.uint32(1))) >> drop) << drop
    return np.asarray(kept.astype(np.uint32).view(np.float32))


TimedAnswers = list[tuple[dict[str, int], dict[str, Any], dict[str, np.ndarray]]]
"""Each benchmark shape with the inputs the judge times there (its timed distribution, seed 0) and their
reference."""


def timed_answers(problem: Problem) -> TimedAnswers:
    """The answers the benchmark checks look at. At benchmark shapes a reference takes seconds (softmax's four:
    about 10 s here), so check_problem computes them once for both checks."""
    answers = []
    for shape in benchmark_shapes(problem):
        inputs = problem.make_inputs(shape, problem.timed_distribution, 0)
        answers.append((shape, inputs, problem.reference(inputs, shape)))
    return answers


def check_benchmark_answers(problem: Problem, timed: Callable[[], TimedAnswers] | None = None) -> CheckResult:
    """``timed``: the timed answers (timed_answers), computed here when not given."""
    from engine.harness.validation import constant_answer  # the harness's own rule (check_timed_output)

    distribution = problem.timed_distribution
    answered = timed() if timed is not None else timed_answers(problem)
    for shape, inputs, reference in answered:
        answers = [(reference[q.name], *problem.tolerance(q.dtype, shape, inputs)) for q in problem.outputs]
        constant = constant_answer(answers)
        if constant is not None:
            written = ", ".join(f"{q.name} {v:.6g}" for q, v in zip(problem.outputs, constant, strict=True))
            return CheckResult(
                name="benchmark_answers",
                status="failed",
                message=(
                    f"{problem.folder / 'problem.py'}: on the benchmark shape {shape}, every answer for the "
                    f"'{distribution}' inputs the judge times is one value within its tolerance ({written}), so "
                    "a kernel that writes it without reading its inputs would pass the timed checks (the judge "
                    "refuses a problem where its drift of one element leaves them so): make the distribution the "
                    "judge times ('normal' if DISTRIBUTIONS has it, else the first) one whose answers vary"
                ),
            )
    return CheckResult(
        name="benchmark_answers",
        status="ok",
        message=f"the timed '{distribution}' inputs' answers vary on all {len(answered)} benchmark shapes",
    )


def check_benchmark_tolerance(problem: Problem, timed: Callable[[], TimedAnswers] | None = None) -> CheckResult:
    """``timed``: the timed answers (timed_answers), computed here when not given."""
    outputs = [p for p in problem.outputs if p.dtype in COARSER_BITS]
    if not outputs:
        return CheckResult(name="benchmark_tolerance", status="skipped", message="no floating-point output")
    answered = timed() if timed is not None else timed_answers(problem)
    tried = 0
    for shape, inputs, reference in answered:
        for param in outputs:
            coarse = _with_mantissa(reference[param.name], COARSER_BITS[param.dtype])
            if np.array_equal(coarse, np.asarray(reference[param.name], dtype=np.float32)):
                # Answers that are exact in fewer bits (zeros, small integers) say nothing of the tolerance when
                # rounded: passing them is no fault of it.
                continue
            tried += 1
            answer = float32_to_bf16(coarse) if param.dtype == "bfloat16" else coarse  # bf16 is stored as bits
            if _worst_ratio(problem, {param.name: answer}, reference, shape, inputs, only=param.name) <= 1.0:
                atol, rtol = problem.tolerance(param.dtype, shape, inputs)
                kept = "bfloat16" if COARSER_BITS[param.dtype] == 7 else "3 mantissa bits (float8 e4m3)"
                return CheckResult(
                    name="benchmark_tolerance",
                    status="failed",
                    message=(
                        f"{problem.folder / 'problem.py'}: on the benchmark shape {shape}, the tolerance of "
                        f"{param.name} (atol {atol:g}, rtol {rtol:g}) lets an answer rounded to {kept} through, "
                        "so the timed outputs' check accepts a wrong kernel: tolerance_for (or TOLERANCES) must "
                        "grow with a shape only as its rounding error does"
                    ),
                )
    if not tried:
        return CheckResult(
            name="benchmark_tolerance",
            status="skipped",
            message="the timed answers are exact in fewer mantissa bits: rounding them changes nothing to check",
        )
    return CheckResult(
        name="benchmark_tolerance",
        status="ok",
        message=f"coarser answers fail on all {len(answered)} benchmark shapes",
    )


def check_roofline(problem: Problem) -> CheckResult:
    shapes = benchmark_shapes(problem)
    for shape in shapes:
        problem.roofline(shape)  # refuses a count that is no bound, naming the shape and the fix
    return CheckResult(
        name="roofline", status="ok", message=f"bytes > 0 and flops >= 0 on all {len(shapes)} benchmark shapes"
    )


def _validated(problem: Problem, source: str, what: str, cache_dir: Path | None) -> str | None:
    """None when ``source`` compiles and validates ok; otherwise what went wrong. A CUDA kernel is compiled
    with NVRTC for this machine's GPU, or for CUDA_CHECK_TARGET without one, and validated only on a GPU."""
    from engine.harness.backend import backend_for
    from engine.harness.verdicts import Verdict

    backend = backend_for(_cuda_target()[0] if problem.backend == "cuda" else "cpu")
    compiled = backend.compile(problem, source, cache_dir=cache_dir)
    if compiled.verdict != Verdict.ok or compiled.artifact_id is None:
        return f"{what} does not compile ({compiled.verdict.value}): {compiled.first_error}"
    if problem.backend == "cuda" and _cuda_target()[1] is not None:
        return None  # no GPU here: compiled, not run
    report = backend.validate(problem, compiled.artifact_id, seeds=1, cache_dir=cache_dir)
    if report.verdict != Verdict.ok:
        return f"{what} is {report.verdict.value}: {report.message}"
    return None


CUDA_CHECK_TARGET = "cuda-sm90"
"""What a CUDA kernel is compiled for on a machine without a GPU (NVRTC needs none)."""


@functools.cache
def _cuda_target() -> tuple[str, str | None]:
    """The CUDA target the checks use, and why kernels are not run (None: a GPU is here and they are). Asked
    once per process: every seed and template setting of a CUDA view asks, twice."""
    from engine.targets import scan_gpus

    scan = scan_gpus()
    if scan.gpus:
        return scan.gpus[0].target, None
    return CUDA_CHECK_TARGET, f"compiled for {CUDA_CHECK_TARGET} with NVRTC, not run: no GPU here ({scan.reason})"


def _done(problem: Problem, what: str) -> str:
    """What an ok seed or template check did: on a CUDA view without a GPU, compiled only, and why."""
    if problem.backend == "cuda":
        target, not_run = _cuda_target()
        return f"{what} {not_run}" if not_run else f"{what} compile and validate ok on {target}"
    return f"{what} compile and validate ok"


def _backend_steps(problem: Problem) -> list[Problem | None]:
    """The views the seed and template checks run on: the CPU kernel's, then the CUDA kernel's (None where
    the folder declares no kernel for that backend)."""
    return [problem.for_backend(b) if b in problem.backends else None for b in ("cpu", "cuda")]


def _no_kernel(name: str, problem: Problem, backend: str) -> CheckResult:
    declares = " and ".join(problem.backends)
    return CheckResult(
        name=name, status="skipped", message=f"no {backend} kernel: the problem declares kernels for {declares} only"
    )


def check_seed(problem: Problem, cache_dir: Path | None, name: str = "seed") -> CheckResult:
    wrong = _validated(problem, problem.seed_source(), "the seed", cache_dir)
    if wrong:
        return CheckResult(name=name, status="failed", message=f"{wrong}; fix {problem.seed_path}")
    return CheckResult(name=name, status="ok", message=_done(problem, "the seed:"))


def template_sample(problem: Problem, count: int, seed: int = 0) -> list[dict[str, Any]]:
    """The first and last allowed settings of the template space and ``count`` random ones between."""
    from engine.proposers.random_template import template_space

    space = template_space(problem)
    if len(space) <= count + 2:
        return space
    picks = random.Random(seed).sample(range(1, len(space) - 1), count)
    return [space[0], *(space[i] for i in sorted(picks)), space[-1]]


def check_template(problem: Problem, cache_dir: Path | None, name: str = "template") -> CheckResult:
    declared = "CUDA_TEMPLATE" if problem.backend == "cuda" else "TEMPLATE"
    if problem.template_source() is None:
        return CheckResult(name=name, status="skipped", message=f"the problem declares no {declared}")
    sample = template_sample(problem, TEMPLATE_SAMPLE)
    allows = "cuda_template_allows()" if problem.backend == "cuda" else "template_allows()"
    if not sample:
        # A search of such a folder has only its seed to try: say so rather than pass a check of nothing.
        return CheckResult(
            name=name,
            status="failed",
            message=f"{problem.folder / 'problem.py'}: {allows} allows no setting of the {declared} space; let it "
            "return True for the settings a search may try",
        )
    for params in sample:
        wrong = _validated(problem, problem.render_template(params), f"the template setting {params}", cache_dir)
        if wrong:
            return CheckResult(
                name=name, status="failed", message=f"{wrong}; fix the template or exclude the setting in {allows}"
            )
    return CheckResult(name=name, status="ok", message=_done(problem, f"{len(sample)} sampled settings:"))


def check_seed_timing(problem: Problem, cache_dir: Path | None) -> CheckResult:
    from engine.harness.benchmarking import Reference, benchmark_artifact
    from engine.harness.cpu import compile_source
    from engine.harness.verdicts import Verdict

    compiled = compile_source(problem, problem.seed_source(), cache_dir=cache_dir)
    if compiled.artifact_id is None:
        return CheckResult(name="seed_timing", status="skipped", message="the seed does not compile")
    (report,) = benchmark_artifact(
        problem, compiled.artifact_id, [Reference(kind="numpy", label="numpy")], budget_s=0.5, cache_dir=cache_dir
    )
    if report.verdict == Verdict.harness_error:
        # The machine (or the harness) failed: nothing said about the problem.
        return CheckResult(
            name="seed_timing", status="skipped", message=f"the seed's timing was harness_error: {report.message}"
        )
    if report.verdict != Verdict.ok:
        # The seed validated (or its own check says otherwise) but failed while timed on the benchmark shapes:
        # their inputs, shapes or scalars are what differs, and a search would judge every kernel the same way.
        return CheckResult(
            name="seed_timing",
            status="failed",
            message=(
                f"the seed was judged {report.verdict.value} while timed on BENCHMARK_SHAPES: {report.message}; "
                "check what make_inputs draws at those shapes (a correct kernel must pass there too)"
            ),
        )
    outside = [
        f"{s.shape}: {s.candidate_ns / 1e6:.3g} ms"
        for s in report.shapes
        if not MIN_CALL_NS <= s.candidate_ns <= MAX_CALL_NS
    ]
    calls = ", ".join(f"{s.candidate_ns / 1e6:.3g} ms" for s in report.shapes)
    if outside:
        return CheckResult(
            name="seed_timing",
            status="failed",
            message=(
                f"one seed call should take {MIN_CALL_NS / 1e6:g} to {MAX_CALL_NS / 1e6:g} ms per benchmark shape; "
                f"outside: {'; '.join(outside)}: resize BENCHMARK_SHAPES"
            ),
        )
    return CheckResult(name="seed_timing", status="ok", message=f"one seed call per benchmark shape: {calls}")


def check_problem(
    folder: str,
    *,
    cache_dir: Path | None = None,
    timing: bool = True,
    progress: Callable[[str], None] | None = None,
) -> ProblemCheck:
    """Run every check on the problem folder (or built-in name) ``folder``; never raises for a bad problem."""
    say = progress or (lambda name: None)
    try:
        problem = load_problem(folder)
    except UserError as error:
        return ProblemCheck(
            problem="", folder=folder, checks=[CheckResult(name="loads", status="failed", message=str(error))]
        )
    except Exception as error:  # the folder's own problem.py raised while it was loaded and checked
        message = f"{folder}/problem.py raised {type(error).__name__}: {error}"
        return ProblemCheck(
            problem="", folder=folder, checks=[CheckResult(name="loads", status="failed", message=message)]
        )
    checks = [CheckResult(name="loads", status="ok", message=f"{problem.name} (family {problem.family})")]
    # Both benchmark checks read the same answers; a failure to compute them is raised again to the second.
    timed = functools.cache(functools.partial(timed_answers, problem))
    steps: list[tuple[str, Callable[[], CheckResult]]] = [
        ("baseline", lambda: check_baseline(problem)),
        ("half_precision", lambda: check_low_precision(problem, "float16")),
        ("bf16", lambda: check_low_precision(problem, "bfloat16")),
        ("skipped_element", lambda: check_skipped_element(problem)),
        ("benchmark_answers", lambda: check_benchmark_answers(problem, timed)),
        ("benchmark_tolerance", lambda: check_benchmark_tolerance(problem, timed)),
        ("roofline", lambda: check_roofline(problem)),
    ]
    # The seed and template checks of each backend the folder declares a kernel for; the seed's timing is the
    # CPU kernel's (a GPU's is bench/cuda.py's).
    cpu, cuda = _backend_steps(problem)
    for view, prefix in ((cpu, ""), (cuda, "cuda_")):
        backend = "cpu" if view is cpu else "cuda"
        for name, check in ((f"{prefix}seed", check_seed), (f"{prefix}template", check_template)):
            if view is None:
                steps.append((name, functools.partial(_no_kernel, name, problem, backend)))
            else:
                steps.append((name, functools.partial(check, view, cache_dir, name)))
    if timing:
        if cpu is None:
            steps.append(("seed_timing", functools.partial(_no_kernel, "seed_timing", problem, "cpu")))
        else:
            steps.append(("seed_timing", functools.partial(check_seed_timing, cpu, cache_dir)))
    raised = hung = False
    for index, (name, step) in enumerate(steps):
        if hung or (raised and index >= PURE_CHECKS):
            # The harness would call the same problem.py code and meet the same exception (or wait as long).
            why = "hung" if hung else "raised"
            checks.append(CheckResult(name=name, status="skipped", message=f"problem.py {why} in a check above"))
            continue
        if name == "seed_timing" and any(c.name == "seed" and c.status == "failed" for c in checks):
            # Timing a seed that failed validation repeats that failure as one of the benchmark shapes'.
            checks.append(CheckResult(name=name, status="skipped", message="the seed failed its check above"))
            continue
        say(name)
        try:
            checks.append(step())
        except ProblemDefinitionError as error:
            # Every check calls the same functions: one that hung would make each of them wait as long.
            hung = error.hung
            raised = raised or index < PURE_CHECKS
            checks.append(CheckResult(name=name, status="failed", message=str(error)))
        except UserError as error:
            # The problem's own code raised or returned something malformed (make_inputs, reference, tolerance,
            # template): the check fails, naming it. In the first checks, that code is what every later check
            # runs too.
            raised = raised or index < PURE_CHECKS
            checks.append(CheckResult(name=name, status="failed", message=str(error)))
        except Exception as error:
            if index >= PURE_CHECKS:
                raise  # the harness or the machine failed, not the problem: the caller reports that
            # The first checks run only the problem's own Python (make_inputs, reference, baseline).
            raised = True
            checks.append(
                CheckResult(
                    name=name,
                    status="failed",
                    message=f"{problem.folder / 'problem.py'} raised {type(error).__name__}: {error}",
                )
            )
    return ProblemCheck(problem=problem.name, folder=folder, checks=checks)
