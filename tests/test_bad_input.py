"""Every input is bounded and typed: each bad value of each `kf` option and SearchSpec field exits 2 with a
message naming the option or field and what is allowed, before any server is contacted; and the payload a
search starts from in the Temporal UI meets the same bounds, failing at once and for good.

No Temporal or Postgres runs here: every command below must refuse its input before it would connect.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError

from cli import main as kf
from engine.search.spec import MAX_HINTS, SearchSpec
from engine.search.state import SearchState
from workflows.kernel_search import KernelSearch

SOURCE = "kernels/softmax/seed.c"
EVALUATE = ["evaluate", "--problem", "softmax", "--source", SOURCE]
START = ["search", "start", "softmax"]
USABLE_CPUS = len(os.sched_getaffinity(0))

# (argv, fragments the error must hold). A fragment names the option or field; another states the allowed
# range or the fix. `{tmp}` is replaced by the test's temporary folder, which holds the files made below.
CLI_ROWS: list[tuple[list[str], list[str]]] = [
    # kf search start: each option
    ([*START, "--max-minutes", "inf"], ["--max-minutes", "finite", "at most 10080"]),
    ([*START, "--max-minutes", "nan"], ["--max-minutes", "finite", "at most 10080"]),
    ([*START, "--max-minutes", "0"], ["--max-minutes", "more than 0"]),
    ([*START, "--max-minutes", "20000"], ["--max-minutes", "at most 10080"]),
    ([*START, "--max-minutes", "soon"], ["--max-minutes", "not a number", "at most 10080"]),
    ([*START, "--max-candidates", "0"], ["--max-candidates", "from 1 to 100000"]),
    ([*START, "--max-candidates", "1e9"], ["--max-candidates", "not an integer", "from 1 to 100000"]),
    ([*START, "--max-llm-usd", "-1"], ["--max-llm-usd", "from 0 to 10000"]),
    ([*START, "--max-llm-usd", "1e9"], ["--max-llm-usd", "from 0 to 10000"]),
    ([*START, "--generations", "0"], ["--generations", "from 1 to 10000"]),
    ([*START, "--generations", "10001"], ["--generations", "from 1 to 10000"]),
    ([*START, "--generations", "2.5"], ["--generations", "not an integer"]),
    ([*START, "--candidates", "0"], ["--candidates", "candidates_per_generation", "from 1 to 256"]),
    ([*START, "--candidates", "257"], ["--candidates", "from 1 to 256"]),
    ([*START, "--parallelism", "65"], ["--parallelism", "from 1 to 64"]),
    ([*START, "--margin", "nan"], ["--margin", "promotion.margin", "from 0 to 1"]),
    ([*START, "--margin", "2"], ["--margin", "from 0 to 1"]),
    ([*START, "--confidence", "1"], ["--confidence", "more than 0.5 and less than 1"]),
    ([*START, "--confidence", "0.5"], ["--confidence", "more than 0.5 and less than 1"]),
    ([*START, "--confirm-halfwidth", "-0.1"], ["--confirm-halfwidth", "promotion.confirm_halfwidth", "from 0 to 1"]),
    (
        [*START, "--steering-remeasures", "-1"],
        ["--steering-remeasures", "promotion.steering_remeasures", "from 0 to 256"],
    ),
    ([*START, "--seed", "-1"], ["--seed", "from 0 to 4294967295"]),
    ([*START, "--seed", str(2**32)], ["--seed", "from 0 to 4294967295"]),
    ([*START, "--benchmark-seconds", "inf"], ["--benchmark-seconds", "at most 600"]),
    ([*START, "--benchmark-seconds", "0"], ["--benchmark-seconds", "more than 0"]),
    ([*START, "--threads", "100000"], ["--threads", "from 1 to 1024"]),
    ([*START, "--threads", "0"], ["--threads", "from 1 to 1024"]),
    ([*START, "--target", "gpu"], ["target", "cuda-sm<NN>"]),
    ([*START, "--proposer", "magic"], ["--proposer", "choose from", "'llm'"]),
    ([*START, "--model", ""], ["--model", "proposer.models", "1 to 255 characters"]),
    ([*START, "--hint", ""], ["--hint", "1 to 1000 characters"]),
    ([*START, "--hint", "x" * 1001], ["--hint", "1 to 1000 characters"]),
    ([*START, "--resume-from", "a\nb"], ["--resume-from", "control characters"]),
    ([*START, "--prefix", "a b"], ["--prefix", "letters, digits"]),
    ([*START, "--id", "a\tb"], ["--id", "not a search id"]),
    (["search", "start", ""], ["problem", "1 to 4096 characters"]),
    (["search", "start", "x" * 4097], ["problem", "1 to 4096 characters"]),
    # kf search start --spec: the JSON itself, then each field
    ([*START, "--spec", "[1]"], ["--spec", "JSON object"]),
    ([*START, "--spec", "{"], ["--spec", "not valid JSON"]),
    ([*START, "--spec", '"softmax"'], ["--spec", "JSON object"]),
    ([*START, "--spec", '{"budget": [1]}', "--max-minutes", "5"], ["budget", "JSON object"]),
    ([*START, "--spec", '{"budget": 3}'], ["budget", "valid dictionary"]),
    ([*START, "--spec", '{"generationz": 2}'], ["generationz", "known fields", "generations"]),
    ([*START, "--spec", '{"generations": true}'], ["generations", "from 1 to 10000"]),
    ([*START, "--spec", '{"generations": "3"}'], ["generations", "from 1 to 10000"]),
    ([*START, "--spec", '{"threads": 2.5}'], ["threads", "from 1 to 1024"]),
    ([*START, "--spec", '{"budget": {"max_wall_minutes": 1e400}}'], ["budget.max_wall_minutes", "at most 10080"]),
    ([*START, "--spec", '{"budget": {"max_wall_minutes": "nan"}}'], ["budget.max_wall_minutes", "at most 10080"]),
    ([*START, "--spec", '{"budget": {"max_candidates": 0}}'], ["budget.max_candidates", "from 1 to 100000"]),
    ([*START, "--spec", '{"budget": {"max_llm_usd": -0.5}}'], ["budget.max_llm_usd", "from 0 to 10000"]),
    ([*START, "--spec", '{"promotion": {"margin": NaN}}'], ["promotion.margin", "from 0 to 1"]),
    ([*START, "--spec", '{"promotion": {"confidence": 0.2}}'], ["promotion.confidence", "more than 0.5"]),
    ([*START, "--spec", '{"proposer": {"kind": "magic"}}'], ["proposer.kind", "one of random, search, gp, llm, mixed"]),
    ([*START, "--spec", json.dumps({"proposer": {"models": ["m"] * 17}})], ["proposer.models", "at most 16"]),
    ([*START, "--spec", '{"flags": "-O3"}'], ["flags", "a list of at most 64 items"]),
    ([*START, "--spec", '{"flags": [""]}'], ["flags.0", "1 to 256 characters"]),
    ([*START, "--spec", json.dumps({"flags": ["-O3"] * 65})], ["flags", "at most 64 items"]),
    ([*START, "--spec", json.dumps({"hints": ["h"] * (MAX_HINTS + 1)})], ["hints", "at most 100 items"]),
    ([*START, "--spec", '{"hints": [7]}'], ["hints.0", "1 to 1000 characters"]),
    ([*START, "--spec", '{"seed": -3}'], ["seed", "from 0 to 4294967295"]),
    ([*START, "--spec", '{"benchmark_seconds": 601}'], ["benchmark_seconds", "at most 600"]),
    ([*START, "--spec", '{"worker_wait_seconds": 0}'], ["worker_wait_seconds", "from 1 to 86400"]),
    ([*START, "--spec", '{"heartbeat_seconds": 1}'], ["heartbeat_seconds", "from 2 to 3600"]),
    ([*START, "--spec", '{"continue_as_new_every": 0}'], ["continue_as_new_every", "from 1 to 10000"]),
    ([*START, "--spec", '{"target": "tpu-v5"}'], ["target", "cuda-sm<NN>"]),
    ([*START, "--spec", '{"task_queue_prefix": "a/b"}'], ["task_queue_prefix", "letters, digits"]),
    ([*START, "--spec", '{"resume_from": ""}'], ["resume_from", "1 to 1000 characters"]),
    ([*START, "--resume-best", "--resume-latest"], ["resume_latest and resume_best", "one starting point"]),
    ([*START, "--resume-best", "--resume-from", "s1"], ["resume_from and resume_best", "one starting point"]),
    # kf search: the verbs that steer a running search
    (["search", "extend", "s1"], ["--max-candidates, --max-minutes or --max-llm-usd"]),
    (["search", "extend", "s1", "--max-minutes", "inf"], ["--max-minutes", "at most 10080"]),
    (["search", "extend", "s1", "--max-candidates", "0"], ["--max-candidates", "from 1 to 100000"]),
    (["search", "extend", "s1", "--max-llm-usd", "nan"], ["--max-llm-usd", "from 0 to 10000"]),
    (["search", "hint", "s1", "   "], ["text", "non-empty"]),
    (["search", "hint", "s1", "x" * 1001], ["text", "at most 1000 characters"]),
    (["search", "show", "a\x01b"], ["search_id", "not a search id"]),
    (["search", "pause", ""], ["search_id", "not a search id"]),
    (["search", "stop", "x" * 1001], ["search_id", "not a search id"]),
    (["search", "list", "--limit", "0"], ["--limit", "1 to 1000"]),
    (["search", "list", "--limit", "100000"], ["--limit", "1 to 1000"]),
    (["audit", ""], ["search_id", "not a search id"]),
    # kf demo: refused before it starts services or a worker
    (["demo", "--generations", "0"], ["--generations", "from 1 to 10000"]),
    (["demo", "--candidates", "many"], ["--candidates", "not an integer", "from 1 to 256"]),
    (["demo", "--problem", ""], ["--problem", "at least 1 character"]),
    # kf lessons
    (["lessons", "--target", "gpu"], ["--target", "cuda-sm<NN>"]),
    (["lessons", "--problem", ""], ["--problem", "at least 1 character"]),
    # kf evaluate: each option, then the source and baseline files
    ([*EVALUATE, "--threads", "0"], ["--threads", "from 1 to 1024"]),
    ([*EVALUATE, "--threads", "100000"], ["--threads", "from 1 to 1024"]),
    ([*EVALUATE, "--threads", str(USABLE_CPUS + 1)], ["--threads", f"pass at most {USABLE_CPUS}"]),
    ([*EVALUATE, "--budget", "nan"], ["--budget", "finite", "at most 600"]),
    ([*EVALUATE, "--budget", "inf"], ["--budget", "at most 600"]),
    ([*EVALUATE, "--budget", "1e9"], ["--budget", "at most 600"]),
    ([*EVALUATE, "--budget", "0"], ["--budget", "more than 0"]),
    ([*EVALUATE, "--seeds", "0"], ["--seeds", "from 1 to 100"]),
    ([*EVALUATE, "--seeds", "101"], ["--seeds", "from 1 to 100"]),
    ([*EVALUATE, "--seeds", "three"], ["--seeds", "not an integer", "from 1 to 100"]),
    ([*EVALUATE, "--flags", '-O3 "-DX=1'], ["flags", "unbalanced quoting", "close every quote"]),
    ([*EVALUATE, "--flags", "-O3 \\"], ["flags", "unbalanced quoting"]),
    ([*EVALUATE, "--flags", " ".join(["-O3"] * 65)], ["--flags", "at most 64 items"]),
    (["evaluate", "--problem", "", "--source", SOURCE], ["--problem", "at least 1 character"]),
    (["evaluate", "--problem", "x" * 4097, "--source", SOURCE], ["--problem", "at most 4096 characters"]),
    (["evaluate", "--problem", "softmax", "--source", "{tmp}/binary.so"], ["--source", "binary", "C source"]),
    (["evaluate", "--problem", "softmax", "--source", "{tmp}/latin1.c"], ["--source", "not UTF-8", "0xe9"]),
    (["evaluate", "--problem", "softmax", "--source", "{tmp}/huge.c"], ["--source", "larger than 1048576"]),
    (["evaluate", "--problem", "softmax", "--source", "{tmp}/missing.c"], ["--source", "no such file"]),
    (["evaluate", "--problem", "softmax", "--source", "{tmp}"], ["--source", "not a file"]),
    ([*EVALUATE, "--baseline", "{tmp}/binary.so"], ["--baseline", "binary"]),
]


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "binary.so").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00" + bytes(range(256)))
    (tmp_path / "latin1.c").write_bytes("/* café */ void f(void) {}\n".encode("latin-1"))
    (tmp_path / "huge.c").write_bytes(b"/* padding */\n" * 80_000)
    return tmp_path


def _id(row: tuple[list[str], list[str]]) -> str:
    return " ".join(arg if len(arg) < 30 else arg[:27] + "..." for arg in row[0])


@pytest.mark.parametrize(("argv", "fragments"), CLI_ROWS, ids=[_id(row) for row in CLI_ROWS])
def test_bad_input_exits_2_naming_the_field_and_what_is_allowed(
    argv: list[str], fragments: list[str], files: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = kf([arg.replace("{tmp}", str(files)) for arg in argv])
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"


def test_a_binary_source_on_stdin_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"int x;\xff\xfe\n")))
    assert kf(["evaluate", "--problem", "softmax", "--source", "-"]) == 2
    assert "--source '-': not UTF-8 text" in capsys.readouterr().err


def test_the_installed_kf_exits_2_before_contacting_any_server(tmp_path: Path) -> None:
    # A real process, with no services anywhere: the refusal must come before any connection attempt.
    kf_script = Path(sys.executable).parent / "kf"
    env = os.environ | {"KF_HOME": str(tmp_path), "KF_TEMPORAL_ADDRESS": "127.0.0.1:9", "KF_DATABASE_URL": ""}
    done = subprocess.run(
        [str(kf_script), "search", "start", "softmax", "--max-minutes", "inf"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "--max-minutes" in done.stderr and "at most 10080" in done.stderr


def test_help_states_the_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    assert kf(["search", "start", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for bound in ("at most 10080", "from 1 to 1024", "from 1 to 10000", "from 0 to 10000", "more than 0.5"):
        assert bound in text
    assert kf(["evaluate", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for bound in ("at most 600", "from 1 to 100", "at most 1048576 bytes", f"the {USABLE_CPUS} CPUs"):
        assert bound in text


# -- the workflow's own input: what the Temporal UI sends -------------------------------------------------

SPEC_ROWS: list[tuple[Any, str]] = [
    ({"problem": "softmax", "budget": {"max_wall_minutes": float("inf")}}, "budget.max_wall_minutes"),
    ({"problem": "softmax", "budget": {"max_wall_minutes": float("nan")}}, "budget.max_wall_minutes"),
    ({"problem": "softmax", "budget": {"max_wall_minutes": 1e9}}, "budget.max_wall_minutes"),
    ({"problem": "softmax", "budget": {"max_candidates": 10**9}}, "budget.max_candidates"),
    ({"problem": "softmax", "budget": {"max_llm_usd": float("inf")}}, "budget.max_llm_usd"),
    ({"problem": "softmax", "promotion": {"margin": float("nan")}}, "promotion.margin"),
    ({"problem": "softmax", "promotion": {"confidence": 1.0}}, "promotion.confidence"),
    ({"problem": "softmax", "generations": True}, "generations"),
    ({"problem": "softmax", "generations": "3"}, "generations"),
    ({"problem": "softmax", "candidates_per_generation": 1000}, "candidates_per_generation"),
    ({"problem": "softmax", "threads": 100_000}, "threads"),
    ({"problem": "softmax", "benchmark_seconds": float("inf")}, "benchmark_seconds"),
    ({"problem": "softmax", "seed": -1}, "seed"),
    ({"problem": "softmax", "hints": ["x" * 1001]}, "hints.0"),
    ({"problem": "softmax", "flags": "-O3"}, "flags"),
    ({"problem": "softmax", "target": "gpu"}, "target"),
    ({"problem": "x" * 4097}, "problem"),
    ({"problem": "softmax", "generationz": 2}, "generationz"),
    ({}, "problem"),
]


@pytest.mark.parametrize(("payload", "field"), SPEC_ROWS, ids=[row[1] for row in SPEC_ROWS])
def test_the_workflow_refuses_the_same_values_at_once_and_for_good(
    payload: dict[str, Any], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ApplicationError) as refused:
        KernelSearch()._state_from_input(payload)
    assert refused.value.non_retryable and refused.value.type == "ValidationError"
    message = refused.value.message
    assert field in message
    # The command line refuses the same payload, with the same explanation.
    argv = ["search", "start", payload.get("problem", "softmax")]
    rest = {k: v for k, v in payload.items() if k != "problem"}
    if rest:
        argv += ["--spec", json.dumps(rest)]  # NaN and Infinity travel as JSON's extensions, as from Python
    if "problem" in payload:
        assert kf(argv) == 2
        explanation = message.removeprefix("invalid search input: ")
        assert explanation in capsys.readouterr().err


@pytest.mark.parametrize("payload", [[1], "softmax", 5, None])
def test_a_ui_payload_that_is_not_an_object_fails_the_search_with_the_fix(payload: Any) -> None:
    with pytest.raises(ApplicationError) as refused:
        KernelSearch()._state_from_input(payload)
    assert refused.value.non_retryable
    assert '{"problem": "softmax"}' in refused.value.message


def test_add_hint_refuses_what_the_spec_would_refuse_at_continue_as_new() -> None:
    search = KernelSearch()
    search._state = SearchState(search_id="s", spec=SearchSpec(problem="softmax", hints=["h"] * (MAX_HINTS - 1)))
    search._validate_hint("one more")  # the last one that fits
    with pytest.raises(ValueError, match="at most 1000 characters"):
        search._validate_hint("x" * 1001)
    search._state.spec.hints.append("one more")
    with pytest.raises(ValueError, match=f"at most {MAX_HINTS} hints"):
        search._validate_hint("too many")
    SearchState.model_validate(search._state.model_dump(mode="json"))  # what continue-as-new carries


def test_extend_budget_refuses_an_infinite_or_unbounded_budget() -> None:
    search = KernelSearch()
    search._state = SearchState(search_id="s", spec=SearchSpec(problem="softmax"))
    for bad in ({"max_wall_minutes": float("inf")}, {"max_candidates": 10**9}, {"max_llm_usd": float("nan")}):
        with pytest.raises(ValidationError):
            search._validate_budget(bad)
    search._validate_budget({"max_wall_minutes": 60.0})


def test_extend_budget_refuses_to_lower_a_limit() -> None:
    search = KernelSearch()
    search._state = SearchState(search_id="s", spec=SearchSpec(problem="softmax", budget={"max_candidates": 10}))
    with pytest.raises(ValueError, match="max_candidates 3 is below the search's max_candidates of 10"):
        search._validate_budget({"max_candidates": 3})
    search._validate_budget({"max_candidates": 10})  # the same limit is no change
    search._validate_budget({"max_candidates": 20, "max_llm_usd": 1.0})  # a limit it did not have is set
