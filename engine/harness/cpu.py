"""The CPU backend: compile a candidate's C source into a shared library, content-addressed and cached.

The system C compiler runs in the sandbox (a compiler can be made to loop), with allow-listed flags only,
and only on a source whose includes name headers, not paths (:mod:`engine.harness.includes`). The artifact
id is the hash of everything that determines the binary: source, flags, compiler version, CPU target, the
problem's entry point and signature, and the harness's fixed flags. A failure is a
:class:`~engine.harness.verdicts.CompileResult` with a category and the compiler's first error, never an
exception: a failing candidate is data.

Two checks catch an entry point that would link but misbehave:

- the problem's ``SIGNATURE`` is appended to the source as a declaration, so a definition with other
  parameter types or another parameter count fails with ``conflicting types`` (``wrong_signature``);
- the library's dynamic symbol table must define the entry as an exported function (``missing_entry``).

What the compiler cannot see -- a kernel that reads arguments its prototype does not declare through
inline assembly, say -- is caught by validation as a wrong answer or a crash.

A library that links is then screened (:mod:`engine.harness.screen`): a constructor, an IFUNC, an import
outside the allow-list (files, processes, network, clock…) or a foreign dependency makes the verdict
``forbidden``, recorded and cached like a compile error. The harness screens an artifact again just before
loading it (the copy the worker loads: engine/harness/driver.py), so a tampered cache cannot slip past.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from engine import config
from engine.errors import UserError
from engine.hardware import c_compiler, compiler_version, cpu_target
from engine.harness.compile_patience import HAD_ITS_CPU, CompilePatience
from engine.harness.includes import assembly_refusal, include_refusal
from engine.harness.sandbox import Sandbox, SandboxLimits, SandboxOutcome, tree_cpu_seconds
from engine.harness.screen import ScreenResult, screen_library
from engine.harness.toolchain import canary_failure, scratch_shortage
from engine.harness.verdicts import CompileResult, Verdict
from engine.outages import KERNEL_SIGNALS
from engine.problems import Problem

# Bumped when the harness changes how it builds or calls artifacts: old cache entries then miss.
HARNESS_ABI = "kf-cpu-3"
DEFAULT_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp-simd"]
# Always added. `--no-undefined` turns a call to a function that does not exist into a link error (a
# shared library may otherwise leave it for load time); the -Werror ones turn silent miscompilations
# (a math function used without its header returns int) into errors. `-nostartfiles` leaves out the C
# runtime's start files (crti, crtbegin…), whose _init/_fini and .init_array/.fini_array entries would
# otherwise be in every library: the screen can then refuse any load-time code as the candidate's own.
FORCED_FLAGS = [
    "-shared",
    "-fPIC",
    "-nostartfiles",
    "-Wl,--no-undefined",
    "-Werror=implicit-function-declaration",
    "-Werror=implicit-int",
    "-Werror=incompatible-pointer-types",
    "-Werror=int-conversion",
]
ALLOWED_FLAGS = frozenset(
    {
        *(f"-O{level}" for level in ("0", "1", "2", "3", "s", "fast")),
        "-march=native",
        "-mtune=native",
        "-mcpu=native",
        "-march=x86-64-v2",
        "-march=x86-64-v3",
        "-march=x86-64-v4",
        "-ffast-math",
        "-fno-fast-math",
        "-funroll-loops",
        "-funroll-all-loops",
        "-fno-unroll-loops",
        "-fopenmp",
        "-fopenmp-simd",
        "-fno-math-errno",
        "-fno-trapping-math",
        "-ffinite-math-only",
        "-fno-signed-zeros",
        "-fassociative-math",
        "-freciprocal-math",
        "-fstrict-aliasing",
        "-fno-strict-aliasing",
        "-fomit-frame-pointer",
        "-ftree-vectorize",
        "-fno-tree-vectorize",
        "-fprefetch-loop-arrays",
        "-fpeel-loops",
        "-fipa-pta",
        "-ffp-contract=fast",
        "-ffp-contract=on",
        "-ffp-contract=off",
        "-fvect-cost-model=unlimited",
        "-fvect-cost-model=dynamic",
        "-fvect-cost-model=cheap",
        "-mprefer-vector-width=128",
        "-mprefer-vector-width=256",
        "-mprefer-vector-width=512",
        "-mavx",
        "-mavx2",
        "-mfma",
        "-mf16c",
        "-mbmi",
        "-mbmi2",
        "-mavx512f",
        "-mavx512vl",
        "-mavx512bw",
        "-mavx512dq",
        "-mavx512cd",
        "-mavx512bf16",
        "-mavx512vnni",
        "-mno-avx512f",
        *(f"-std={std}" for std in ("c99", "c11", "c17", "gnu99", "gnu11", "gnu17")),
        "-w",
        "-Wall",
        "-Wextra",
        "-g",
        "-g0",
    }
)
# -DNAME or -DNAME=VALUE with a plain value: template parameters can come in as macros.
_DEFINE = re.compile(r"^-D[A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_.+\-]*)?$")
LOG_LIMIT = 8192
# 2 GiB of address space per compiler process: an honest kernel (every template setting of the built-in
# spaces) compiles in well under 100 MB, while a preprocessor bomb (macros doubling 2^30 times) grew cc1 to
# 7.8 GB under the 8 GiB this used to allow, and a few such compiles at once would call in the OOM killer.
COMPILE_LIMITS = SandboxLimits(
    wall_seconds=120, cpu_seconds=120, address_space_bytes=2 << 30, file_size_bytes=256 << 20, processes=32
)
_QUOTE = "['‘’`\"]"


def artifact_path(artifact_id: str, cache_dir: Path | None = None) -> Path:
    """Where the shared library of ``artifact_id`` lives (it may not exist: compile it first)."""
    if not re.fullmatch(r"[0-9a-f]{64}", artifact_id):
        raise ValueError(f"artifact id {artifact_id!r} is not a sha256 hex digest")
    return (cache_dir or config.cache_dir()) / "artifacts" / artifact_id / "kernel.so"


ARTIFACT_KIND = "shared_library"
"""The kind of this backend's artifacts in the shared store (engine/evidence/artifacts.py)."""


def cached_artifact(artifact_id: str, cache_dir: Path | None = None) -> bytes | None:
    """The bytes of ``artifact_id`` in this machine's cache; None on a miss (fetch it from the shared store)."""
    try:
        return artifact_path(artifact_id, cache_dir).read_bytes()
    except FileNotFoundError:
        return None


def install_artifact(artifact_id: str, data: bytes, cache_dir: Path | None = None) -> Path:
    """Put ``data`` (fetched from the shared store) into this machine's cache as ``artifact_id``; its path.

    Written to a temporary file of its own, flushed to disk, then renamed over the cache entry: a reader (or a
    concurrent fetch of the same artifact) sees no file or the whole file, never part of one. A worker killed
    mid-write leaves only a ``.kernel.so.*`` temporary that nothing reads; the retried step fetches again.
    A truncated ``kernel.so`` would otherwise fail the screen and be recorded as the kernel's verdict.
    """
    final = artifact_path(artifact_id, cache_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{final.name}.", dir=final.parent)
    try:
        with os.fdopen(descriptor, "wb") as out:
            out.write(data)
            out.flush()
            # Without it a machine that loses power after the rename can come back with an empty kernel.so.
            os.fsync(out.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, final)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return final


def normalize_flags(flags: Sequence[str] | str | None) -> list[str]:
    """The candidate's flags as a list (a single string is split like a shell would; unbalanced quoting is a
    UserError); None: defaults."""
    if flags is None:
        return list(DEFAULT_FLAGS)
    if isinstance(flags, str):
        try:
            return shlex.split(flags)
        except ValueError as error:  # shlex's only complaint: an unclosed quote or a trailing backslash
            raise UserError(
                f"flags {flags!r}: unbalanced quoting ({str(error).lower()}); close every quote, or escape a "
                "literal quote or backslash with a backslash, e.g. \"-O3 -DNAME='a b'\""
            ) from None
    return [str(f) for f in flags]


def disallowed_flags(flags: Sequence[str]) -> list[str]:
    """The flags not in the allow-list (output paths, include or library paths, plugins, linker options…)."""
    return [f for f in flags if f not in ALLOWED_FLAGS and not _DEFINE.match(f)]


def _artifact_id(problem: Problem, source: str, flags: list[str]) -> str:
    identity = {
        "abi": HARNESS_ABI,
        "source": source,
        "flags": flags,
        "forced": FORCED_FLAGS,
        "compiler": compiler_version(),
        "target": cpu_target(),
        "entry": problem.entry,
        "signature": problem.signature,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def _with_signature_check(problem: Problem, source: str) -> str:
    # Appended, not prepended: line numbers in the candidate's errors stay its own. A line comment, not a block
    # one: a candidate's unterminated /* would end at its */ and swallow the source's end without an error.
    # `__dso_handle` is defined by crtbegin, which -nostartfiles leaves out; without it atexit() fails to link with
    # a puzzling "undefined reference to __dso_handle", and with it the screen names the exit handler for what it is.
    return (
        f"{source}\n\n// appended by the harness: the entry point must match the problem's C ABI\n"
        f"#include <stdint.h>\n{problem.signature};\n"
        '__attribute__((visibility("hidden"))) void *const __dso_handle = (void *)&__dso_handle;\n'
    )


def compile_source(
    problem: Problem,
    source: str,
    flags: Sequence[str] | str | None = None,
    *,
    cache_dir: Path | None = None,
) -> CompileResult:
    """Compile ``source`` for ``problem`` into a cached shared library; see the module docstring."""
    flag_list = normalize_flags(flags)
    cache = cache_dir or config.cache_dir()
    artifact_id = _artifact_id(problem, source, flag_list)
    base = CompileResult(
        verdict=Verdict.compile_error, flags=flag_list, compiler=compiler_version(), target=cpu_target()
    )
    bad = disallowed_flags(flag_list)
    if bad:
        return base.model_copy(
            update={
                "error_category": "disallowed_flag",
                "first_error": (
                    f"flag(s) {bad} are not allowed; use optimisation and code-generation flags such as "
                    f"{DEFAULT_FLAGS} or -DNAME=VALUE (see engine.harness.cpu.ALLOWED_FLAGS)"
                ),
            }
        )
    refusal = include_refusal(source)
    if refusal:
        # Refused before the compiler runs: `#include "/dev/zero"` would keep it busy until its memory limit.
        return base.model_copy(update={"error_category": "include", "first_error": refusal})
    done = cache / "artifacts" / artifact_id / "compile.json"
    failed = cache / "compile-errors" / f"{artifact_id}.json"
    for record in (done, failed):
        if record.is_file() and (record == failed or artifact_path(artifact_id, cache).is_file()):
            stored = CompileResult.model_validate_json(record.read_text())
            return stored.model_copy(update={"cached": True, "seconds": 0.0})
    started = time.perf_counter()
    result = _compile(problem, source, flag_list, artifact_id, cache, base)
    result = result.model_copy(update={"seconds": time.perf_counter() - started})
    if result.verdict == Verdict.harness_error:
        return result  # the machine's failure, not the source's: never cached, so the next try compiles again
    record = done if result.verdict == Verdict.ok else failed
    record.parent.mkdir(parents=True, exist_ok=True)
    tmp = record.with_name(f".{record.name}.{os.getpid()}")
    tmp.write_text(result.model_dump_json())
    os.replace(tmp, record)
    return result


def _compile(
    problem: Problem, source: str, flags: list[str], artifact_id: str, cache: Path, base: CompileResult
) -> CompileResult:
    compiler = shutil.which(c_compiler())
    if compiler is None:
        return base.model_copy(
            update={
                "error_category": "no_compiler",
                "first_error": f"C compiler {c_compiler()!r} not found; install gcc or clang, or set CC",
            }
        )
    # The compiler needs no Python: it can run as `nobody` even where the interpreter is unreadable to it.
    with Sandbox(unprivileged=True, pin=False) as sandbox:
        try:
            (sandbox.dir / "kernel.c").write_text(_with_signature_check(problem, source))
        except OSError as error:
            why = scratch_shortage(sandbox.dir) or f"the compiler's scratch folder cannot be written ({error})"
            return base.model_copy(
                update={"verdict": Verdict.harness_error, "error_category": "harness", "first_error": why}
            )
        # Two steps, so that the assembly is read before the assembler runs (engine/harness/includes.py): an asm
        # statement can spell .incbin in pieces that only the compiler puts together.
        outcome, patience = _run_compiler(
            sandbox, [compiler, *flags, *FORCED_FLAGS, "-S", "-o", "kernel.s", "kernel.c"]
        )
        log = outcome.output_tail.replace(str(sandbox.dir) + "/", "")
        failed = _failed_step(problem, outcome, patience, log, base, len(source.splitlines()))
        if failed is not None:
            return _machine_or(failed, sandbox.dir, compiler)
        assembly = sandbox.dir / "kernel.s"
        refusal = assembly_refusal(assembly.read_text(errors="replace")) if assembly.is_file() else None
        if refusal:
            return base.model_copy(update={"error_category": "include", "first_error": refusal})
        outcome, patience = _run_compiler(
            sandbox, [compiler, *flags, *FORCED_FLAGS, "-o", "kernel.so", "kernel.s", "-lm"]
        )
        log = (log + outcome.output_tail.replace(str(sandbox.dir) + "/", ""))[-LOG_LIMIT:]
        failed = _failed_step(problem, outcome, patience, log, base, len(source.splitlines()))
        if failed is not None:
            return _machine_or(failed, sandbox.dir, compiler)
        library = sandbox.dir / "kernel.so"
        screen = screen_library(library)
        if not screen.ok:
            violation = screen.violations[0]
            return base.model_copy(
                update={
                    "verdict": Verdict.forbidden,
                    "error_category": f"forbidden_{violation.kind}",
                    "first_error": violation.message,
                    "screen": screen.violations,
                    "log": log[-LOG_LIMIT:],
                }
            )
        exported = _exported_functions(library)
        if problem.entry not in exported:
            local = problem.entry in _defined_symbols(library)
            why = (
                f"defines {problem.entry!r} but does not export it; remove `static` (and any visibility attribute)"
                if local
                else f"does not define {problem.entry!r}; it defines {sorted(exported)[:10] or 'no functions'}"
            )
            return base.model_copy(
                update={
                    "error_category": "missing_entry",
                    "first_error": f"the library {why}; the entry point must be `{problem.signature}`",
                    "log": log[-LOG_LIMIT:],
                }
            )
        final = artifact_path(artifact_id, cache)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".kernel.so.{os.getpid()}")
        shutil.copyfile(library, tmp)
        os.replace(tmp, final)
        (final.parent / "kernel.c").write_text(source)
    return base.model_copy(update={"verdict": Verdict.ok, "artifact_id": artifact_id, "log": log[-LOG_LIMIT:]})


def _machine_or(failed: CompileResult, scratch: Path, compiler: str) -> CompileResult:
    """``failed`` -- a compiler run that exited with an error -- as the machine's failure (``harness_error``) when
    the machine cannot compile at all: its scratch disk is full, or a known-good source fails too
    (engine/harness/toolchain.py). Otherwise the candidate's, as it came."""
    if failed.verdict != Verdict.compile_error or failed.error_category == "timeout":
        return failed
    # What the candidate's compile wrote (an assembly file can take up to the file size limit) is not the
    # machine's shortage: a kernel could otherwise fill a nearly full disk itself and pass its error off as the
    # machine's. Its outputs go before the disk is measured; the sandbox is removed next anyway.
    for product in ("kernel.s", "kernel.so"):
        (scratch / product).unlink(missing_ok=True)
    fault = scratch_shortage(scratch) or canary_failure(
        lambda source, output: [compiler, *DEFAULT_FLAGS, *FORCED_FLAGS, "-o", output, source, "-lm"], COMPILE_LIMITS
    )
    if fault is None:
        return failed
    return failed.model_copy(
        update={
            "verdict": Verdict.harness_error,
            "error_category": "harness",
            "first_error": f"{fault} (the candidate's compile failed: {failed.first_error})",
        }
    )


COMPILE_HAD_ITS_CPU = HAD_ITS_CPU
"""Share of its wall-clock limit a gcc compile must have run on a CPU for a stop to be the source's fault."""


def _run_compiler(sandbox: Sandbox, command: list[str]) -> tuple[SandboxOutcome, CompilePatience]:
    """Run one compiler step in ``sandbox`` under COMPILE_LIMITS, its wall-clock limit stretched while a loaded
    machine slows it (engine/harness/compile_patience.py); the rule's decision comes back with the outcome."""
    patience = CompilePatience(COMPILE_LIMITS.wall_seconds, COMPILE_HAD_ITS_CPU)
    # The sandbox's own limit is the backstop: the watch stops the compile before it.
    limits = dataclasses.replace(COMPILE_LIMITS, wall_seconds=patience.longest_s + 5.0)
    process = sandbox.start(command, limits)
    outcome = process.finish(watch=patience.watch(lambda: tree_cpu_seconds(process.pid)))
    if patience.stop is None and outcome.killed:
        # The backstop stopped it (the watch could not): judged as the watch would have at the stretched limit.
        patience.decide(patience.longest_s, lambda: outcome.cpu_seconds_at_limit)
    return outcome, patience


def _failed_step(
    problem: Problem,
    outcome: SandboxOutcome,
    patience: CompilePatience,
    log: str,
    base: CompileResult,
    source_lines: int,
) -> CompileResult | None:
    """The result of a compiler run that failed (stopped, killed from outside, or exited non-zero), or None.
    ``source_lines``: the candidate's lines at the head of kernel.c."""
    if outcome.killed and patience.stop == "held":
        return base.model_copy(
            update={
                "verdict": Verdict.harness_error,
                "error_category": "harness",
                "first_error": (
                    f"compilation stopped: {outcome.killed}, so this is not the source's verdict; the step compiles "
                    "it again"
                ),
                "log": log[-LOG_LIMIT:],
            }
        )
    if outcome.killed:
        return base.model_copy(
            update={
                "error_category": "timeout",
                "first_error": f"compilation stopped: {outcome.killed}",
                "log": log[-LOG_LIMIT:],
            }
        )
    if outcome.setup_error or (outcome.signal is not None and outcome.signal not in KERNEL_SIGNALS):
        # The sandbox failed, or the compiler was killed from outside (the OOM killer, an operator).
        return base.model_copy(
            update={
                "verdict": Verdict.harness_error,
                "error_category": "harness",
                "first_error": outcome.setup_error
                or f"the compiler was killed by signal {outcome.signal} from outside the harness",
                "log": log[-LOG_LIMIT:],
            }
        )
    if outcome.exit_code != 0:
        category, first = categorize(log, problem, source_lines)
        if outcome.signal is not None or outcome.setup_error:
            category = "compiler_crash"
            first = outcome.setup_error or f"the compiler died from signal {outcome.signal}"
        return base.model_copy(update={"error_category": category, "first_error": first, "log": log[-LOG_LIMIT:]})
    return None


def screen_artifact(artifact_id: str, cache_dir: Path | None = None) -> ScreenResult:
    """The screen of a cached artifact, read again from disk: call it just before loading the library, so that
    one changed in the cache after it was built is refused too (a missing file is a ``not_elf`` violation)."""
    return screen_library(artifact_path(artifact_id, cache_dir))


SHIM_SOURCE = Path(__file__).with_name("fatal_shim.c")


def harness_shim(cache_dir: Path | None = None) -> Path | None:
    """The harness's fatal-signal reporter (engine/harness/fatal_shim.c) compiled for this machine, cached; None
    when it cannot be built (the harness then still works, with less crash evidence)."""
    source = SHIM_SOURCE.read_bytes()
    digest = hashlib.sha256(source + compiler_version().encode()).hexdigest()[:16]
    library = (cache_dir or config.cache_dir()) / "harness" / f"kf_shim-{digest}.so"
    if library.is_file():
        return library
    compiler = shutil.which(c_compiler())
    if compiler is None:
        return None
    library.parent.mkdir(parents=True, exist_ok=True)
    tmp = library.with_name(f".{library.name}.{os.getpid()}")
    run = subprocess.run(
        [compiler, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(SHIM_SOURCE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if run.returncode != 0:
        return None
    os.replace(tmp, library)
    return library


def _nm(library: Path, *options: str) -> list[list[str]]:
    run = subprocess.run(
        ["nm", *options, "--defined-only", str(library)], capture_output=True, text=True, timeout=30, check=False
    )
    return [line.split() for line in run.stdout.splitlines() if len(line.split()) == 3]


def _exported_functions(library: Path) -> set[str]:
    return {name for _, kind, name in _nm(library, "-D") if kind in ("T", "W", "i")}


def _defined_symbols(library: Path) -> set[str]:
    return {name for _, _, name in _nm(library)}


_KERNEL_LINE = re.compile(r"(?:^|\bfrom )kernel\.c:(\d+)")


def categorize(log: str, problem: Problem, source_lines: int | None = None) -> tuple[str, str]:
    """(category, first error) of a failed compile, from the compiler's output. ``source_lines``: how many lines of
    kernel.c are the candidate's (the harness appends the entry point's declaration after them)."""
    lines = log.splitlines()
    at = next((i for i, line in enumerate(lines) if "error:" in line), None)
    first = lines[at] if at is not None else None
    if at is not None and first is not None and source_lines is not None and "conflicting types" not in first:
        # Where the first error is: the error's own line, else the include chain above it, ends in kernel.c. Past
        # the candidate's last line means its code was still unfinished when it ended, and the compiler only
        # noticed in the harness's lines (or in the header they include): that error names nothing of the kernel.
        chain = [int(m.group(1)) for line in lines[max(0, at - 8) : at + 1] if (m := _KERNEL_LINE.search(line))]
        if chain and chain[-1] > source_lines:
            return "syntax", (
                "the source ends inside something unfinished (an unclosed parenthesis, brace, comment or "
                f"declaration): the compiler's first error is past its last line ({source_lines}), in what the "
                f"harness appends after it to declare the entry point: {first.strip()}"
            )
    if first is None or "ld returned" in first:
        linker = ("undefined reference", "multiple definition")
        first = next((line for line in lines if any(k in line for k in linker)), first)
    if first is None:
        return "other", (lines[-1] if lines else "the compiler failed without a message")
    text = first.lower()
    entry = re.escape(problem.entry)
    if re.search(rf"(conflicting types for|prototype for) {_QUOTE}{entry}{_QUOTE}", first):
        defined = next((line for line in lines if "previous definition of" in line), "")
        have = re.search(rf"with type {_QUOTE}([^'‘’`\"]*){_QUOTE}", defined)
        got = f"; the source defines it as `{have.group(1)}`" if have else ""
        return "wrong_signature", (f"{first.strip()} -- the entry point must be `{problem.signature}`{got}")
    if "undefined reference" in text or "ld returned" in text or "multiple definition" in text:
        return "linker", first.strip()
    if "internal compiler error" in text:
        return "compiler_crash", first.strip()
    if any(k in text for k in ("no such file or directory", "permission denied", "#error")):
        return "include", first.strip()
    if any(k in text for k in ("undeclared", "implicit declaration", "unknown type name", "has no member")):
        return "undeclared", first.strip()
    if any(
        k in text
        for k in ("expected", "stray", "unterminated", "missing terminating", "before", "invalid preprocessing")
    ):
        return "syntax", first.strip()
    if any(
        k in text
        for k in ("incompatible", "invalid operands", "conversion", "subscripted", "lvalue", "too few", "too many")
    ):
        return "type", first.strip()
    return "other", first.strip()
