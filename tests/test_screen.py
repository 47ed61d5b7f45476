"""The screen of built libraries and the include rule: a kernel that would run code at load time or call
outside the allow-list is ``forbidden``; one whose includes name paths never reaches the compiler; ordinary
kernels, seeds and template settings stay clean."""

from __future__ import annotations

import ctypes
import itertools
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.hardware import c_compiler
from engine.harness import cpu
from engine.harness.cpu import DEFAULT_FLAGS, FORCED_FLAGS, artifact_path, compile_source, screen_artifact
from engine.harness.includes import include_refusal
from engine.harness.screen import ViolationKind, screen_library
from engine.harness.verdicts import CompileResult, Verdict
from engine.problems import Problem, builtin_problems, load_problem

HEADER = "#include <math.h>\n#include <stdint.h>\n#include <stdlib.h>\n"
ENTRY = "void softmax(const float *x, float *y, int64_t rows, int64_t cols)"
SOFTMAX = """
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; c++) yr[c] /= s;
    }
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kf-cache")


def kernel(before: str = "", inside: str = "", includes: str = "") -> str:
    """A correct softmax that also does ``inside`` at each call, with ``before`` at file scope."""
    return f"{includes}{HEADER}{before}\n{ENTRY} {{\n{inside}\n{SOFTMAX}}}\n"


def softmax(source: str, cache: Path, flags: list[str] | None = None) -> CompileResult:
    return compile_source(load_problem("softmax"), source, flags or DEFAULT_FLAGS, cache_dir=cache)


FORBIDDEN = {
    "constructor": (
        kernel("__attribute__((constructor)) static void on_load(void) { abort(); }"),
        "constructor",
        ".init_array",
    ),
    "destructor": (
        kernel("__attribute__((destructor)) static void on_unload(void) { abort(); }"),
        "destructor",
        ".fini_array",
    ),
    "init-function": (kernel("void _init(void) { abort(); }"), "constructor", "DT_INIT"),
    "atexit": (kernel("static void bye(void) { abort(); }", "atexit(bye);"), "symbol", "atexit"),
    "fopen": (
        kernel(inside='FILE *f = fopen("/etc/passwd", "r"); if (f) fclose(f);', includes="#include <stdio.h>\n"),
        "symbol",
        "fopen",
    ),
    "open": (kernel(inside='(void)open("/etc/passwd", O_RDONLY);', includes="#include <fcntl.h>\n"), "symbol", "open"),
    "fork": (kernel(inside="if (fork() == 0) abort();", includes="#include <unistd.h>\n"), "symbol", "fork"),
    "socket": (
        kernel(inside="(void)socket(AF_INET, SOCK_STREAM, 0);", includes="#include <sys/socket.h>\n"),
        "symbol",
        "socket",
    ),
    "syscall": (
        kernel(
            inside="(void)syscall(SYS_getpid);",
            includes="#define _GNU_SOURCE\n#include <sys/syscall.h>\n#include <unistd.h>\n",
        ),
        "symbol",
        "syscall",
    ),
    "sched_setaffinity": (
        kernel(
            inside="cpu_set_t all; CPU_ZERO(&all); CPU_SET(1, &all); sched_setaffinity(0, sizeof all, &all);",
            includes="#define _GNU_SOURCE\n#include <sched.h>\n",
        ),
        "symbol",
        "sched_setaffinity",
    ),
    "pthread_create": (
        kernel(
            "static void *idle(void *arg) { return arg; }",
            "pthread_t t; if (pthread_create(&t, 0, idle, 0) == 0) pthread_detach(t);",
            includes="#include <pthread.h>\n",
        ),
        "symbol",
        "pthread_create",
    ),
    "ifunc": (
        kernel(
            "static void fast(void) {}\nstatic void (*pick(void))(void) { return fast; }\n"
            'void helper(void) __attribute__((ifunc("pick")));',
            "helper();",
        ),
        "ifunc",
        "helper",
    ),
    "getenv": (kernel(inside='if (getenv("HOME")) abort();'), "symbol", "getenv"),
}


@pytest.mark.parametrize(("source", "kind", "name"), FORBIDDEN.values(), ids=FORBIDDEN.keys())
def test_forbidden_libraries_are_refused(source: str, kind: str, name: str, cache: Path) -> None:
    result = softmax(source, cache)
    assert result.verdict == Verdict.forbidden, result.model_dump_json(indent=1)
    assert result.artifact_id is None
    assert result.error_category == f"forbidden_{result.screen[0].kind}"
    assert result.first_error == result.screen[0].message
    named = [v for v in result.screen if v.kind == kind and name in v.name]
    assert named, result.screen
    assert name in named[0].message  # the message names what is forbidden


def test_a_forbidden_verdict_is_cached(cache: Path) -> None:
    source, _, _ = FORBIDDEN["fork"]
    first = softmax(source, cache)
    again = softmax(source, cache)
    assert again.cached and again.verdict == Verdict.forbidden
    assert again.screen == first.screen and again.error_category == first.error_category


@pytest.mark.parametrize("name", builtin_problems("cpu"))
def test_seeds_pass_the_screen(name: str, cache: Path) -> None:
    problem = load_problem(name)
    result = compile_source(problem, problem.seed_source(), cache_dir=cache)
    assert result.verdict == Verdict.ok, result.first_error
    assert result.artifact_id and screen_artifact(result.artifact_id, cache).ok


def covering_settings(problem: Problem, seed: int = 0) -> list[dict[str, Any]]:
    """Allowed template settings that between them give every parameter each of its values at least once."""
    names = list(problem.template_params)
    allowed = [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*problem.template_params.values())
        if problem.template_allows(dict(zip(names, values, strict=True)))
    ]
    random.Random(seed).shuffle(allowed)
    chosen, covered = [], set()
    for setting in allowed:
        pairs = {(k, str(v)) for k, v in setting.items()}
        if pairs - covered:
            chosen.append(setting)
            covered |= pairs
    return chosen


@pytest.mark.parametrize("name", builtin_problems("cpu"))
def test_template_settings_pass_the_screen(name: str, cache: Path) -> None:
    problem = load_problem(name)
    if problem.template_source() is None:
        pytest.skip(f"{name} has no template")
    for setting in covering_settings(problem):
        result = compile_source(problem, problem.render_template(setting), cache_dir=cache)
        assert result.verdict == Verdict.ok, (setting, result.first_error, result.screen)


ORDINARY = {
    "openmp-math": (
        kernel(
            "static float keep(float v) { return v + 0.0f * sqrtf(fabsf(v)) * erff(v); }",
            "#pragma omp parallel for\nfor (int64_t r = 0; r < rows; r++) y[r * cols] = keep(x[r * cols]);",
        ),
        ["-O2", "-march=native", "-fopenmp"],
    ),
    "omp-simd": (
        kernel(
            inside="float t = 0.0f;\n#pragma omp simd reduction(+:t)\nfor (int64_t c = 0; c < cols; c++) t += x[c];"
        ),
        DEFAULT_FLAGS,
    ),
    "printf": (
        kernel(inside='printf("rows %ld\\n", (long)rows); fflush(stdout);', includes="#include <stdio.h>\n"),
        DEFAULT_FLAGS,
    ),
    "thread-local": (
        kernel("static _Thread_local float scratch[16];", "scratch[0] = x[0]; if (scratch[0] != x[0]) abort();"),
        DEFAULT_FLAGS,
    ),
    "scratch-memory": (
        kernel(
            inside="float *t = malloc(64 * sizeof *t); if (!t) abort(); memset(t, 0, 64 * sizeof *t); free(t);",
            includes="#include <string.h>\n",
        ),
        DEFAULT_FLAGS,
    ),
}


@pytest.mark.parametrize(("source", "flags"), ORDINARY.values(), ids=ORDINARY.keys())
def test_ordinary_kernels_pass_and_still_load(source: str, flags: list[str], cache: Path) -> None:
    result = softmax(source, cache, flags)
    assert result.verdict == Verdict.ok, (result.first_error, result.screen)
    assert result.artifact_id is not None and result.screen == []
    # -nostartfiles leaves out the C runtime's start files: the library must still load and compute.
    library = ctypes.CDLL(str(artifact_path(result.artifact_id, cache)))
    x = np.random.default_rng(0).standard_normal((4, 33)).astype(np.float32)
    y = np.zeros_like(x)
    library.softmax.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    library.softmax(x.ctypes.data, y.ctypes.data, 4, 33)
    expected = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, expected / expected.sum(axis=1, keepdims=True), rtol=1e-4)


def test_garbage_and_missing_files_are_not_elf(tmp_path: Path, cache: Path) -> None:
    garbage = tmp_path / "kernel.so"
    garbage.write_bytes(b"\x7fELF not really" + bytes(100))
    missing = tmp_path / "absent.so"
    ok = softmax(kernel(), cache)
    assert ok.artifact_id is not None
    truncated = tmp_path / "truncated.so"
    truncated.write_bytes(artifact_path(ok.artifact_id, cache).read_bytes()[:200])
    for path in (garbage, missing, truncated):
        result = screen_library(path)
        assert [v.kind for v in result.violations] == [ViolationKind.not_elf], (path, result)
        assert not result.ok and str(path) in result.violations[0].message


def test_an_artifact_changed_in_the_cache_is_screened_again(tmp_path: Path, cache: Path) -> None:
    ok = softmax(kernel(inside="/* the one that gets replaced */"), cache)
    assert ok.artifact_id is not None and screen_artifact(ok.artifact_id, cache).ok
    compiler = shutil.which(c_compiler())
    assert compiler is not None
    source = tmp_path / "tampered.c"
    source.write_text(FORBIDDEN["constructor"][0])
    built = tmp_path / "tampered.so"
    subprocess.run([compiler, "-O2", *FORCED_FLAGS, "-o", str(built), str(source), "-lm"], check=True)
    shutil.copyfile(built, artifact_path(ok.artifact_id, cache))
    result = screen_artifact(ok.artifact_id, cache)
    assert not result.ok and result.violations[0].kind == ViolationKind.constructor


REFUSED_INCLUDES = {
    "absolute": ('#include "/etc/hostname"\n', 1),
    "dotdot": ('#include "../../etc/passwd"\n', 1),
    "dev-urandom": ("#include </dev/urandom>\n", 1),
    "splice": ('#include <stdint.h>\n#inc\\\nlude "/dev/zero"\n', 2),
    "comment": ('#/**/include "/dev/zero"\n', 1),
    "comment-across-lines": ('#include <math.h>\n#/*\n*/include "/dev/zero"\n', 2),
    "trigraph": ('??=include "/dev/zero"\n', 1),
    "trigraph-splice": ('// harmless ??/\n#include "/dev/zero"\n', 2),
    "digraph": ('%:include "/dev/zero"\n', 1),
    "computed": ('#define TARGET "/dev/zero"\n#include TARGET\n', 2),
    "pragma-dependency": ('#pragma GCC dependency "/dev/zero"\n', 1),
    "pragma-operator": ('_Pragma("GCC dependency \\"/dev/zero\\"")\n', 1),
    "has-include": ('#if __has_include("/dev/zero")\n#endif\n', 1),
    "include-next": ('#include_next "../x.h"\n', 1),
    "embed": ('static const char z[] = {\n#embed "/dev/zero"\n};\n', 2),
    "incbin": ('__asm__(".incbin \\"/dev/zero\\"");\n', 1),
}


@pytest.mark.parametrize(("directive", "line"), REFUSED_INCLUDES.values(), ids=REFUSED_INCLUDES.keys())
def test_includes_of_paths_are_refused_before_compiling(
    directive: str, line: int, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_compiler(*args: object, **kwargs: object) -> None:
        raise AssertionError("the compiler ran on a source the include rule refuses")

    monkeypatch.setattr(cpu, "Sandbox", no_compiler)
    result = softmax(directive + kernel(), cache)
    assert (result.verdict, result.error_category) == (Verdict.compile_error, "include")
    assert result.first_error and result.first_error.startswith(f"line {line}:"), result.first_error
    assert "include only system headers by name" in result.first_error


# Assembler directives that read a file, spelt so that no source screen sees them: only the compiler puts them
# together, so only its assembly shows them. Each names a file that is always there and harmless (the sandbox's
# own kernel.c; /dev/null, which .incbin refuses), so without the assembly check every one of them compiles.
PIECED_DIRECTIVES = {
    "joined-literals": '__asm__(".inc" "bin \\"kernel.c\\"");\n',
    "joined-include": '__asm__(".inc" "lude \\"/dev/null\\"");\n',
    "upper-case": '__asm__(".INC" "BIN \\"kernel.c\\"");\n',
    "macro-pasted": '__asm__(".macro kf_read\\n.inc\\\\()bin \\"kernel.c\\"\\n.endm\\nkf_read");\n',
    "irpc-pasted": '__asm__(".irpc kf_c,b\\n.inc\\\\kf_c\\\\()in \\"kernel.c\\"\\n.endr");\n',
}


@pytest.mark.parametrize("directive", PIECED_DIRECTIVES.values(), ids=PIECED_DIRECTIVES.keys())
def test_file_directives_the_compiler_puts_together_are_refused(directive: str, cache: Path) -> None:
    assert include_refusal(directive + kernel()) is None  # out of the source screen's sight: the assembly's turn
    result = softmax(directive + kernel(), cache)
    assert (result.verdict, result.error_category) == (Verdict.compile_error, "include"), result
    assert result.first_error and "however their text is put together" in result.first_error
    assert result.artifact_id is None


def test_header_names_stay_allowed() -> None:
    source = (
        '#include <math.h>\n#  include <sys/types.h>\n#include "local.h"\n#include <immintrin.h>\n'
        "#ifdef __has_include\n#if __has_include(<omp.h>)\n#endif\n#endif\n"
        '#pragma omp simd\n#pragma GCC unroll 4\n_Pragma("omp parallel for")\n'
        "/* see ../notes and /usr/include/math.h */\nint include = 1; // include guards, a / b\n"
    )
    assert include_refusal(source) is None
