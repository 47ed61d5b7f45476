"""The built-in problem suite and the problem-folder format (docs/problems.md).

Fast and sandbox-free: these tests check the problems' Python side (inputs, reference, baseline,
tolerances, roofline, templates as text). That the seeds and templates compile and pass validation is the
harness's business and is tested with it.
"""

from __future__ import annotations

import itertools
import math
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.errors import ProblemDefinitionError, UnknownProblemError, UserError
from engine.harness.benchmarking import Reference, benchmark_artifact
from engine.harness.cpu import DEFAULT_FLAGS, compile_source
from engine.harness.verdicts import Verdict
from engine.problems import Problem, builtin_problems, load_problem

SUITE = ["add_rmsnorm", "bias_gelu", "kda", "l2norm", "layernorm", "matmul", "rmsnorm", "softmax"]
DOCS = Path(__file__).resolve().parent.parent / "docs" / "problems.md"


@pytest.fixture(scope="module", params=SUITE)
def problem(request: pytest.FixtureRequest) -> Problem:
    return load_problem(request.param)


def _worst_ratio(
    problem: Problem,
    got: dict[str, np.ndarray],
    ref: dict[str, np.ndarray],
    shape: dict[str, int],
    inputs: dict[str, Any],
) -> float:
    """max |got − ref| / (atol + rtol·|ref|) over every output: ≤ 1 passes, NaN counts as a failure."""
    worst = 0.0
    for p in problem.outputs:
        atol, rtol = problem.tolerance(p.dtype, shape, inputs)
        diff = np.abs(np.asarray(got[p.name], dtype=np.float64) - ref[p.name])
        ratio = diff / (atol + rtol * np.abs(ref[p.name]))
        worst = max(worst, float(np.nan_to_num(ratio, nan=np.inf).max(initial=0.0)))
    return worst


def test_every_builtin_problem_loads() -> None:
    assert set(SUITE) <= set(builtin_problems())
    for name in SUITE:
        problem = load_problem(name)
        assert problem.name == name and problem.entry == name
        assert re.match(rf"void {name}\(", problem.signature)
        assert problem.template_source() is not None and problem.seed_source().strip()
        assert f" {name}(" in problem.seed_source()
        assert set(problem.distributions) >= {"normal", "uniform", "large", "edge"}


def test_params_match_signature(problem: Problem) -> None:
    """PARAMS is the ABI: same names, same order as the C prototype, and arrays sized by size params."""
    names = re.findall(r"(\w+)\s*(?:,|\))", problem.signature)
    assert names == [p.name for p in problem.params]
    sizes = {p.name for p in problem.params if p.role == "size"}
    for p in problem.params:
        assert set(p.shape) <= sizes
    for shape in problem.validation_shapes + [s for s, _ in problem.benchmark_shapes]:
        assert set(shape) == sizes


def test_baseline_agrees_with_reference_within_tolerance(problem: Problem) -> None:
    """Guards the tolerances from below: what a numpy user writes in float32 must pass them everywhere."""
    for shape in problem.validation_shapes:
        for distribution in problem.distributions:
            for seed in (0, 1):
                inputs = problem.make_inputs(shape, distribution, seed)
                ref = problem.reference(inputs, shape)
                got = problem.baseline(inputs, shape)
                for p in problem.outputs:
                    assert got[p.name].dtype == np.dtype(p.dtype)
                    assert ref[p.name].shape == p.dims(shape) == got[p.name].shape
                    assert np.isfinite(ref[p.name]).all(), (shape, distribution, p.name)
                worst = _worst_ratio(problem, got, ref, shape, inputs)
                assert worst <= 1.0, f"baseline off by {worst:.3g}x the tolerance on {shape} {distribution} seed {seed}"


def test_half_precision_fails_the_tolerance(problem: Problem) -> None:
    """Guards the tolerances from above: the baseline's answer rounded to half precision must fail."""
    failed = 0
    for shape in problem.validation_shapes:
        inputs = problem.make_inputs(shape, "normal", 0)
        ref = problem.reference(inputs, shape)
        half = {k: v.astype(np.float16).astype(np.float32) for k, v in problem.baseline(inputs, shape).items()}
        failed += _worst_ratio(problem, half, ref, shape, inputs) > 1.0
    assert failed >= len(problem.validation_shapes) // 2


def test_make_inputs_is_deterministic_per_seed(problem: Problem) -> None:
    shape = problem.validation_shapes[-1]
    for distribution in problem.distributions:
        first = problem.make_inputs(shape, distribution, 7)
        again = problem.make_inputs(shape, distribution, 7)
        other = problem.make_inputs(shape, distribution, 8)
        assert first.keys() == again.keys()
        for name in first:
            np.testing.assert_array_equal(first[name], again[name])
        arrays = [n for n in first if np.ndim(first[n]) > 0]
        assert any(not np.array_equal(first[n], other[n]) for n in arrays)


def test_inputs_are_finite_and_of_the_declared_dtypes(problem: Problem) -> None:
    for shape in problem.validation_shapes:
        for distribution in problem.distributions:
            inputs = problem.make_inputs(shape, distribution, 3)
            for p in problem.params:
                if p.role in ("in", "inout", "scalar"):
                    value = np.asarray(inputs[p.name])
                    assert value.dtype == np.dtype(p.dtype), (p.name, value.dtype)
                    if (problem.name, distribution) == ("softmax", "masked"):
                        # Masked attention scores: -inf where masked, never +inf or NaN, and never a whole row.
                        assert not np.isnan(value).any() and not (value == np.inf).any()
                        assert np.isfinite(value).any(axis=1).all(), shape
                    else:
                        assert np.isfinite(value).all(), (p.name, shape, distribution)


def test_kda_inputs_are_as_models_feed_them() -> None:
    kda = load_problem("kda")
    for shape in kda.validation_shapes:
        for distribution in kda.distributions:
            inputs = kda.make_inputs(shape, distribution, 5)
            norms = np.linalg.norm(inputs["k"].astype(np.float64), axis=-1)
            np.testing.assert_allclose(norms, 1.0, rtol=1e-5)
            assert (inputs["g"] <= 0).all()
            assert ((inputs["beta"] > 0) & (inputs["beta"] < 1)).all()


def test_kda_edge_inputs_reach_the_extremes() -> None:
    kda = load_problem("kda")
    inputs = kda.make_inputs({"T": 64, "H": 4, "DK": 16, "DV": 8}, "edge", 0)
    assert inputs["g"].max() > -1e-6 and inputs["g"].min() < -50
    assert inputs["beta"].min() < 1e-5 and inputs["beta"].max() > 1 - 1e-5


def test_rmsnorm_eps_is_a_float32_scalar_and_keeps_zero_rows_defined() -> None:
    rmsnorm = load_problem("rmsnorm")
    assert [p.name for p in rmsnorm.params if p.role == "scalar"] == ["eps"]
    shape = {"rows": 64, "cols": 33}
    inputs = rmsnorm.make_inputs(shape, "edge", 0)
    assert isinstance(inputs["eps"], np.float32) and inputs["eps"] > 0
    zero_rows = ~inputs["x"].any(axis=1)
    assert zero_rows.any()
    y = rmsnorm.reference(inputs, shape)["y"]
    assert (y[zero_rows] == 0).all() and np.isfinite(y).all()


def test_l2norm_divides_rows_below_eps_by_eps_and_keeps_zero_rows_zero() -> None:
    l2norm = load_problem("l2norm")
    shape = {"rows": 64, "cols": 33}
    inputs = l2norm.make_inputs(shape, "edge", 0)
    x, eps = inputs["x"].astype(np.float64), float(inputs["eps"])
    y = l2norm.reference(inputs, shape)["y"]
    norms = np.linalg.norm(x, axis=1)
    zero, tiny, normal = norms == 0, (norms > 0) & (norms < eps), norms >= eps
    assert zero.any() and tiny.any() and normal.any()
    assert (y[zero] == 0).all() and np.isfinite(y).all()
    np.testing.assert_allclose(y[tiny], x[tiny] / eps)
    np.testing.assert_allclose(np.linalg.norm(y[normal], axis=1), 1.0)


def test_add_rmsnorm_writes_the_sum_and_normalises_it() -> None:
    """h is x + residual; y is rmsnorm of h: edge rows where x cancels the residual stay defined through eps."""
    add_rmsnorm, rmsnorm = load_problem("add_rmsnorm"), load_problem("rmsnorm")
    shape = {"rows": 64, "cols": 33}
    inputs = add_rmsnorm.make_inputs(shape, "edge", 0)
    out = add_rmsnorm.reference(inputs, shape)
    h = inputs["x"].astype(np.float64) + inputs["residual"]
    np.testing.assert_array_equal(out["h"], h)
    assert (~h.any(axis=1)).any() and np.isfinite(out["y"]).all()
    alone = rmsnorm.reference({"x": h, "w": inputs["w"], "eps": inputs["eps"]}, shape)["y"]
    np.testing.assert_allclose(out["y"], alone)


def test_layernorm_offset_rows_fail_a_one_pass_variance_and_constant_rows_give_the_bias() -> None:
    """Rows whose mean is large next to their spread: float32 E[x^2] - E[x]^2 (numpy's pairwise sums, more accurate
    than a kernel's running ones) fails the tolerance, the variance about the mean passes. A constant row's y is b
    exactly, and every edge trial of five rows or more has one."""
    problem = load_problem("layernorm")
    shape = {"rows": 64, "cols": 4099}
    for seed in range(3):
        inputs = problem.make_inputs(shape, "offset", seed)
        x, w, b, eps = inputs["x"], inputs["w"], inputs["b"], inputs["eps"]
        mean = x.mean(axis=1, keepdims=True, dtype=np.float32)
        squares = (x * x).mean(axis=1, keepdims=True, dtype=np.float32)
        about_mean = ((x - mean) ** 2).mean(axis=1, keepdims=True, dtype=np.float32)
        reference = problem.reference(inputs, shape)
        one_pass = {"y": (x - mean) / np.sqrt(squares - mean * mean + eps) * w + b}
        two_pass = {"y": (x - mean) / np.sqrt(about_mean + eps) * w + b}
        assert _worst_ratio(problem, one_pass, reference, shape, inputs) > 1
        assert _worst_ratio(problem, two_pass, reference, shape, inputs) < 0.5
    edge_shape = {"rows": 5, "cols": 33}
    for seed in range(10):
        inputs = problem.make_inputs(edge_shape, "edge", seed)
        constant = np.flatnonzero((inputs["x"] == inputs["x"][:, :1]).all(axis=1))
        assert constant.size, f"seed {seed}: no constant row"
        y = problem.reference(inputs, edge_shape)["y"]
        np.testing.assert_array_equal(y[constant], np.broadcast_to(inputs["b"], (constant.size, 33)))


def test_bias_gelu_reference_erfc_is_float64_accurate() -> None:
    """The reference's erfc (problem.py's _erfc64) against math.erfc: the accuracy docs/problems.md states."""
    module = load_problem("bias_gelu").module
    u = np.concatenate([np.linspace(-6.0, 26.0, 20001), np.geomspace(1e-12, 6.0, 500), -np.geomspace(1e-12, 6.0, 500)])
    exact = np.array([math.erfc(v) for v in u])
    got = module._erfc64(u)
    assert np.max(np.abs(got - exact) / exact) < 1e-12
    assert module._erfc64(np.array([np.inf, -np.inf, 1e300])).tolist() == [0.0, 2.0, 0.0]


def test_bias_gelu_rejects_the_tanh_approximation() -> None:
    """The problem is the exact erf GELU: the cheaper tanh form must fail the tolerance."""
    problem = load_problem("bias_gelu")
    shape = {"rows": 17, "cols": 129}
    inputs = problem.make_inputs(shape, "normal", 0)
    z = (inputs["x"] + inputs["b"]).astype(np.float64)
    tanh_form = 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
    assert _worst_ratio(problem, {"y": tanh_form}, problem.reference(inputs, shape), shape, inputs) > 1


def test_tolerance_grows_with_the_inputs_where_the_problem_says_so() -> None:
    matmul = load_problem("matmul")
    small, large = {"m": 4, "n": 4, "k": 16}, {"m": 4, "n": 4, "k": 1024}
    atol_small, rtol = matmul.tolerance("float32", small, matmul.make_inputs(small, "normal", 0))
    atol_large, _ = matmul.tolerance("float32", large, matmul.make_inputs(large, "normal", 0))
    atol_big_values, _ = matmul.tolerance("float32", large, matmul.make_inputs(large, "large", 0))
    assert atol_small < atol_large < atol_big_values
    assert matmul.tolerance("float32") == (1e-5, rtol)  # without the trial: the fixed TOLERANCES


def test_dropping_one_term_of_a_dot_product_fails() -> None:
    matmul = load_problem("matmul")
    shape = {"m": 17, "n": 33, "k": 129}
    inputs = matmul.make_inputs(shape, "normal", 0)
    partial = inputs["a"][:, 1:].astype(np.float64) @ inputs["b"][1:, :]
    assert _worst_ratio(matmul, {"c": partial}, matmul.reference(inputs, shape), shape, inputs) > 1


def test_every_allowed_template_combination_renders(problem: Problem) -> None:
    names = sorted(problem.template_params)
    assert names, "every built-in problem has a tunable template"
    allowed = 0
    for values in itertools.product(*(problem.template_params[n] for n in names)):
        params = dict(zip(names, values, strict=True))
        if not problem.template_allows(params):
            continue
        allowed += 1
        source = problem.render_template(params)
        assert "{{" not in source and "}}" not in source
        assert f" {problem.entry}(" in source
    assert allowed >= 2


def test_template_placeholders_are_exactly_the_template_params(problem: Problem) -> None:
    source = problem.template_source() or ""
    assert set(re.findall(r"\{\{([A-Z_][A-Z0-9_]*)\}\}", source)) == set(problem.template_params)


def test_roofline_is_positive_ints(problem: Problem) -> None:
    for shape in problem.validation_shapes + [s for s, _ in problem.benchmark_shapes]:
        model = problem.roofline(shape)
        assert set(model) >= {"bytes", "flops"}
        for key in ("bytes", "flops"):
            assert isinstance(model[key], int) and model[key] > 0, (shape, key, model[key])


def test_benchmark_weights_are_positive(problem: Problem) -> None:
    shapes = problem.benchmark_shapes
    assert len(shapes) >= 2 and all(weight > 0 for _, weight in shapes)


def test_make_inputs_names_an_unknown_distribution(problem: Problem) -> None:
    with pytest.raises(UserError, match="choose one of"):
        problem.make_inputs(problem.validation_shapes[0], "bimodal", 0)


def test_unknown_problem_is_a_clear_error() -> None:
    with pytest.raises(UnknownProblemError, match="not one of the built-in problems"):
        load_problem("no-such-problem")


def _docs_example(folder: Path) -> Path:
    """Write the complete example of docs/problems.md into ``folder``."""
    text = DOCS.read_text()
    blocks = re.findall(r"<!-- example: (\S+) -->\n```\w*\n(.*?)```", text, flags=re.S)
    assert {name for name, _ in blocks} == {"problem.py", "seed.c", "template.c"}
    folder.mkdir()
    for name, body in blocks:
        (folder / name).write_text(body)
    return folder


def test_docs_example_is_a_working_problem_folder(tmp_path: Path) -> None:
    problem = load_problem(_docs_example(tmp_path / "scale"))
    assert problem.name == "scale" and [p.role for p in problem.params] == ["in", "out", "size", "scalar"]
    for shape in problem.validation_shapes:
        for distribution in problem.distributions:
            inputs = problem.make_inputs(shape, distribution, 0)
            ref = problem.reference(inputs, shape)
            assert _worst_ratio(problem, problem.baseline(inputs, shape), ref, shape, inputs) <= 1
    assert "#define UNROLL 4" in problem.render_template({"UNROLL": 4, "SIMD": 0})
    assert load_problem(tmp_path / "scale" / "problem.py").folder == problem.folder


def test_the_docs_examples_seed_is_timed_ok_with_a_scalar_drawn_per_input(tmp_path: Path) -> None:
    """Its make_inputs draws alpha at random, so every input slot of the benchmark pool has an alpha of its own:
    a call must get its slot's alpha, or the fetched output is checked against the wrong one (every correct
    kernel was judged incorrect while the worker passed the first slot's scalars to every call)."""
    folder = _docs_example(tmp_path / "scale")
    problem = load_problem(folder)
    compiled = compile_source(problem, (folder / "seed.c").read_text(), DEFAULT_FLAGS, cache_dir=tmp_path / "cache")
    assert compiled.verdict == Verdict.ok and compiled.artifact_id is not None, compiled.first_error
    (report,) = benchmark_artifact(
        problem,
        compiled.artifact_id,
        [Reference(kind="numpy", label="numpy")],
        budget_s=0.3,
        cache_dir=tmp_path / "cache",
        revalidate=False,
    )
    assert report.verdict == Verdict.ok, report.message


def test_inputs_of_the_wrong_shape_name_the_parameter_and_the_fix(tmp_path: Path) -> None:
    folder = _docs_example(tmp_path / "scale")
    source = (folder / "problem.py").read_text()
    (folder / "problem.py").write_text(source.replace("x.astype(np.float32)", "x.astype(np.float64)"))
    problem = load_problem(folder)
    with pytest.raises(UserError, match=r"'x' must be a C-contiguous float32 array of shape \(7,\), got float64"):
        problem.make_inputs({"n": 7}, "normal", 0)


@pytest.mark.parametrize(
    ("alpha", "message"),
    [
        ('"abc"', "not a single real number"),
        ("None", "not a single real number"),
        ("np.float64(1e39)", r"outside the float32 range \(it would become inf\)"),
        ("float('nan')", "not finite"),
        ("1 + 2j", "not a single real number"),
    ],
)
def test_a_scalar_the_c_type_cannot_hold_is_named(tmp_path: Path, alpha: str, message: str) -> None:
    folder = _docs_example(tmp_path / "scale")
    source = (folder / "problem.py").read_text()
    (folder / "problem.py").write_text(source.replace("np.float32(rng.uniform(0.5, 2.0))", alpha))
    with pytest.raises(UserError, match=rf"scalar 'alpha' is .*, {message}; return a float32 number"):
        load_problem(folder).make_inputs({"n": 7}, "normal", 0)


def test_a_missing_scalar_is_named(tmp_path: Path) -> None:
    folder = _docs_example(tmp_path / "scale")
    source = (folder / "problem.py").read_text()
    (folder / "problem.py").write_text(source.replace(', "alpha": np.float32(rng.uniform(0.5, 2.0))', ""))
    with pytest.raises(UserError, match="returned no 'alpha'"):
        load_problem(folder).make_inputs({"n": 7}, "normal", 0)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('VALIDATION_SHAPES = [{"n": 1}', 'VALIDATION_SHAPES = [{"m": 1}', r"VALIDATION_SHAPES entry \{'m': 1\}"),
        ('({"n": 1 << 18}, 1.0)', '({"n": 1 << 18}, 0.0)', "weight > 0"),
        (
            'VALIDATION_SHAPES = [{"n": 1}',
            'VALIDATION_SHAPES = [{"n": True}',
            "must give each of \\['n'\\] a positive int",
        ),
        ('"shape": ["n"]},\n    {"name": "y"', '"shape": ["len"]},\n    {"name": "y"', r"shaped by \['len'\]"),
        ('TOLERANCES = {"float32"', 'TOLERANCES = {"float64"', "no entry for output dtype"),
        (
            "int64_t n, float alpha)",
            "int64_t n, double alpha)",
            "argument 'double alpha' does not match PARAMS' 'alpha'",
        ),
        ('ENTRY = "scale"', 'ENTRY = "scale2"', "SIGNATURE declares 'scale', but ENTRY is 'scale2'"),
        ('SIGNATURE = "void', 'SIGNATURE = "#define float double\\nvoid', "is not one C prototype"),
        ("int64_t n, float alpha)", "int64_t n)", "SIGNATURE has 3 arguments, but PARAMS declares 4"),
        (
            'TEMPLATE = "template.c"',
            'SEED = "/etc/hostname"\nTEMPLATE = "template.c"',
            "SEED is '/etc/hostname', which is outside",
        ),
        (
            'TEMPLATE = "template.c"',
            'TEMPLATE = "../elsewhere/template.c"',
            "TEMPLATE is '../elsewhere/template.c', which is outside",
        ),
        # Names the file system cannot use were tracebacks (ValueError, OSError), blamed on problem.py.
        ('TEMPLATE = "template.c"', 'SEED = "seed.c\\x00x"\nTEMPLATE = "template.c"', "not a usable file name"),
        ('TEMPLATE = "template.c"', 'SEED = "s" * 300\nTEMPLATE = "template.c"', "not a usable file name"),
        # PARAMS entries of the wrong types were tracebacks (a shape that is no list, a dtype that is a list).
        ('"shape": ["n"]},\n    {"name": "y"', '"shape": 5},\n    {"name": "y"', "shape must be a list of size names"),
        ('"shape": ["n"]},\n    {"name": "y"', '"shape": "n"},\n    {"name": "y"', "shape must be a list of size"),
        ('"shape": ["n"]},\n    {"name": "y"', '"shape": [["n"]]},\n    {"name": "y"', "shape must be a list of"),
        ('"role": "in", "dtype": "float32"', '"role": "in", "dtype": ["float32"]', "dtype must be one of"),
        # bool() of it was taken: [] turned validation's identical-bits repeat off.
        ('TEMPLATE = "template.c"', 'DETERMINISTIC = []\nTEMPLATE = "template.c"', "DETERMINISTIC is \\[\\]"),
    ],
)
def test_malformed_declarations_are_reported_with_the_fix(tmp_path: Path, old: str, new: str, message: str) -> None:
    folder = _docs_example(tmp_path / "scale")
    source = (folder / "problem.py").read_text()
    assert old in source
    (folder / "problem.py").write_text(source.replace(old, new))
    with pytest.raises(UserError, match=message):
        load_problem(folder)


@pytest.mark.parametrize(
    ("function", "body", "message"),
    [
        # The numpy reference's worker runs only problem.py's code and numpy: its exit is the problem's (it was a
        # harness_error, exit status 3, naming no function).
        (
            "baseline",
            "if shape['n'] >= 1 << 18:\n        __import__('os')._exit(0)\n    return {'y': inputs['x'] * 2}",
            "the numpy reference, which runs make_inputs() and baseline() in a process of its own, the process exited",
        ),
        # A model numpy's own baseline beats eightfold: every kernel was `impossible` before.
        ("roofline", "return {'bytes': 10**15, 'flops': 0}", "gives 1000000000000000 bytes and 0 flops"),
    ],
    ids=["a baseline that exits where timed", "a roofline no baseline meets"],
)
def test_a_numpy_reference_the_problem_fails_is_the_problems_error(
    tmp_path: Path, function: str, body: str, message: str
) -> None:
    folder = _docs_example(tmp_path / "scale")
    arguments = "inputs, shape" if function == "baseline" else "shape"
    source = (folder / "problem.py").read_text()
    (folder / "problem.py").write_text(f"{source}\n\ndef {function}({arguments}):\n    {body}\n")
    problem = load_problem(folder)
    compiled = compile_source(problem, (folder / "seed.c").read_text(), DEFAULT_FLAGS, cache_dir=tmp_path / "cache")
    assert compiled.artifact_id is not None, compiled.first_error
    with pytest.raises(ProblemDefinitionError, match=re.escape(message)):
        benchmark_artifact(
            problem,
            compiled.artifact_id,
            [Reference(kind="numpy", label="numpy")],
            budget_s=0.2,
            cache_dir=tmp_path / "cache",
            revalidate=False,
            noise_floor=0.02,
        )


def test_a_roofline_of_half_a_byte_is_not_a_roofline_of_none(tmp_path: Path) -> None:
    folder = _docs_example(tmp_path / "scale")
    source = (folder / "problem.py").read_text()
    (folder / "problem.py").write_text(source + "\n\ndef roofline(shape):\n    return {'bytes': 0.5, 'flops': 0}\n")
    # Stored as int(0.5) == 0, the no-bytes model that is refused, and every timing passed the bound.
    assert load_problem(folder).roofline({"n": 7})["bytes"] == 1


def test_a_path_to_a_folder_named_like_a_built_in_is_that_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _docs_example(tmp_path / "softmax")
    monkeypatch.chdir(tmp_path)
    # ./softmax named the built-in softmax: the user's folder was silently replaced by another problem.
    assert load_problem("./softmax").name == "scale"
    assert load_problem(str(tmp_path / "softmax")).name == "scale"
    assert load_problem("softmax").name == "softmax"  # a bare name is the built-in's


def test_the_judge_process_uses_one_blas_thread() -> None:
    # References are computed from several threads of the judge's process (importing engine.problems, as this
    # module does, sets the limit); OpenBLAS's own pool hung there.
    from threadpoolctl import threadpool_info

    blas = [pool for pool in threadpool_info() if pool["user_api"] == "blas"]
    assert blas and all(pool["num_threads"] == 1 for pool in blas)


def test_a_search_names_a_local_problem_folder_by_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse

    from cli.search import spec_from_args
    from engine.problems import problem_argument

    folder = tmp_path / "mine"
    shutil.copytree(load_problem("l2norm").folder, folder, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.chdir(tmp_path)
    # Workers run in another directory (or on another machine): a relative folder would name nothing there.
    assert problem_argument("mine") == problem_argument("./mine/") == str(folder.resolve())
    assert problem_argument("mine/problem.py") == str(folder.resolve())
    assert problem_argument("softmax") == "softmax"  # a built-in name stays a name
    assert problem_argument("elsewhere/not_here") == "elsewhere/not_here"  # the workers may hold it
    args = argparse.Namespace(spec=None, problem="mine")
    assert spec_from_args(args).problem == str(folder.resolve())
