"""A problem's streaming copy (the reference bench/evaluation.py times a memory-bound kernel against): it
compiles for every built-in problem it applies to, moves exactly the bytes of its outputs and same-shaped
inputs, and writes every output element, aligned or not, whatever the length."""

from __future__ import annotations

import ctypes
import platform
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import numpy as np
import pytest

from engine.harness.cpu import compile_source
from engine.harness.stream_copy import copy_bytes, stream_copy_source
from engine.harness.verdicts import Verdict
from engine.problems import Param, Problem, builtin_problems, load_problem

MEMORY_BOUND = ("rmsnorm", "l2norm", "add_rmsnorm", "layernorm", "softmax", "bias_gelu")


@pytest.mark.parametrize("name", MEMORY_BOUND)
def test_the_copy_of_every_memory_bound_problem_compiles_in_the_harness(name: str, tmp_path: Path) -> None:
    problem = load_problem(name)
    for streaming in (True, False):
        source = stream_copy_source(problem, streaming=streaming)
        assert source is not None
        compiled = compile_source(problem, source, cache_dir=tmp_path)
        assert compiled.verdict == Verdict.ok, compiled.first_error
    # Its bytes are the roofline model's, less the row-long inputs (a weight, a bias) it leaves in cache.
    for shape, _ in problem.benchmark_shapes:
        model = problem.roofline(shape)["bytes"]
        assert 0.95 * model <= copy_bytes(problem, shape) <= model


def test_a_problem_whose_output_reads_nothing_of_its_shape_has_no_copy() -> None:
    assert "matmul" in builtin_problems("cpu")
    assert stream_copy_source(load_problem("matmul")) is None  # C is (m, n), A and B are not


def _library(name: str, *, streaming: bool = True) -> ctypes.CDLL:
    source = stream_copy_source(load_problem(name), streaming=streaming)
    assert source is not None
    return _compiled(source)


def _compiled(source: str) -> ctypes.CDLL:
    folder = Path(tempfile.mkdtemp(prefix="kf-test-copy-"))
    (folder / "copy.c").write_text(source)
    subprocess.run(
        ["cc", "-O3", "-march=native", "-shared", "-fPIC", str(folder / "copy.c"), "-o", str(folder / "copy.so")],
        check=True,
    )
    return ctypes.CDLL(str(folder / "copy.so"))


def _pointer(array: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(array.ctypes.data)


@pytest.mark.parametrize("streaming", [True, False])
@pytest.mark.parametrize(("rows", "cols", "offset"), [(1, 1, 0), (3, 7, 1), (37, 129, 3), (64, 1023, 0), (5, 4099, 5)])
def test_the_copy_writes_every_output_from_the_sum_of_its_inputs(
    rows: int, cols: int, offset: int, streaming: bool
) -> None:
    # add_rmsnorm: x and residual in, h and y out (one shape), w of one row (not read). The outputs start
    # ``offset`` floats past an aligned address, so the head, the streamed chunks and the tail all run.
    library = _library("add_rmsnorm", streaming=streaming)
    rng = np.random.default_rng(rows * cols)
    x, residual = (rng.standard_normal(rows * cols, dtype=np.float32) for _ in range(2))
    w = np.ones(cols, dtype=np.float32)
    h_space, y_space = (np.full(rows * cols + offset + 64, np.nan, dtype=np.float32) for _ in range(2))
    h, y = h_space[offset : offset + rows * cols], y_space[offset : offset + rows * cols]
    library.add_rmsnorm(
        _pointer(x),
        _pointer(residual),
        _pointer(w),
        _pointer(h),
        _pointer(y),
        ctypes.c_int64(rows),
        ctypes.c_int64(cols),
        ctypes.c_float(1e-6),
    )
    np.testing.assert_array_equal(h, x + residual)
    np.testing.assert_array_equal(y, x + residual)
    # Nothing written before or past the outputs.
    for space in (h_space, y_space):
        assert np.isnan(space[:offset]).all() and np.isnan(space[offset + rows * cols :]).all()


def test_parameter_names_of_a_users_problem_do_not_collide_with_the_copys_own() -> None:
    # A user's problem may name its arrays and sizes anything, e.g. i, n, q and t; the copy's locals are kf_*.
    problem = SimpleNamespace(
        name="clash",
        signature="void clash(const float *i, float *n, int64_t q, int64_t t)",
        params=[
            Param("i", "in", "float32", ("q", "t")),
            Param("n", "out", "float32", ("q", "t")),
            Param("q", "size", "int64"),
            Param("t", "size", "int64"),
        ],
    )
    source = stream_copy_source(cast(Problem, problem))
    assert source is not None
    library = _compiled(source)
    rows, cols = 9, 130
    x = np.arange(rows * cols, dtype=np.float32)
    y = np.full(rows * cols, np.nan, dtype=np.float32)
    library.clash(_pointer(x), _pointer(y), ctypes.c_int64(rows), ctypes.c_int64(cols))
    np.testing.assert_array_equal(y, x)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="streaming stores are an x86 instruction")
def test_only_the_streaming_copy_has_streaming_stores(tmp_path: Path) -> None:
    # The two copies differ in their stores only: the plain one is the floor where streaming stores are slow.
    for streaming in (True, False):
        source = stream_copy_source(load_problem("softmax"), streaming=streaming)
        assert source is not None
        (tmp_path / "copy.c").write_text(source)
        assembly = subprocess.run(
            ["cc", "-O3", "-march=native", "-S", "-o", "-", str(tmp_path / "copy.c")],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        assert ("movntps" in assembly) == streaming
        assert ("sfence" in assembly) == streaming
