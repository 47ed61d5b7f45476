"""The CPU backend: content-addressed, cached builds from allow-listed flags, and structured compile errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.hardware import cpu_target, hardware_fingerprint
from engine.harness.cpu import DEFAULT_FLAGS, artifact_path, compile_source, disallowed_flags
from engine.harness.verdicts import Verdict
from engine.problems import builtin_problems, load_problem

HEADER = "#include <math.h>\n#include <stdint.h>\n"
SOFTMAX_ARGS = "const float *x, float *y, int64_t rows, int64_t cols"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kf-cache")


@pytest.mark.parametrize("name", builtin_problems("cpu"))
def test_seed_of_every_problem_compiles_to_a_cached_artifact(name: str, cache: Path) -> None:
    problem = load_problem(name)
    first = compile_source(problem, problem.seed_source(), cache_dir=cache)
    assert first.verdict == Verdict.ok, first.first_error
    assert first.artifact_id and artifact_path(first.artifact_id, cache).is_file()
    assert first.flags == DEFAULT_FLAGS and first.target == cpu_target() and not first.cached
    again = compile_source(problem, problem.seed_source(), cache_dir=cache)
    assert again.cached and again.artifact_id == first.artifact_id


def test_artifact_id_covers_source_and_flags(cache: Path) -> None:
    problem = load_problem("softmax")
    base = compile_source(problem, problem.seed_source(), ["-O2"], cache_dir=cache)
    other_flags = compile_source(problem, problem.seed_source(), "-O2 -funroll-loops", cache_dir=cache)
    other_source = compile_source(problem, problem.seed_source() + "\n/* edited */\n", ["-O2"], cache_dir=cache)
    ids = {base.artifact_id, other_flags.artifact_id, other_source.artifact_id}
    assert len(ids) == 3 and None not in ids
    assert other_flags.flags == ["-O2", "-funroll-loops"]  # a string is split like a shell would


@pytest.mark.parametrize(
    ("source", "category", "says"),
    [
        (f"{HEADER}void softmax({SOFTMAX_ARGS}) {{ y[0] = ; }}", "syntax", "expected expression"),
        (f"{HEADER}void softmax({SOFTMAX_ARGS}) {{ y[0] = undefined_thing; }}", "undeclared", "undefined_thing"),
        (f"#include <stdint.h>\nvoid softmax({SOFTMAX_ARGS}) {{ y[0] = expf(x[0]); }}", "undeclared", "expf"),
        (f"{HEADER}void softmax_v2({SOFTMAX_ARGS}) {{ }}", "missing_entry", "softmax_v2"),
        (f"{HEADER}void softmax(const float *x, float *y, int64_t n) {{ }}", "wrong_signature", "must be"),
        (f"{HEADER}void softmax(float *x, float *y, int64_t rows, int64_t cols) {{ }}", "wrong_signature", "float *"),
        (f"{HEADER}void helper(void);\nvoid softmax({SOFTMAX_ARGS}) {{ helper(); }}", "linker", "helper"),
        ('#include "nonexistent/header.h"\n', "include", "nonexistent"),
        # A source cut short: the compiler first trips over what the harness appends (or a header it includes),
        # and the message says the source ended unfinished rather than quoting a system header's line alone.
        ("int truncated(\n", "syntax", "the source ends inside something unfinished"),
        (f"{HEADER}void softmax({SOFTMAX_ARGS}) {{\n  for (;;) {{\n", "syntax", "past its last line (4)"),
        # An unterminated comment must not end at a comment the harness appends and leave no entry point.
        (f"/* never closed\n{HEADER}void softmax({SOFTMAX_ARGS}) {{ }}\n", "syntax", "unterminated comment"),
    ],
    ids=[
        "syntax",
        "undeclared",
        "no-header",
        "missing-entry",
        "fewer-params",
        "non-const",
        "linker",
        "include",
        "cut-short",
        "open-brace",
        "open-comment",
    ],
)
def test_compile_errors_are_structured(source: str, category: str, says: str, cache: Path) -> None:
    result = compile_source(load_problem("softmax"), source, cache_dir=cache)
    assert result.verdict == Verdict.compile_error
    assert result.error_category == category, result.log
    assert result.first_error and says in result.first_error
    assert result.artifact_id is None
    cached = compile_source(load_problem("softmax"), source, cache_dir=cache)
    assert cached.cached and cached.error_category == category


def test_static_entry_is_missing(cache: Path) -> None:
    source = f"{HEADER}static void softmax({SOFTMAX_ARGS}) {{ }}\nvoid (*keep)({SOFTMAX_ARGS}) = softmax;\n"
    result = compile_source(load_problem("softmax"), source, cache_dir=cache)
    assert result.error_category == "missing_entry"
    assert "static" in (result.first_error or "")


@pytest.mark.parametrize("flags", [["-o", "/tmp/elsewhere"], ["-I/etc"], ["-Wl,-rpath,/tmp"], ["-fplugin=x.so"]])
def test_disallowed_flags_are_refused(flags: list[str], cache: Path) -> None:
    problem = load_problem("softmax")
    result = compile_source(problem, problem.seed_source(), flags, cache_dir=cache)
    assert result.error_category == "disallowed_flag"
    assert flags[0] in (result.first_error or "")


def test_allowed_flags_include_defines_and_tuning() -> None:
    assert disallowed_flags(["-O3", "-march=native", "-ffast-math", "-funroll-loops", "-DBLOCK=64", "-DFAST"]) == []
    assert disallowed_flags(["-DX=$(rm -rf /)", "-include", "x.h"]) == ["-DX=$(rm -rf /)", "-include", "x.h"]


def test_compiler_is_never_asked_for_private_files(cache: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.h"
    secret.write_text("int leaked = 1;\n")
    secret.chmod(0o600)
    source = f'#include "{secret}"\n{HEADER}void softmax({SOFTMAX_ARGS}) {{ }}\n'
    result = compile_source(load_problem("softmax"), source, cache_dir=cache)
    # Refused before the compiler runs (no compiler output): an include names a header, never a path.
    assert result.error_category == "include" and result.log == ""
    assert str(secret) in (result.first_error or "") and "absolute path" in (result.first_error or "")


def test_artifact_path_rejects_non_hashes() -> None:
    with pytest.raises(ValueError, match="sha256"):
        artifact_path("../../etc/passwd")


def test_target_and_fingerprint() -> None:
    assert re.fullmatch(r"cpu-[a-z0-9_]+(-[a-z0-9]+)?", cpu_target())
    fingerprint = hardware_fingerprint(threads=1)
    assert fingerprint.cores_used == 1 and len(fingerprint.cpus) == 1
    assert fingerprint.cpu_model and fingerprint.compiler and fingerprint.kernel
