"""The CUDA backend's build: a candidate's CUDA source to a cubin with NVRTC, content-addressed and cached.

Nothing here needs a GPU: NVRTC (engine/harness/cuda/nvrtc.py) compiles for the target's architecture
(``cuda-sm90`` → ``sm_90``, engine/harness/cuda/arch.py) on any machine, so compiles can run on any worker.
Before NVRTC runs, the source is refused when it has any ``#include`` (CUDA sources here need no header: a
bfloat16 is converted with shifts and ``__uint_as_float``) or no valid ``// kf-launch:`` line, and the
options when they are not allow-listed. As on the CPU, the problem's signature is appended as a declaration
(:func:`engine.problems.cuda_signature`), so a kernel with other parameter types or C++ linkage fails with
``wrong_signature``; ptxas must report the entry as compiled (``missing_entry`` otherwise).

ptxas runs verbose, and its report of the entry (registers, spills, shared memory, stack) is recorded in the
compile result (:class:`~engine.harness.cuda.ptxas.PtxasReport`). The launch line is then resolved for every
validation and benchmark shape and held to the architecture's limits with that report
(engine/harness/cuda/launch.py): a launch that cannot run is a ``compile_error`` of category ``launch_limit``
naming the shape and the limit. A failure is a CompileResult, never an exception: a failing candidate is data.

The artifact is one file, ``artifacts/<id>/kernel.cubin.json`` in the same cache as CPU artifacts: a JSON
document holding the entry point, the architecture, the launch line, the ptxas report and the cubin (base64),
so that the shared artifact store (engine/evidence/artifacts.py) carries a CUDA build as one blob, and the GPU
side (:func:`load_cuda_artifact`) needs nothing else to launch it. Its id hashes everything that determines
it: the problem's definition (its fingerprint: the shapes the launch was checked on), the source, the
architecture, NVRTC's version and the options.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shlex
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from engine import config
from engine.errors import UserError
from engine.harness.cuda.arch import limits_of
from engine.harness.cuda.launch import LaunchError, LaunchSpec, check_limits, parse_launch
from engine.harness.cuda.nvrtc import nvrtc_version, run_nvrtc
from engine.harness.cuda.ptxas import PtxasReport, compiled_entries, parse_ptxas
from engine.harness.includes import include_refusal
from engine.harness.verdicts import CompileResult, Verdict
from engine.problems import Problem

# Bumped when the harness changes how it builds or what the artifact holds: old cache entries then miss.
HARNESS_ABI = "kf-cuda-1"
FORMAT_VERSION = 1
ARTIFACT_KIND = "cubin"
"""The kind of this backend's artifacts in the shared store (engine/evidence/artifacts.py)."""
ARTIFACT_FILE = "kernel.cubin.json"
DEFAULT_OPTIONS: list[str] = []
# Always added: ptxas's resource report is compile evidence and the launch check's input.
FORCED_OPTIONS = ["--ptxas-options=-v"]
ALLOWED_OPTIONS = frozenset(
    {
        *(f"{dash}{option}" for dash in ("-", "--") for option in ("use_fast_math", "extra-device-vectorization")),
        *(f"{dash}{option}" for dash in ("-", "--") for option in ("restrict", "lineinfo", "std=c++17", "std=c++20")),
        *(
            f"{dash}{option}={value}"
            for dash in ("-", "--")
            for option in ("ftz", "prec-div", "prec-sqrt", "fmad")
            for value in ("true", "false")
        ),
    }
)
# -DNAME or -DNAME=VALUE with a plain value (template parameters as macros); a register cap for ptxas.
_DEFINE = re.compile(r"^-D[A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_.+\-]*)?$")
_REGISTER_CAP = re.compile(r"^--?maxrregcount=(1[6-9]|[2-9][0-9]|1[0-9][0-9]|2[0-4][0-9]|25[0-5])$")
_ERROR_LINE = re.compile(r"^\S+\((?P<line>\d+)\): (?:catastrophic )?error: (?P<message>.*)$")
LOG_LIMIT = 8192
_UNCACHED = frozenset({"timeout", "compiler_crash", "harness"})


class _ArtifactDocument(BaseModel):
    """The artifact file's JSON document: what the GPU side needs to load and launch the kernel."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    format_version: int
    """Version of this document's layout (FORMAT_VERSION); a reader refuses one it does not know."""
    entry: str
    """The ``extern "C" __global__`` function to launch."""
    arch: str
    """The architecture the cubin is for, e.g. ``sm_90``."""
    launch: str
    """The source's ``kf-launch`` line after ``kf-launch:``, resolved per shape by the runtime."""
    ptxas: PtxasReport
    """ptxas's resource report of the entry."""
    cubin: str
    """The cubin, base64."""
    cubin_sha256: str
    """sha-256 of the cubin's bytes: a truncated or altered cache file is refused when loaded."""


@dataclass(frozen=True)
class CudaArtifact:
    """A compiled CUDA kernel, as the GPU side loads it."""

    entry: str
    arch: str
    launch: LaunchSpec
    ptxas: PtxasReport
    cubin: bytes


def artifact_path(artifact_id: str, cache_dir: Path | None = None) -> Path:
    """Where the artifact file of ``artifact_id`` lives (it may not exist: compile or fetch it first)."""
    if not re.fullmatch(r"[0-9a-f]{64}", artifact_id):
        raise ValueError(f"artifact id {artifact_id!r} is not a sha256 hex digest")
    return (cache_dir or config.cache_dir()) / "artifacts" / artifact_id / ARTIFACT_FILE


def cached_artifact(artifact_id: str, cache_dir: Path | None = None) -> bytes | None:
    """The bytes of ``artifact_id`` in this machine's cache; None on a miss (fetch it from the shared store)."""
    try:
        return artifact_path(artifact_id, cache_dir).read_bytes()
    except FileNotFoundError:
        return None


def install_artifact(artifact_id: str, data: bytes, cache_dir: Path | None = None) -> Path:
    """Put ``data`` (fetched from the shared store) into this machine's cache as ``artifact_id``; its path.
    Written to a temporary file, flushed and renamed, so a reader sees no file or the whole file."""
    final = artifact_path(artifact_id, cache_dir)
    _write_atomically(final, data)
    return final


def load_cuda_artifact(artifact_id: str, cache_dir: Path | None = None) -> CudaArtifact:
    """The compiled kernel ``artifact_id`` from this machine's cache. A missing file is FileNotFoundError (the
    machine's problem: fetch it); an unreadable or altered one is ValueError."""
    path = artifact_path(artifact_id, cache_dir)
    if not path.is_file():
        raise FileNotFoundError(f"CUDA artifact {artifact_id} is not in this machine's cache ({path})")
    try:
        document = _ArtifactDocument.model_validate_json(path.read_bytes())
        cubin = base64.b64decode(document.cubin, validate=True)
    except ValueError as error:
        raise ValueError(f"CUDA artifact {path} is not a readable artifact document: {error}") from None
    if document.format_version != FORMAT_VERSION:
        raise ValueError(
            f"CUDA artifact {path} has format {document.format_version}; this harness reads {FORMAT_VERSION}"
        )
    if hashlib.sha256(cubin).hexdigest() != document.cubin_sha256:
        raise ValueError(f"CUDA artifact {path}: the cubin does not match its recorded sha-256 (altered or truncated)")
    return CudaArtifact(
        entry=document.entry,
        arch=document.arch,
        launch=parse_launch(f"// kf-launch: {document.launch}"),
        ptxas=document.ptxas,
        cubin=cubin,
    )


def normalize_options(options: Sequence[str] | str | None) -> list[str]:
    """The candidate's NVRTC options as a list (a string is split like a shell would); None: the defaults."""
    if options is None:
        return list(DEFAULT_OPTIONS)
    if isinstance(options, str):
        try:
            return shlex.split(options)
        except ValueError as error:
            raise UserError(f"options {options!r}: unbalanced quoting ({error}); close every quote") from None
    return [str(o) for o in options]


def disallowed_options(options: Sequence[str]) -> list[str]:
    """The options not in the allow-list (include paths, output files, another architecture, …)."""
    return [o for o in options if o not in ALLOWED_OPTIONS and not _DEFINE.match(o) and not _REGISTER_CAP.match(o)]


def compile_cuda(
    problem: Problem,
    source: str,
    options: Sequence[str] | str | None = None,
    *,
    arch: str,
    cache_dir: Path | None = None,
) -> CompileResult:
    """Compile ``source`` for ``problem``'s CUDA kernel on ``arch`` (``sm_90``…) into a cached artifact; see
    the module docstring. ``problem`` may be any view of the problem: the CUDA one is used."""
    problem = problem.for_backend("cuda")
    limits_of(arch)  # an architecture the harness has no limits for is bad input, refused before any work
    option_list = normalize_options(options)
    version = nvrtc_version()
    cache = cache_dir or config.cache_dir()
    base = CompileResult(
        verdict=Verdict.compile_error,
        flags=option_list,
        compiler=f"NVRTC {version}" if version else "NVRTC (not found)",
        target=f"cuda-{arch.replace('_', '')}",
    )
    bad = disallowed_options(option_list)
    if bad:
        allowed = sorted(ALLOWED_OPTIONS)[:6]
        return _failed(
            base,
            "disallowed_flag",
            f"NVRTC option(s) {bad} are not allowed; use e.g. {allowed}, "
            "-DNAME=VALUE or --maxrregcount=N (see engine.harness.cuda.compile.ALLOWED_OPTIONS)",
        )
    refusal = include_refusal(source, headers=False)
    if refusal:
        return _failed(base, "include", refusal)
    sizes = [p.name for p in problem.params if p.role == "size"]
    try:
        spec = parse_launch(source, sizes)
    except LaunchError as error:
        return _failed(base, "launch_spec", f"problem {problem.name!r}: {error}")
    if version is None:
        return _failed(
            base,
            "no_compiler",
            "NVRTC cannot be loaded; install the nvidia-cuda-nvrtc wheel (pip install "
            "'nvidia-cuda-nvrtc>=13.0,<14') or a CUDA toolkit",
        )
    artifact_id = _artifact_id(problem, source, arch, version, option_list)
    done = cache / "artifacts" / artifact_id / "compile.json"
    failed = cache / "compile-errors" / f"{artifact_id}.json"
    for record in (done, failed):
        if record.is_file() and (record == failed or artifact_path(artifact_id, cache).is_file()):
            stored = CompileResult.model_validate_json(record.read_text())
            return stored.model_copy(update={"cached": True, "seconds": 0.0})
    started = time.perf_counter()
    result = _compile(problem, source, spec, arch, option_list, artifact_id, cache, base)
    result = result.model_copy(update={"seconds": time.perf_counter() - started})
    # A compile stopped at its time limit or whose child died may not be the source's doing (a loaded machine,
    # a child killed from outside): it is not cached, so the next attempt compiles again.
    if result.error_category not in _UNCACHED:
        _write_atomically(done if result.verdict == Verdict.ok else failed, result.model_dump_json().encode())
    return result


def _artifact_id(problem: Problem, source: str, arch: str, version: str, options: list[str]) -> str:
    identity = {
        "abi": HARNESS_ABI,
        "problem": problem.fingerprint(),
        "source": source,
        "arch": arch,
        "nvrtc": version,
        "options": options,
        "forced": FORCED_OPTIONS,
        "entry": problem.entry,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def _failed(base: CompileResult, category: str, first_error: str, log: str = "") -> CompileResult:
    return base.model_copy(update={"error_category": category, "first_error": first_error, "log": log[-LOG_LIMIT:]})


def _compile(
    problem: Problem,
    source: str,
    spec: LaunchSpec,
    arch: str,
    options: list[str],
    artifact_id: str,
    cache: Path,
    base: CompileResult,
) -> CompileResult:
    shapes = [*problem.validation_shapes, *(s for s, _ in problem.benchmark_shapes)]
    # The launch's own limits are checked before NVRTC runs (cheap); registers and static shared memory after.
    launches = []
    for shape in shapes:
        try:
            launch = spec.resolve(shape)
        except LaunchError as error:
            return _failed(base, "launch_spec", f"problem {problem.name!r}, shape {shape}: {error}")
        if why := check_limits(launch, arch):
            return _failed(base, "launch_limit", f"shape {shape}: {why}")
        launches.append((shape, launch))
    # Appended, not prepended: line numbers in the candidate's errors stay its own.
    declaration_line = source.count("\n") + 4
    checked = f"{source}\n\n// appended by the harness: the kernel must match the problem's ABI\n{problem.signature};\n"
    outcome = run_nvrtc(checked, [f"--gpu-architecture={arch}", *options, *FORCED_OPTIONS])
    log = outcome.log
    if outcome.status == "timeout":
        return _failed(base, "timeout", f"compilation stopped: {outcome.message}", log)
    if outcome.status == "held":
        # The machine's failure, never the source's verdict: not cached (harness_error), and the step retries.
        return _failed(base, "harness", f"compilation stopped: {outcome.message}", log).model_copy(
            update={"verdict": Verdict.harness_error}
        )
    if outcome.status == "crashed":
        return _failed(base, "compiler_crash", outcome.message, log)
    if outcome.status == "failed":
        category, first = categorize(log, problem, declaration_line)
        return _failed(base, category, first, log)
    ptxas = parse_ptxas(log, problem.entry)
    if ptxas is None or outcome.cubin is None:
        entries = compiled_entries(log)
        return _failed(
            base,
            "missing_entry",
            f"the source defines no kernel {problem.entry!r} (it defines {entries or 'no kernels'}); the entry "
            f"point must be `{problem.signature}`",
            log,
        )
    result = base.model_copy(update={"ptxas": ptxas, "log": log[-LOG_LIMIT:]})
    for shape, launch in launches:
        if why := check_limits(launch, arch, ptxas):
            return _failed(result, "launch_limit", f"shape {shape}: {why}", log)
    document = _ArtifactDocument(
        format_version=FORMAT_VERSION,
        entry=problem.entry,
        arch=arch,
        launch=spec.text,
        ptxas=ptxas,
        cubin=base64.b64encode(outcome.cubin).decode(),
        cubin_sha256=hashlib.sha256(outcome.cubin).hexdigest(),
    )
    final = artifact_path(artifact_id, cache)
    _write_atomically(final, document.model_dump_json().encode())
    (final.parent / "kernel.cu").write_text(source)
    return result.model_copy(update={"verdict": Verdict.ok, "artifact_id": artifact_id})


def categorize(log: str, problem: Problem, declaration_line: int | None = None) -> tuple[str, str]:
    """(category, first error) of a failed NVRTC compile, from its log. An error on the appended declaration
    (``declaration_line``) means the kernel's definition does not match the problem's ABI."""
    lines = log.splitlines()
    errors = [(m, line.strip()) for line in lines if (m := _ERROR_LINE.match(line.strip()))]
    if not errors:
        other = next((line for line in lines if "error" in line.lower()), lines[0] if lines else "")
        if "ptxas" in other.lower():
            return "ptxas", other.strip()
        return "other", other.strip() or "NVRTC failed without a message"
    match, first = errors[0]
    text = match.group("message").lower()
    if declaration_line is not None and int(match.group("line")) >= declaration_line:
        if int(match.group("line")) == declaration_line and (
            problem.entry in match.group("message") or "incompatible" in text or "overloaded" in text
        ):
            return (
                "wrong_signature",
                f"{first} -- the kernel must be `{problem.signature}` (a definition, exactly these types)",
            )
        # An error about something else on (or after) the appended declaration: the source ended inside an
        # unfinished construct, which NVRTC only noticed in the harness's lines.
        return "syntax", (
            "the source ends inside something unfinished (an unclosed parenthesis, brace or declaration): NVRTC's "
            f"first error is in the declaration of the kernel the harness appends after it: {first}"
        )
    if "could not open source file" in text:
        return "include", first
    if "is undefined" in text or "undeclared" in text:
        return "undeclared", first
    if text.startswith("expected") or any(k in text for k in ("unrecognized token", "missing closing", "unclosed")):
        return "syntax", first
    if any(
        k in text
        for k in ("cannot be", "no suitable", "no operator", "no instance", "incompatible", "argument of type")
    ):
        return "type", first
    return "other", first


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
