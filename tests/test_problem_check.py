"""``kf problem check``: the generic checks pass on a good problem folder and name what is wrong in bad ones."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from cli import main as kf
from engine.problem_check import check_baseline, check_problem, check_skipped_element
from engine.problems import load_problem


def folder_like(name: str, tmp_path: Path, **edits: tuple[str, str]) -> Path:
    """A copy of the built-in problem ``name`` with each file's text replacements applied. Its GPU benchmark
    shapes (if any) are made 256 times smaller: the checks draw and reference every benchmark shape on the CPU,
    and the GPU's 256 MiB shapes took a minute per check."""
    problem = load_problem(name)
    folder = tmp_path / f"my_{name}"
    shutil.copytree(problem.folder, folder, ignore=shutil.ignore_patterns("__pycache__"))
    shapes = problem.for_backend("cuda").benchmark_shapes if "cuda" in problem.backends else []
    if shapes and all("rows" in shape for shape, _ in shapes):
        smaller = [({**shape, "rows": max(1, shape["rows"] // 256)}, weight) for shape, weight in shapes]
        with (folder / "problem.py").open("a") as file:
            file.write(f"\nCUDA_BENCHMARK_SHAPES = {smaller!r}\n")
    for file, (old, new) in edits.items():
        path = folder / file.replace("_", ".", 1)  # problem_py -> problem.py
        text = path.read_text()
        assert old in text, f"{old!r} not in {path}"
        # surrogateescape: an edit may put in bytes that are not UTF-8 ("\udcff" is the byte 0xff).
        path.write_bytes(text.replace(old, new, 1).encode("utf-8", "surrogateescape"))
    return folder


def statuses(folder: Path, *, timing: bool = False) -> dict[str, str]:
    return {c.name: c.status for c in check_problem(str(folder), timing=timing).checks}


def test_a_copy_of_a_builtin_problem_passes_every_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = folder_like("rmsnorm", tmp_path)
    assert kf(["problem", "check", str(folder), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["problem"] == "rmsnorm"
    assert {c["name"]: c["status"] for c in report["checks"]} == {
        "loads": "ok",
        "baseline": "ok",
        "half_precision": "ok",
        "bf16": "ok",
        "skipped_element": "ok",
        "benchmark_answers": "ok",
        "benchmark_tolerance": "ok",
        "roofline": "ok",
        "seed": "ok",
        "template": "ok",
        "cuda_seed": "ok",
        "cuda_template": "ok",
        "seed_timing": "ok",
    }


def test_a_cuda_only_problem_is_checked_with_nvrtc_not_the_c_compiler(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kf problem check softmax_bf16` compiled its CUDA seed as C and failed, naming a seed.c that does not
    exist. A CUDA kernel is compiled with NVRTC (run only on a GPU), and the CPU checks say there is none."""
    folder = folder_like("softmax_bf16", tmp_path)
    assert kf(["problem", "check", str(folder), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    found = {c["name"]: c for c in report["checks"]}
    assert {name: c["status"] for name, c in found.items() if name.startswith(("seed", "template", "cuda"))} == {
        "seed": "skipped",
        "template": "skipped",
        "cuda_seed": "ok",
        "cuda_template": "ok",
        "seed_timing": "skipped",
    }
    assert "no cpu kernel" in found["seed"]["message"]
    broken = folder_like("softmax_bf16", tmp_path / "broken", seed_cu=("m = partial[0];", "m = partial[0]"))
    by_name = {c.name: c for c in check_problem(str(broken), timing=False).checks}
    assert by_name["cuda_seed"].status == "failed", by_name["cuda_seed"].message
    assert "compile_error" in by_name["cuda_seed"].message and str(broken / "seed.cu") in by_name["cuda_seed"].message


def test_a_loose_tolerance_lets_low_precision_through(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = folder_like(
        "softmax",
        tmp_path,
        # Within the bound every call of Problem.tolerance enforces (rtol <= 0.1), and still far too loose.
        problem_py=('"float32": {"atol": 1e-6, "rtol": 1e-4}', '"float32": {"atol": 0.5, "rtol": 0.05}'),
    )
    # One check, through the command (each run compiles and validates the template's sample again): the folder's
    # problem.py names the folder, as `kf evaluate --problem` takes it (it was "not a folder").
    assert kf(["problem", "check", str(folder / "problem.py"), "--no-timing", "--json"]) == 1
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    found = {name: c["status"] for name, c in checks.items()}
    assert found["half_precision"] == found["bf16"] == found["skipped_element"] == "failed"
    assert found["benchmark_tolerance"] == "failed"
    assert found["baseline"] == found["seed"] == "ok"
    assert "tighten TOLERANCES" in checks["half_precision"]["message"]


def test_an_exact_tolerance_passes_a_baseline_that_is_exact_and_fails_one_that_is_not(tmp_path: Path) -> None:
    """atol = rtol = 0 (a copy, a gather): an exact baseline read 0/0 against its tolerance, NaN, and failed
    the check ("off by infx the tolerance") though validation passes exact answers. One element off still fails."""
    exact = Path(__file__).parent / "adversarial" / "problems" / "heavy_copy"
    assert check_baseline(load_problem(str(exact))).status == "ok"
    folder = tmp_path / "heavy_copy"
    shutil.copytree(exact, folder)
    source = (folder / "problem.py").read_text()
    (folder / "problem.py").write_text(
        source.replace('return {"y": inputs["x"].copy()}', 'return {"y": inputs["x"] * 2}')
    )
    failed = check_baseline(load_problem(str(folder)))
    assert failed.status == "failed" and "off by infx the tolerance" in failed.message


def test_a_bfloat16_input_is_checked_for_a_skipped_element() -> None:
    """A folder with bfloat16 inputs only: the check that a kernel leaving out an input's last element fails
    validation was skipped ("no floating-point input array"); it zeroes a bfloat16 element as a float one."""
    folder = Path(__file__).parent / "hostile" / "problems" / "matmul_bf16"
    result = check_skipped_element(load_problem(str(folder)))
    assert result.status == "ok" and "skipping the last element of a" in result.message, result


def test_a_seed_that_failed_its_check_is_not_timed_again(tmp_path: Path) -> None:
    """Timing a seed that failed validation repeated the failure as one of the benchmark shapes' ("check what
    make_inputs draws at those shapes"), though the shape at fault was a validation one."""
    folder = tmp_path / "bucketize"
    shutil.copytree(Path(__file__).parent / "user_problems" / "bucketize", folder)
    seed = (folder / "seed.c").read_text()
    (folder / "seed.c").write_text(seed.replace("if (edges[mid] <= v)", "if (edges[mid] < v)"))  # wrong on an edge
    by_name = {c.name: c for c in check_problem(str(folder), timing=True).checks}
    assert by_name["seed"].status == "failed", by_name["seed"]
    assert (
        by_name["seed_timing"].status == "skipped"
        and "the seed failed its check above" in by_name["seed_timing"].message
    )


def test_a_baseline_outside_its_tolerance_and_a_wrong_seed_are_named(tmp_path: Path) -> None:
    folder = folder_like(
        "softmax",
        tmp_path,
        problem_py=('"float32": {"atol": 1e-6, "rtol": 1e-4}', '"float32": {"atol": 1e-12, "rtol": 1e-12}'),
        seed_c=(
            "for (int64_t c = 0; c < cols; c++) yr[c] = yr[c] / s;",
            "for (int64_t c = 0; c + 1 < cols; c++) yr[c] = yr[c] / s;",
        ),
    )
    result = check_problem(str(folder), timing=False)
    by_name = {c.name: c for c in result.checks}
    assert not result.passed
    assert by_name["baseline"].status == "failed" and "TOLERANCES" in by_name["baseline"].message
    assert by_name["seed"].status == "failed" and "seed" in by_name["seed"].message


def test_problem_code_that_raises_fails_its_check_without_a_traceback(tmp_path: Path) -> None:
    folder = folder_like(
        "softmax",
        tmp_path,
        problem_py=('    rows, cols = shape["rows"], shape["cols"]\n', "    raise ValueError('bad')\n"),
    )
    by_name = {c.name: c for c in check_problem(str(folder), timing=False).checks}
    assert by_name["baseline"].status == "failed"
    assert "make_inputs(" in by_name["baseline"].message and "raised ValueError('bad')" in by_name["baseline"].message
    assert by_name["seed"].status == by_name["template"].status == "skipped"


def replaced(function: str, body: str) -> dict[str, tuple[str, str]]:
    """problem.py edits that make ``function`` of l2norm's problem.py run ``body`` (the old one is renamed)."""
    head = f"def {function}("
    return {"problem_py": (head, f"def {function}(*args: object) -> object:\n    {body}\n\n\ndef _old_{function}(")}


HOSTILE_FOLDERS = {
    "exits at import": (
        {"problem_py": ("import numpy as np\n", "import numpy as np\nimport sys\nsys.exit(3)\n")},
        "loads",
        "SystemExit(3)",
    ),
    "no seed file": (
        {"problem_py": ('SEED = "seed.c"', 'SEED = "gone.c"')},
        "loads",
        "SEED is 'gone.c', which is not a file",
    ),
    "unnamed placeholder": ({"template_c": ("{{VEC}}", "{{VECX}}")}, "loads", "{{VECX}}"),
    "empty knob": ({"problem_py": ('"PF": [0, 1024, 4096],', '"PF": [],')}, "loads", "TEMPLATE_PARAMS['PF'] is []"),
    "a template space of billions": (
        # l2norm's settings times 10^6 values of a knob no placeholder uses: enumerating them would fill the memory.
        {"problem_py": ('"PF": [0, 1024, 4096],', '"PF": [0, 1024, 4096],\n    "SPARE": list(range(10**6)),')},
        "loads",
        f"TEMPLATE_PARAMS spans {math.prod(len(v) for v in load_problem('l2norm').template_params.values()) * 10**6:,} "
        "settings (3 VEC x 4 ACC",
    ),
    "a shape past memory": (
        {"problem_py": ('({"rows": 512, "cols": 4096}, 2.0)', '({"rows": 5120000, "cols": 409600}, 2.0)')},
        "loads",
        "needs 15625.0 GiB for its arrays alone",
    ),
    # The judge hands the same inputs to the kernel, the reference and the baseline (and the baseline's timed calls
    # reuse theirs): a function that changes them in place corrupts every later use, with its own answer right.
    "a baseline that changes its input in place": (
        replaced("baseline", "out = _old_baseline(*args); args[0]['x'][0, 0] += 1.0; return out"),
        "baseline",
        "changed its input 'x' in place",
    ),
    "a reference that changes its input in place": (
        replaced("reference", "out = _old_reference(*args); args[0]['x'][...] = 0.0; return out"),
        "baseline",
        "changed its input 'x' in place",
    ),
    "NaN reference": (
        replaced("reference", "return {'y': np.full((args[1]['rows'], args[1]['cols']), np.nan)}"),
        "baseline",
        "'y' holds nan at (0, 0); a reference must be finite",
    ),
    "reference of the wrong shape": (
        replaced("reference", "return {'y': np.zeros((args[1]['rows'] + 1, args[1]['cols']))}"),
        "baseline",
        "'y' has shape (2, 1), but PARAMS declares (1, 1)",
    ),
    # The reference is what every output is compared with, rounded to the output's dtype: in integers it has
    # lost the fractions a float32 answer keeps (and in float16, digits), and validation would accept the
    # rounded-off answer.
    "a reference in int64": (
        replaced("reference", "return {'y': np.round(_old_reference(*args)['y'] * 1e6).astype(np.int64)}"),
        "baseline",
        "'y' is an int64 array; a reference must be a float array wide enough for the float32 output",
    ),
    "a reference in float16": (
        replaced("reference", "return {'y': _old_reference(*args)['y'].astype(np.float16)}"),
        "baseline",
        "'y' is a float16 array; a reference must be a float array wide enough for the float32 output",
    ),
    # A tolerance_for as tight as it should be on the validation shapes, where the checks above compare, but that
    # lets anything through on the benchmark shapes, where the timed outputs are compared.
    "a tolerance loose only where timed": (
        {
            "problem_py": (
                "def reference(",
                "def tolerance_for(dtype: str, shape: dict[str, int], inputs: dict[str, Any]) -> dict[str, float]:\n"
                "    timed = shape['rows'] * shape['cols'] >= 2**19\n"
                "    return {'atol': 10.0 if timed else 1e-7, 'rtol': 1e-5}\n\n\ndef reference(",
            )
        },
        "benchmark_tolerance",
        "on the benchmark shape {'rows': 512, 'cols': 4096}, the tolerance of y (atol 10, rtol 1e-05) lets an "
        "answer rounded to bfloat16 through",
    ),
    "a relative tolerance of a billion where timed": (
        {
            "problem_py": (
                "def reference(",
                "def tolerance_for(dtype: str, shape: dict[str, int], inputs: dict[str, Any]) -> dict[str, float]:\n"
                "    timed = shape['rows'] * shape['cols'] >= 2**19\n"
                "    return {'atol': 1e-7, 'rtol': 1e9 if timed else 1e-5}\n\n\ndef reference(",
            )
        },
        "benchmark_tolerance",
        "rtol must be at most 0.1",
    ),
    "a roofline that is no number": (
        replaced("roofline", "return {'bytes': 'lots'}"),
        "roofline",
        "'bytes' is 'lots'; it must be a finite number > 0",
    ),
    # The roofline is the physical floor a timing is checked against: bytes <= 0 or NaN make every timing
    # possible. Refused with or without timing (these run the checks with timing off).
    "a negative roofline": (
        replaced("roofline", "return {'bytes': -4096, 'flops': 0}"),
        "roofline",
        "roofline({'rows': 512, 'cols': 4096}): 'bytes' is -4096; it must be a finite number > 0",
    ),
    "a roofline of no bytes": (
        replaced("roofline", "return {'bytes': 0, 'flops': 10}"),
        "roofline",
        "'bytes' is 0; it must be a finite number > 0",
    ),
    "a roofline of NaN bytes": (
        replaced("roofline", "return {'bytes': float('nan'), 'flops': 10}"),
        "roofline",
        "'bytes' is nan; it must be a finite number > 0",
    ),
    "a roofline of negative flops": (
        replaced("roofline", "return {'bytes': 4096, 'flops': -1}"),
        "roofline",
        "'flops' is -1; it must be a finite number >= 0",
    ),
    "a reference that never returns": (
        replaced("reference", "import time; time.sleep(60)"),
        "baseline",
        "did not return within 1 s (KF_PROBLEM_CALL_S)",
    ),
    "a NAME no search id can hold": (
        {"problem_py": ('NAME = "l2norm"', 'NAME = "my problem/../x"')},
        "loads",
        "NAME is 'my problem/../x'; it must be a string of letters",
    ),
    "an ENTRY that is no C identifier": (
        {"problem_py": ('ENTRY = "l2norm"', 'ENTRY = "l2norm; int x"')},
        "loads",
        "ENTRY is 'l2norm; int x'",
    ),
    "PARAMS as a dict": (
        {"problem_py": ("PARAMS: list[dict[str, Any]] = [", "PARAMS = {'x': 1}\n_OLD = [")},
        "loads",
        "PARAMS is {'x': 1}",
    ),
    "a parameter named twice": (
        {"problem_py": ('{"name": "eps", "role": "scalar"', '{"name": "x", "role": "scalar"')},
        "loads",
        "PARAMS names ['x'] more than once",
    ),
    "no distributions": (
        {"problem_py": ('DISTRIBUTIONS = ["normal", "uniform", "large", "edge"]', "DISTRIBUTIONS = []")},
        "loads",
        "DISTRIBUTIONS is []",
    ),
    "a weight that is a word": (
        {"problem_py": ('({"rows": 2048, "cols": 1024}, 1.0)', '({"rows": 2048, "cols": 1024}, "heavy")')},
        "loads",
        "must be a (shape, weight) pair, weight > 0",
    ),
    "a seed that is not text": (
        {"seed_c": ("#include", "\udcff#include")},
        "loads",
        "cannot read SEED 'seed.c' as UTF-8 text",
    ),
    "template_allows that raises": (
        replaced("template_allows", "raise KeyError('NOPE')"),
        "template",
        "template_allows({",
    ),
    # problem.py runs in a process of its own (engine/problem_host.py): what ends or hangs it is the problem's
    # error, and neither ends nor blocks the judge.
    "an import that never returns": (
        {"problem_py": ("import numpy as np\n", "import numpy as np\nwhile True:\n    pass\n")},
        "loads",
        "importing it did not return within 1 s (KF_PROBLEM_CALL_S)",
    ),
    "an os._exit at import": (
        {"problem_py": ("import numpy as np\n", "import numpy as np\nimport os\nos._exit(0)\n")},
        "loads",
        "importing it ended the process that ran it with exit status 0",
    ),
    # ... and it may signal no other process (signal 0 here: only asks whether the judge exists), nor move a
    # process out of the group the judge kills when it stops it (engine/harness/seccomp.py).
    "an import that signals the judge": (
        {"problem_py": ("import numpy as np\n", "import numpy as np\nimport os\nos.kill(os.getppid(), 0)\n")},
        "loads",
        "failed to import: PermissionError",
    ),
    "an import that starts a process in a session of its own": (
        {
            "problem_py": (
                "import numpy as np\n",
                "import numpy as np\nimport subprocess\nsubprocess.run(['true'], start_new_session=True)\n",
            )
        },
        "loads",
        "failed to import: PermissionError",
    ),
    "a reference that exits the process": (
        replaced("reference", "import os; os._exit(5)"),
        "baseline",
        "reference(inputs, {'rows': 1, 'cols': 1}) ended the process that ran it with exit status 5",
    ),
    "a make_inputs that spins and never returns": (
        replaced("make_inputs", "while True: pass"),
        "baseline",
        "did not return within 1 s (KF_PROBLEM_CALL_S)",
    ),
    "a template_allows that never returns": (
        replaced("template_allows", "while True: pass"),
        "template",
        f"template_allows over {math.prod(len(v) for v in load_problem('l2norm').template_params.values())} settings "
        "did not return within 1 s",
    ),
    "a template_allows that answers with an array": (
        replaced("template_allows", "return np.array([1, 2])"),
        "template",
        "returned array([1, 2]); it must return True or False",
    ),
    "a make_inputs that ignores its rng": (
        replaced("make_inputs", "return _old_make_inputs(args[0], args[1], np.random.default_rng())"),
        "baseline",
        "gave a different 'x' on a second call with the same seed: draw every random number from its rng",
    ),
    "a baseline that raises only on the benchmark shapes": (
        replaced(
            "baseline",
            "if args[1]['rows'] * args[1]['cols'] >= 2**19: raise RuntimeError('only when timed')\n"
            "    return _old_baseline(*args)",
        ),
        "seed_timing",
        "raised RuntimeError('only when timed'); fix baseline()",
    ),
    # Every timed answer is 0 (l2norm of zero rows): what is timed is an edge case, and a kernel writing zeros
    # matches every answer but the one element the judge's drift changes (tests/user_problems/relu: not even it).
    "timed inputs whose answers are all one value": (
        {
            "problem_py": (
                '        x = rng.standard_normal((rows, cols))\n    elif distribution == "uniform":',
                '        x = 0.0 * rng.standard_normal((rows, cols))\n    elif distribution == "uniform":',
            )
        },
        "benchmark_answers",
        "every answer for the 'normal' inputs the judge times is one value within its tolerance (y 0)",
    ),
    "a template_allows that allows nothing": (
        replaced("template_allows", "return False"),
        "template",
        "problem.py: template_allows() allows no setting of the TEMPLATE space",
    ),
    "a roofline that crashes the interpreter": (
        replaced("roofline", "import ctypes; ctypes.string_at(0)"),
        "roofline",
        "ended the process that ran it: killed by SIGSEGV",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_FOLDERS))
def test_a_hostile_problem_folder_fails_the_check_that_meets_it_with_the_fix(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    edits, check, phrase = HOSTILE_FOLDERS[case]
    folder = folder_like("l2norm", tmp_path, **edits)
    hangs = "never returns" in case
    if hangs:
        monkeypatch.setenv("KF_PROBLEM_CALL_S", "1")
    # Never a traceback: every kind of breakage is one failed check that names the file and what to fix.
    result = check_problem(str(folder), timing=check == "seed_timing")
    failed = {c.name: c.message for c in result.checks if c.status == "failed"}
    assert check in failed, result
    assert phrase in failed[check] and "problem.py" in failed[check], failed[check]
    if hangs:  # every later check would wait as long: they are skipped, saying why
        after = [c.status for c in result.checks][[c.name for c in result.checks].index(check) + 1 :]
        assert after == ["skipped"] * len(after), result
    # A folder that loads but whose reference or roofline is bad is refused by the harness too: bad input (exit
    # status 2), never a verdict on the kernel. (`kf evaluate` of a source never asks template_allows.)
    if check in ("baseline", "roofline", "seed_timing"):
        source = str(load_problem("l2norm").folder / "seed.c")
        assert kf(["evaluate", "--problem", str(folder), "--source", source, "--budget", "0.2"]) == 2


def test_a_tolerance_past_the_bound_on_a_timed_shape_is_bad_input_to_kf_evaluate(tmp_path: Path) -> None:
    # Validation passes (its shapes get a sane tolerance); the timed outputs' check asks for the tolerance of a
    # benchmark shape and meets the bound: the problem's error, exit status 2, never a kernel accepted.
    edits, _, _ = HOSTILE_FOLDERS["a relative tolerance of a billion where timed"]
    folder = folder_like("l2norm", tmp_path, **edits)
    source = str(load_problem("l2norm").folder / "seed.c")
    assert kf(["evaluate", "--problem", str(folder), "--source", source, "--budget", "0.2"]) == 2


def test_a_tolerance_that_accepts_zeros_on_a_timed_shape_is_bad_input_to_kf_evaluate(tmp_path: Path) -> None:
    # atol 10 only on the benchmark shapes: within every bound a tolerance has, but an l2norm output (each value
    # at most 1) of zeros passes it there. The timed outputs' check refuses the problem (exit status 2) rather
    # than time and accept a kernel that writes nothing where it is timed.
    edits, _, _ = HOSTILE_FOLDERS["a tolerance loose only where timed"]
    folder = folder_like("l2norm", tmp_path, **edits)
    source = str(load_problem("l2norm").folder / "seed.c")
    assert kf(["evaluate", "--problem", str(folder), "--source", source, "--budget", "0.2"]) == 2


@pytest.mark.parametrize(
    "answer", ["{'y': _old_baseline(*args)['y'].tolist()}", "{'y': _old_baseline(*args)['y'].astype(np.float64)}"]
)
def test_the_low_precision_checks_round_a_baseline_given_as_a_list_or_in_float64(tmp_path: Path, answer: str) -> None:
    # docs/problems.md lets baseline() return lists and other dtypes; the checks round what the output's declared
    # dtype says, not what came back (a list has no dtype; a float64 array was never rounded and then passed).
    folder = folder_like("l2norm", tmp_path, **replaced("baseline", f"return {answer}"))
    result = statuses(folder)
    assert result["half_precision"] == "ok" and result["bf16"] == "ok", result


def test_no_folder_is_bad_input_and_a_broken_folder_fails_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert kf(["problem", "check", str(tmp_path / "missing")]) == 2
    assert kf(["problem", "check", "no_such_problem"]) == 2  # neither a built-in name nor a folder
    assert kf(["problem", "check", ""]) == 2
    (tmp_path / "empty").mkdir()
    capsys.readouterr()
    assert kf(["problem", "check", str(tmp_path / "empty"), "--no-timing"]) == 1
    out = capsys.readouterr().out
    assert "FAILED  loads: " in out and out.rstrip().endswith("some checks FAILED"), out
    assert statuses(tmp_path / "empty") == {"loads": "failed"}


def test_what_problem_py_prints_stays_off_the_json_on_standard_output(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    folder = folder_like(
        "l2norm",
        tmp_path,
        problem_py=(
            "def reference(",
            "print('hello at import')\nimport os\nos.write(1, b'raw bytes at import\\n')\n\n\ndef reference(",
        ),
    )
    text = (
        (folder / "problem.py")
        .read_text()
        .replace('    x = inputs["x"]', "    print('hello from reference')\n    x = inputs[\"x\"]", 1)
    )
    (folder / "problem.py").write_text(text)
    # capfd, not capsys: the reference prints in problem.py's own process, whose standard output is this
    # process's standard error (the file descriptor, not sys.stderr).
    assert kf(["problem", "check", str(folder), "--no-timing", "--json"]) == 0
    captured = capfd.readouterr()
    assert json.loads(captured.out)["passed"]
    assert "hello at import" in captured.err and "hello from reference" in captured.err
    assert "raw bytes at import" in captured.err


def test_the_problem_call_deadline_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.config import DEFAULT_PROBLEM_CALL_S, problem_call_s
    from engine.errors import ConfigurationError

    monkeypatch.delenv("KF_PROBLEM_CALL_S", raising=False)
    assert problem_call_s() == DEFAULT_PROBLEM_CALL_S
    monkeypatch.setenv("KF_PROBLEM_CALL_S", "42.5")
    assert problem_call_s() == 42.5
    for bad in ("soon", "0", "-3", "inf", "nan"):
        monkeypatch.setenv("KF_PROBLEM_CALL_S", bad)
        with pytest.raises(ConfigurationError, match="KF_PROBLEM_CALL_S"):
            problem_call_s()


def test_timed_answers_exact_in_low_precision_blame_the_distribution_not_the_tolerance(tmp_path: Path) -> None:
    # tests/user_problems/relu with its all-negative inputs listed first: every answer the checks round is 0.
    # Before, half_precision and bf16 said "tighten TOLERANCES" (already exact) and benchmark_tolerance failed
    # with "tolerance_for must grow with a shape only as its rounding error does".
    folder = tmp_path / "relu"
    shutil.copytree(Path(__file__).parent / "user_problems" / "relu", folder)
    source = (folder / "problem.py").read_text()
    (folder / "problem.py").write_text(source.replace('["mixed", "negative"]', '["negative", "mixed"]'))
    checks = {c.name: c for c in check_problem(str(folder), timing=False).checks}
    for name, precision in (("half_precision", "float16"), ("bf16", "bfloat16")):
        assert checks[name].status == "failed", checks[name]
        assert f"the 'negative' inputs' answers are exact in {precision}" in checks[name].message
        assert "TOLERANCES" not in checks[name].message
    assert checks["benchmark_answers"].status == "failed"
    assert "(y 0)" in checks["benchmark_answers"].message and "'negative' inputs" in checks["benchmark_answers"].message
    assert checks["benchmark_tolerance"].status == "skipped", checks["benchmark_tolerance"]
    typical = {
        c.name: c.status
        for c in check_problem(str(Path(__file__).parent / "user_problems" / "relu"), timing=False).checks
    }
    assert typical["half_precision"] == typical["bf16"] == typical["benchmark_answers"] == "ok", typical
