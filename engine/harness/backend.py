"""Backends: a target is a backend -- how a candidate for it is built, proved correct and timed.

:func:`backend_for` is the one place that maps a target to its backend:

- ``cpu`` and ``cpu-<arch>-<isa>`` → :class:`CpuBackend`: C through the system compiler (engine/harness/cpu.py),
  validation and timing in the sandboxed CPU worker (validation.py, benchmarking.py), unchanged;
- ``cuda-sm<NN>`` → :class:`CudaBackend`: CUDA through NVRTC for that architecture
  (engine/harness/cuda/compile.py), validation and timing on the GPU (engine/harness/cuda/judge.py).

Every backend sees a problem through its own view (:meth:`Backend.problem`: the CUDA seed, template and
entry point for CUDA), keeps its artifacts as single files in the local cache under their artifact ids, and
names its library baseline: numpy on a CPU, the problem's ``cuda_baseline`` through CuPy on a GPU, both
asked for as ``Reference(kind="numpy")``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from engine.errors import UserError
from engine.hardware import cpu_target, hardware_fingerprint
from engine.harness import cpu
from engine.harness.benchmarking import DEFAULT_BUDGET_S, Reference, benchmark_artifact
from engine.harness.cuda import compile as cuda_compile
from engine.harness.cuda.arch import arch_of
from engine.harness.cuda.nvrtc import nvrtc_version
from engine.harness.validation import validate_artifact
from engine.harness.verdicts import BenchmarkReport, CompileResult, ValidationReport
from engine.problems import Problem


class Backend(Protocol):
    """What the search and ``kf evaluate`` need of a target's toolchain and hardware."""

    kind: str
    """``cpu`` or ``cuda``: the problem view (:meth:`Problem.for_backend`) this backend compiles."""
    target: str
    """The target it serves, e.g. ``cpu-x86_64-avx512`` or ``cuda-sm90``."""
    artifact_kind: str
    """What its artifacts are in the shared store: ``shared_library`` or ``cubin``."""
    library_label: str
    """The label of its library baseline in reports: ``numpy`` or ``cupy``."""

    def problem(self, problem: Problem) -> Problem:
        """``problem`` as this backend sees it (a UserError when the problem has no kernel for it)."""
        ...

    def compile(
        self, problem: Problem, source: str, flags: Sequence[str] | str | None = None, *, cache_dir: Path | None = None
    ) -> CompileResult:
        """Build ``source`` into a cached artifact, or a structured compile error."""
        ...

    def validate(
        self,
        problem: Problem,
        artifact_id: str,
        *,
        seeds: int = 3,
        seed: int = 0,
        threads: int = 1,
        cache_dir: Path | None = None,
        isolation: str = "auto",
    ) -> ValidationReport:
        """Prove the artifact correct on fresh inputs of every validation shape."""
        ...

    def benchmark(
        self,
        problem: Problem,
        artifact_id: str,
        references: Sequence[Reference],
        *,
        budget_s: float = DEFAULT_BUDGET_S,
        confidence: float = 0.95,
        seed: int = 0,
        threads: int = 1,
        cache_dir: Path | None = None,
        isolation: str = "auto",
    ) -> list[BenchmarkReport]:
        """Time the artifact against each reference, interleaved; one report per reference, in order."""
        ...

    def fingerprint(self) -> dict[str, Any]:
        """This worker's hardware and toolchain for the target, as recorded with its outcomes."""
        ...

    def artifact_path(self, artifact_id: str, cache_dir: Path | None = None) -> Path:
        """The local cache file of ``artifact_id`` (it may not exist)."""
        ...

    def cached_artifact(self, artifact_id: str, cache_dir: Path | None = None) -> bytes | None:
        """The bytes of ``artifact_id`` in the local cache, None on a miss."""
        ...

    def install_artifact(self, artifact_id: str, data: bytes, cache_dir: Path | None = None) -> Path:
        """Put bytes fetched from the shared store into the local cache, atomically."""
        ...

    @property
    def library_reference(self) -> Reference:
        """The reference point of the library baseline (what a numpy, or CuPy, user calls)."""
        ...


def backend_kind(target: str) -> str:
    """``cpu`` or ``cuda``: the kind of backend that serves ``target``."""
    if target == "cpu" or target.startswith("cpu-"):
        return "cpu"
    if target.startswith("cuda-"):
        return "cuda"
    raise UserError(f"target {target!r} is not `cpu`, `cpu-<arch>-<isa>` or `cuda-sm<NN>` (e.g. cuda-sm90)")


def backend_for(target: str) -> Backend:
    """The backend of ``target`` (``cpu`` is this machine's CPU target)."""
    if backend_kind(target) == "cpu":
        return CpuBackend(cpu_target() if target == "cpu" else target)
    return CudaBackend(target)


def problem_for_target(problem: Problem, target: str) -> Problem:
    """``problem`` as a search on ``target`` sees it: the seed, template and entry point of its backend."""
    return problem.for_backend(backend_kind(target))


class CpuBackend:
    """C kernels on this machine's CPU: the existing compile, validation and benchmark functions."""

    kind = "cpu"
    artifact_kind = cpu.ARTIFACT_KIND
    library_label = "numpy"

    def __init__(self, target: str) -> None:
        self.target = target

    def problem(self, problem: Problem) -> Problem:
        return problem.for_backend("cpu")

    def compile(
        self, problem: Problem, source: str, flags: Sequence[str] | str | None = None, *, cache_dir: Path | None = None
    ) -> CompileResult:
        return cpu.compile_source(self.problem(problem), source, flags, cache_dir=cache_dir)

    def validate(
        self,
        problem: Problem,
        artifact_id: str,
        *,
        seeds: int = 3,
        seed: int = 0,
        threads: int = 1,
        cache_dir: Path | None = None,
        isolation: str = "auto",
    ) -> ValidationReport:
        return validate_artifact(
            self.problem(problem),
            artifact_id,
            seeds=seeds,
            base_seed=seed,
            threads=threads,
            cache_dir=cache_dir,
            isolation=isolation,
        )

    def benchmark(
        self,
        problem: Problem,
        artifact_id: str,
        references: Sequence[Reference],
        *,
        budget_s: float = DEFAULT_BUDGET_S,
        confidence: float = 0.95,
        seed: int = 0,
        threads: int = 1,
        cache_dir: Path | None = None,
        isolation: str = "auto",
    ) -> list[BenchmarkReport]:
        return benchmark_artifact(
            self.problem(problem),
            artifact_id,
            references,
            budget_s=budget_s,
            confidence=confidence,
            seed=seed,
            threads=threads,
            cache_dir=cache_dir,
            isolation=isolation,
        )

    def fingerprint(self) -> dict[str, Any]:
        return hardware_fingerprint().model_dump(mode="json")

    def artifact_path(self, artifact_id: str, cache_dir: Path | None = None) -> Path:
        return cpu.artifact_path(artifact_id, cache_dir)

    def cached_artifact(self, artifact_id: str, cache_dir: Path | None = None) -> bytes | None:
        return cpu.cached_artifact(artifact_id, cache_dir)

    def install_artifact(self, artifact_id: str, data: bytes, cache_dir: Path | None = None) -> Path:
        return cpu.install_artifact(artifact_id, data, cache_dir)

    @property
    def library_reference(self) -> Reference:
        return Reference(kind="numpy", label=self.library_label)


class CudaBackend:
    """CUDA kernels for one GPU architecture: built anywhere with NVRTC, judged and timed on the GPU.

    ``threads`` and ``isolation`` mean nothing to a GPU judge and are ignored."""

    kind = "cuda"
    artifact_kind = cuda_compile.ARTIFACT_KIND
    library_label = "cupy"

    def __init__(self, target: str) -> None:
        self.target = target
        self.arch = arch_of(target)

    def problem(self, problem: Problem) -> Problem:
        return problem.for_backend("cuda")

    def compile(
        self, problem: Problem, source: str, flags: Sequence[str] | str | None = None, *, cache_dir: Path | None = None
    ) -> CompileResult:
        return cuda_compile.compile_cuda(self.problem(problem), source, flags, arch=self.arch, cache_dir=cache_dir)

    def validate(
        self,
        problem: Problem,
        artifact_id: str,
        *,
        seeds: int = 3,
        seed: int = 0,
        threads: int = 1,
        cache_dir: Path | None = None,
        isolation: str = "auto",
    ) -> ValidationReport:
        # Imported here: the GPU judge loads the CUDA driver's bindings, which a compile-only worker never needs.
        from engine.harness.cuda.judge import validate_cuda

        return validate_cuda(self.problem(problem), artifact_id, seeds=seeds, seed=seed, cache_dir=cache_dir)

    def benchmark(
        self,
        problem: Problem,
        artifact_id: str,
        references: Sequence[Reference],
        *,
        budget_s: float = DEFAULT_BUDGET_S,
        confidence: float = 0.95,
        seed: int = 0,
        threads: int = 1,
        cache_dir: Path | None = None,
        isolation: str = "auto",
    ) -> list[BenchmarkReport]:
        from engine.harness.cuda.judge import benchmark_cuda

        return benchmark_cuda(
            self.problem(problem),
            artifact_id,
            references,
            budget_s=budget_s,
            confidence=confidence,
            seed=seed,
            cache_dir=cache_dir,
        )

    def fingerprint(self) -> dict[str, Any]:
        from engine.targets import detect_gpus

        base = self.target.rstrip("af")  # cuda-sm90a runs on the cuda-sm90 devices
        devices = [gpu.name for gpu in detect_gpus() if gpu.target == base]
        host = hardware_fingerprint().model_dump(mode="json")
        return {**host, "target": self.target, "arch": self.arch, "nvrtc": nvrtc_version(), "devices": devices}

    def artifact_path(self, artifact_id: str, cache_dir: Path | None = None) -> Path:
        return cuda_compile.artifact_path(artifact_id, cache_dir)

    def cached_artifact(self, artifact_id: str, cache_dir: Path | None = None) -> bytes | None:
        return cuda_compile.cached_artifact(artifact_id, cache_dir)

    def install_artifact(self, artifact_id: str, data: bytes, cache_dir: Path | None = None) -> Path:
        return cuda_compile.install_artifact(artifact_id, data, cache_dir)

    @property
    def library_reference(self) -> Reference:
        return Reference(kind="numpy", label=self.library_label)
