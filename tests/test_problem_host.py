"""A user's problem.py runs in a process of its own (engine/problem_host.py): what it does there cannot hang or
end the judge, a hung call's process is killed, and its results are what an in-process call would give."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from test_problem_check import folder_like, replaced

from engine import problem_host
from engine.errors import ProblemDefinitionError, UserError
from engine.problem_host import close_all
from engine.problems import Problem, load_problem


def host_pid(problem: Problem) -> int:
    assert problem.host is not None and problem.host._process is not None
    return problem.host._process.pid


def test_a_builtin_problem_runs_here_and_a_copy_of_it_in_its_host_with_the_same_results(tmp_path: Path) -> None:
    builtin = load_problem("l2norm")
    copy = load_problem(str(folder_like("l2norm", tmp_path)))
    assert builtin.host is None and copy.host is not None
    shape = builtin.benchmark_shapes[0][0]
    ours, theirs = builtin.make_inputs(shape, "normal", 7), copy.make_inputs(shape, "normal", 7)
    assert ours.keys() == theirs.keys()
    for name in ours:
        np.testing.assert_array_equal(np.asarray(ours[name]), np.asarray(theirs[name]))
    for name, value in builtin.reference(ours, shape).items():
        np.testing.assert_array_equal(value, copy.reference(theirs, shape)[name])
    assert builtin.roofline(shape) == copy.roofline(shape)
    names = sorted(builtin.template_params)
    settings = [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(builtin.template_params[n] for n in names))
    ]
    assert [builtin.template_allows(s) for s in settings] == copy.allowed(settings)
    assert 0 < sum(copy.allowed(settings)) < len(settings)
    # The caller's generator advances as it would in process: make_inputs(shape, distribution, rng).
    here, there = np.random.default_rng(3), np.random.default_rng(3)
    builtin._call("make_inputs", shape, "normal", here)
    copy._call("make_inputs", shape, "normal", there)
    assert here.bit_generator.state == there.bit_generator.state != np.random.default_rng(3).bit_generator.state


def test_a_call_that_spins_past_its_deadline_gets_its_process_killed_and_the_next_call_a_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reference spins while a marker file exists: the first call hangs, the one after the fix returns.
    folder = folder_like(
        "l2norm",
        tmp_path,
        problem_py=(
            "def reference(",
            "def reference(*args: object) -> object:\n"
            "    import pathlib\n"
            "    while pathlib.Path('spin').exists():\n"
            "        pass\n"
            "    return _old_reference(*args)\n\n\ndef _old_reference(",
        ),
    )
    (folder / "spin").touch()
    monkeypatch.setenv("KF_PROBLEM_CALL_S", "1")
    problem = load_problem(str(folder))
    shape = problem.benchmark_shapes[0][0]
    inputs = problem.make_inputs(shape, "normal", 1)
    spinning = psutil.Process(host_pid(problem))
    with pytest.raises(ProblemDefinitionError, match=r"reference\(inputs, .*did not return within 1 s") as error:
        problem.reference(inputs, shape)
    assert error.value.hung
    # Killed, not left spinning on a core for the judge's life (a thread could not be stopped).
    assert not spinning.is_running() or spinning.status() == psutil.STATUS_ZOMBIE
    (folder / "spin").unlink()
    assert set(problem.reference(inputs, shape)) == {"y"}
    assert host_pid(problem) != spinning.pid


def test_a_slow_call_is_said_while_it_runs_and_still_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A problem.py call that runs long is said on the log while the judge waits (a hung make_inputs kept
    `kf evaluate` silent for its whole five-minute deadline), again every repeat, and one that returns within its
    deadline is still taken."""
    folder = folder_like(
        "l2norm",
        tmp_path,
        problem_py=(
            "def reference(",
            "def reference(*args: object) -> object:\n"
            "    import time\n"
            "    time.sleep(1.6)\n"
            "    return _old_reference(*args)\n\n\ndef _old_reference(",
        ),
    )
    monkeypatch.setattr(problem_host, "SLOW_CALL_NOTICE_S", 0.3)
    monkeypatch.setattr(problem_host, "SLOW_CALL_REPEAT_S", 0.5)
    problem = load_problem(str(folder))
    shape = problem.validation_shapes[0]
    inputs = problem.make_inputs(shape, "normal", 1)
    with caplog.at_level("WARNING", logger="kf.problem"):
        assert set(problem.reference(inputs, shape)) == {"y"}
    said = [r.getMessage() for r in caplog.records if "reference()" in r.getMessage()]
    assert len(said) >= 2, caplog.text
    assert said[0].startswith(f"still waiting for {folder / 'problem.py'} reference(): it has run ")
    assert "given up after 300 s (KF_PROBLEM_CALL_S)" in said[0]


def test_a_problem_that_ends_its_process_or_returns_what_cannot_travel_is_the_problems_error(
    tmp_path: Path,
) -> None:
    exits = load_problem(
        str(folder_like("l2norm", tmp_path / "a", **replaced("make_inputs", "import os; os._exit(7)")))
    )
    with pytest.raises(ProblemDefinitionError, match=r"make_inputs.*ended the process that ran it with exit status 7"):
        exits.make_inputs({"rows": 1, "cols": 1}, "normal", 0)
    lambdas = load_problem(str(folder_like("l2norm", tmp_path / "b", **replaced("roofline", "return lambda: 1"))))
    with pytest.raises(
        ProblemDefinitionError, match=r"roofline\(\{'rows': 1, 'cols': 1\}\) raised a result that cannot"
    ):
        lambdas.roofline({"rows": 1, "cols": 1})
    # The host survives the refused result and serves the next call.
    assert (
        load_problem("l2norm").make_inputs({"rows": 1, "cols": 1}, "normal", 0).keys()
        == lambdas.make_inputs({"rows": 1, "cols": 1}, "normal", 0).keys()
    )


def test_no_host_outlives_the_judge(tmp_path: Path) -> None:
    problem = load_problem(str(folder_like("l2norm", tmp_path)))
    child = psutil.Process(host_pid(problem))
    assert "engine.problem_host" in " ".join(child.cmdline())
    close_all()
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    # A problem loaded before close_all starts a new host when it is called again.
    assert problem.roofline({"rows": 1, "cols": 1})["bytes"] > 0


def test_a_host_busy_in_problem_code_ends_when_its_judge_is_killed(tmp_path: Path) -> None:
    # A judge killed with SIGKILL runs no exit handler; the host it left spinning in a call must still end.
    folder = folder_like("l2norm", tmp_path, **replaced("roofline", "while True: pass"))
    script = (
        "import sys; sys.path.insert(0, sys.argv[2])\n"
        "from engine.problems import load_problem\n"
        "p = load_problem(sys.argv[1])\n"
        "print(p.host._process.pid, flush=True)\n"
        "p.roofline({'rows': 1, 'cols': 1})\n"
    )
    judge = subprocess.Popen(
        [sys.executable, "-c", script, str(folder), str(Path(__file__).resolve().parent.parent)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert judge.stdout is not None
    host = psutil.Process(int(judge.stdout.readline()))
    time.sleep(0.5)  # the roofline call is spinning in the host now
    assert host.is_running() and host.cpu_percent(0.2) > 10
    judge.kill()
    judge.wait()
    host.wait(10)  # raises TimeoutExpired if it is still spinning


def test_a_host_killed_from_outside_gets_the_call_again_once(tmp_path: Path) -> None:
    # The reference's process is SIGKILLed (as the out-of-memory killer would) the first time only: the call is
    # answered by a fresh process. Killed every time, it is the problem's error, naming the signal.
    body = (
        "import os, pathlib, signal\n"
        "    if pathlib.Path('kill').exists():\n"
        "        pathlib.Path('kill').unlink()\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return _old_reference(*args)"
    )
    once = load_problem(str(folder_like("l2norm", tmp_path / "once", **replaced("reference", body))))
    (once.folder / "kill").touch()
    shape = once.benchmark_shapes[0][0]
    inputs = once.make_inputs(shape, "normal", 1)
    assert set(once.reference(inputs, shape)) == {"y"}
    assert not (once.folder / "kill").exists()
    always = replaced("reference", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    killed = load_problem(str(folder_like("l2norm", tmp_path / "always", **always)))
    with pytest.raises(ProblemDefinitionError, match="killed by SIGKILL") as error:
        killed.reference(inputs, shape)
    assert not error.value.hung


# What problem.py does at import, aimed at the process that imports it. The judge compares kernels' outputs
# with numpy, reads its clock and working directory, and handles signals: none of it may change under it.
MEDDLING_IMPORT = (
    "import numpy as np\n",
    "import numpy as np\n"
    "import os, signal, threading, time\n"
    "np.isclose = lambda a, b, **k: np.ones(np.broadcast(a, b).shape, dtype=bool)\n"
    "np.allclose = lambda *a, **k: True\n"
    "np.all = lambda *a, **k: True\n"
    "time.perf_counter = lambda: 0.0\n"
    "os.environ['KF_MEDDLED'] = '1'\n"
    "os.chdir('/')\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n",
)


def test_what_problem_py_does_at_import_stays_in_its_host(tmp_path: Path) -> None:
    import os
    import signal

    cwd, sigint = os.getcwd(), signal.getsignal(signal.SIGINT)
    # A thread started at import that ends its process a moment later (os._exit runs no handler, no finally).
    exits_later = "threading.Thread(target=lambda: (time.sleep(1.0), os._exit(9)), daemon=True).start()\n"
    old, new = MEDDLING_IMPORT
    problem = load_problem(str(folder_like("l2norm", tmp_path, problem_py=(old, new + exits_later))))
    host = psutil.Process(host_pid(problem))
    deadline = time.monotonic() + 10
    # The thread ends the host, not this process. (Polled: psutil's wait would reap the child and hide its exit
    # status from the judge.)
    while host.is_running() and host.status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the host did not end"
        time.sleep(0.05)
    assert not np.isclose(1.0, 2.0) and not np.allclose([1.0], [2.0]) and not np.all([False])
    assert time.perf_counter() > 0.0
    assert "KF_MEDDLED" not in os.environ and os.getcwd() == cwd and signal.getsignal(signal.SIGINT) == sigint
    # The declarations came from the host: the judge has them without importing the file.
    assert problem.name == "l2norm" and "make_inputs" in dir(problem.module) and problem.template_params
    # The next call meets the ended host and says so, as the problem's error.
    with pytest.raises(ProblemDefinitionError, match=r"roofline.*ended the process that ran it with exit status 9"):
        problem.roofline({"rows": 1, "cols": 1})


def test_a_wrong_kernel_stays_incorrect_when_problem_py_patches_numpy_at_import(tmp_path: Path) -> None:
    from test_evaluation import artifact, perturbed_seed

    from engine.harness.validation import validate_artifact
    from engine.harness.verdicts import Verdict

    problem = load_problem(str(folder_like("l2norm", tmp_path, problem_py=MEDDLING_IMPORT)))
    cache = tmp_path / "cache"
    report = validate_artifact(problem, artifact(problem, perturbed_seed(problem), cache), seeds=1, cache_dir=cache)
    assert report.verdict == Verdict.incorrect, report.message


# An object whose unpickling calls open(path, "w"): unpickled in the judge, it would create the file. Any
# callable could stand in for open (os.system, say).
OPENS_ON_UNPICKLE = (
    "import numpy as np\n",
    "import numpy as np\n\n\n"
    "class Opens:\n"
    "    def __reduce__(self):\n"
    "        return (open, ('unpickled-in-the-judge', 'w'))\n",
)


def test_a_result_that_would_run_code_when_unpickled_is_refused(tmp_path: Path) -> None:
    folder = folder_like("l2norm", tmp_path / "result", problem_py=OPENS_ON_UNPICKLE)
    text = (folder / "problem.py").read_text()
    (folder / "problem.py").write_text(
        text.replace("def roofline(", "def roofline(*args):\n    return Opens()\n\n\ndef _old_roofline(", 1)
    )
    problem = load_problem(str(folder))
    with pytest.raises(ProblemDefinitionError, match=r"roofline.*returned an object of class (builtins|io)\.open"):
        problem.roofline({"rows": 1, "cols": 1})
    # The host serves the next call (its result is plain data).
    shape = {"rows": 2, "cols": 3}
    assert problem.make_inputs(shape, "normal", 0)["x"].shape == (2, 3)
    # A declaration holding one is named by the load's checks, and unpickled nowhere in the judge.
    declared = folder_like("l2norm", tmp_path / "declared", problem_py=OPENS_ON_UNPICKLE)
    text = (declared / "problem.py").read_text()
    (declared / "problem.py").write_text(text + "\nFAMILY = Opens()\n")
    with pytest.raises(UserError, match=r"FAMILY is <a (builtins|io)\.open the judge cannot receive>"):
        load_problem(str(declared))
    for where in (folder, declared, Path.cwd()):
        assert not (where / "unpickled-in-the-judge").exists()


def test_the_judge_unpickles_plain_data_and_refuses_every_other_global() -> None:
    import collections
    import pickle

    from engine.problem_host import Refused, judge_loads

    data = {
        "x": np.arange(12, dtype=np.float32).reshape(3, 4).T,  # not contiguous
        "bits": np.zeros(3, dtype=np.uint16),
        "record": np.zeros(2, dtype=[("a", "f4"), ("b", "i8")]),
        "scalars": [np.float64(1.5), np.int32(-3), np.bool_(True), 2.5, 7, None, True, "s", b"b", complex(1, 2)],
        "containers": ({1, 2}, frozenset({3}), range(1, 9), collections.OrderedDict(a=1)),
    }
    for protocol in (pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL):  # what the host sends
        back = judge_loads(pickle.dumps(data, protocol=protocol))
        for name in ("x", "bits", "record"):
            np.testing.assert_array_equal(back[name], data[name])
            assert back[name].dtype == data[name].dtype
        assert back["scalars"] == data["scalars"] and back["containers"] == data["containers"]
    # Whatever else a pickle names is refused before it is called: a function, a class, numpy's own helpers.
    for hostile in (print, Path("."), np.random.default_rng(0), bytearray(b"x"), np.ma.masked_array([1.0])):
        with pytest.raises(Refused):
            judge_loads(pickle.dumps({"ok": 1, "bad": [hostile]}, protocol=4))


# problem.py runs in the host and can write to the judge's socket itself (its descriptor is the host's argv[1],
# the request being served a local of serve()). What it writes there is answered by the exchange's rules: the
# call's deadline over whole messages, a length limit, and numbered replies.
_SOCKET = "    import os, socket, struct, sys, time\n    judge = int(sys.argv[1])\n"


def _reference_that(body: str) -> tuple[str, str]:
    return (
        "def reference(",
        "def reference(*args: object) -> object:\n" + _SOCKET + body + "    return _old_reference(*args)\n\n\n"
        "def _old_reference(",
    )


def test_half_a_reply_cannot_hang_the_judge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A length that promises 1000 bytes, 10 of them sent, then a sleep: waiting for the rest once the first
    # bytes came (as a plain recv does) would wait for ever.
    folder = folder_like(
        "l2norm",
        tmp_path,
        problem_py=_reference_that(
            "    import pathlib\n"
            "    if pathlib.Path('stall').exists():\n"
            "        os.write(judge, struct.pack('!Q', 1000) + b'x' * 10)\n"
            "        time.sleep(3600)\n"
        ),
    )
    (folder / "stall").touch()
    monkeypatch.setenv("KF_PROBLEM_CALL_S", "1")
    problem = load_problem(str(folder))
    shape = problem.benchmark_shapes[0][0]
    inputs = problem.make_inputs(shape, "normal", 1)
    started = time.monotonic()
    with pytest.raises(ProblemDefinitionError, match=r"reference\(inputs, .*did not return within 1 s") as error:
        problem.reference(inputs, shape)
    assert error.value.hung and time.monotonic() - started < 10
    (folder / "stall").unlink()
    assert problem.reference(inputs, shape)["y"].shape == inputs["x"].shape


def test_a_judge_whose_host_stops_reading_its_requests_gives_up_at_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # make_inputs answers for itself (its request's number is serve()'s local) and then sleeps instead of
    # reading the next request: the judge's send of 64 MB of inputs fills the socket and must not block past
    # the deadline.
    folder = folder_like(
        "l2norm",
        tmp_path,
        problem_py=(
            "def make_inputs(",
            "def make_inputs(*args: object) -> object:\n" + _SOCKET + "    import pickle, numpy\n"
            "    number = sys._getframe(1).f_locals['number']\n"
            "    inputs = {'x': numpy.zeros((4096, 4096), numpy.float32), 'eps': 1e-12}\n"
            "    data = pickle.dumps((number, ('ok', inputs, {})))\n"
            "    ours = socket.socket(fileno=judge)  # kept: a socket object closes its descriptor when dropped\n"
            "    ours.sendall(struct.pack('!Q', len(data)) + data)\n"
            "    time.sleep(3600)\n\n\n"
            "def _old_make_inputs(",
        ),
    )
    monkeypatch.setenv("KF_PROBLEM_CALL_S", "2")
    problem = load_problem(str(folder))
    shape = {"rows": 4096, "cols": 4096}
    inputs = problem._call("make_inputs", shape, "normal", np.random.default_rng(1))
    assert inputs["x"].nbytes == 64 << 20
    started = time.monotonic()
    with pytest.raises(ProblemDefinitionError, match=r"reference\(inputs, .*did not return within 2 s"):
        problem.reference(inputs, shape)
    assert time.monotonic() - started < 12


def test_a_reply_longer_than_the_judge_accepts_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A length of a petabyte: the judge must not try to read (or allocate) it, and says what to change.
    folder = folder_like(
        "l2norm",
        tmp_path,
        problem_py=_reference_that(
            "    import pathlib\n"
            "    if pathlib.Path('huge').exists():\n"
            "        os.write(judge, struct.pack('!Q', 10**15) + b'x' * 4096)\n"
            "        time.sleep(3600)\n"
        ),
    )
    (folder / "huge").touch()
    problem = load_problem(str(folder))
    shape = problem.benchmark_shapes[0][0]
    inputs = problem.make_inputs(shape, "normal", 1)
    started = time.monotonic()
    with pytest.raises(ProblemDefinitionError, match=r"sent a reply of 1,000,000,000 MB, more than the judge"):
        problem.reference(inputs, shape)
    assert time.monotonic() - started < 10
    (folder / "huge").unlink()
    # A real reply over a limit the user set is refused with the same words, naming the setting.
    monkeypatch.setenv("KF_PROBLEM_REPLY_MB", "0.001")
    with pytest.raises(
        ProblemDefinitionError,
        match=r"reference\(inputs, .*more than the judge accepts.*"
        r"KF_PROBLEM_REPLY_MB",
    ) as error:
        problem.reference(inputs, shape)
    assert not error.value.hung
    monkeypatch.delenv("KF_PROBLEM_REPLY_MB")
    assert problem.reference(inputs, shape)["y"].shape == inputs["x"].shape


def test_a_reply_problem_py_sends_ahead_is_never_taken_as_another_calls_answer(
    tmp_path: Path,
) -> None:
    # The reference answers once for itself, numbered as the *next* request, before serve() answers it: the
    # judge reads an answer to another request and says so, rather than handing tolerance_for (or the next
    # call, whatever it is) the reference's arrays.
    folder = folder_like(
        "l2norm",
        tmp_path,
        problem_py=_reference_that(
            "    import pickle, pathlib\n"
            "    if pathlib.Path('ahead').exists():\n"
            "        number = sys._getframe(1).f_locals['number']\n"
            "        data = pickle.dumps((number + 1, ('ok', 0.5, {})))\n"
            "        os.write(judge, struct.pack('!Q', len(data)) + data)\n"
        ),
    )
    (folder / "ahead").touch()
    problem = load_problem(str(folder))
    shape = problem.benchmark_shapes[0][0]
    inputs = problem.make_inputs(shape, "normal", 1)
    with pytest.raises(ProblemDefinitionError, match=r"reference\(inputs, .*not the answer to the request"):
        problem.reference(inputs, shape)
    (folder / "ahead").unlink()
    # The next call gets a fresh host, not the stale reply left on the old socket.
    assert problem.reference(inputs, shape)["y"].shape == inputs["x"].shape
