"""The LLM proposers through real litellm, against a scripted OpenAI-compatible server on 127.0.0.1.

Every test runs under a guard that refuses any socket connection or name lookup other than loopback, so
litellm (price list, telemetry) and the proposers provably send nothing off this machine.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lessons_fixtures import recorded_event
from scripted_llm_server import ScriptedLLMServer, chat, error, rate_limited, slow

from engine.errors import ConfigurationError, UserError
from engine.evidence.events import NewEvent
from engine.evidence.store import EventStore
from engine.llm_budget import BudgetExhausted, LLMBudget
from engine.problems import Problem, load_problem
from engine.proposers import (
    LLMCall,
    LLMProposer,
    MixedProposer,
    ProposalBatch,
    ProposalContext,
    ProposalFailure,
    SearchProposer,
    propose_batch,
    proposer_for,
)
from engine.proposers.failures import (
    FAILURE_PAGE,
    RecentFailure,
    failure_from_compile,
    failure_from_rejected_reply,
    failure_from_validation,
    read_recent_failures,
    recent_failures_from_events,
)
from engine.proposers.llm import plan_requests
from engine.proposers.llm_reply import ReplyRejected, parse_reply
from engine.proposers.llm_settings import LLMSettings, ModelConfig
from engine.search.candidates import Candidate

MODEL = "openai/test-model"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}

# --- kernels the scripted model "writes" ---------------------------------------------------------------

GOOD_SOFTMAX = """
#include <float.h>
#include <math.h>
#include <stdint.h>

/* One pass for max and sum (online softmax), one to write. The running max starts at -FLT_MAX, not -INFINITY:
 * a row that starts with masked -inf scores then adds exp(-inf) = 0, not exp(-inf - -inf) = NaN. */
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -FLT_MAX, s = 0.0f;
        for (int64_t c = 0; c < cols; c++) {
            float v = xr[c];
            if (v > m) { s = s * expf(m - v) + 1.0f; m = v; } else { s += expf(v - m); }
        }
        float inv = 1.0f / s;
        for (int64_t c = 0; c < cols; c++) yr[c] = expf(xr[c] - m) * inv;
    }
}
"""
NOT_COMPILING = GOOD_SOFTMAX.replace("float inv = 1.0f / s;", "float inv = 1.0f / total_sum;")
WRONG_SOFTMAX = GOOD_SOFTMAX.replace("* inv;", "* inv * 0.5f;")
# Aborts (a crash verdict) if the worker's API key reached the candidate's process.
KEY_PROBE = """
#include <stdint.h>
#include <stdlib.h>
#include <math.h>

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    if (getenv("OPENAI_API_KEY") != NULL || getenv("KF_LLM_API_KEY") != NULL) abort();
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; c++) yr[c] /= s;
    }
}
"""


def reply_with(source: str, rationale: str = "online softmax saves a pass", tags: str = "online-softmax") -> str:
    return f"Here is the kernel.\n\n```c\n{source.strip()}\n```\n\nRATIONALE: {rationale}\nTAGS: {tags}\n"


# --- fixtures -------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refuse any connection or name lookup that would leave this machine."""
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def allowed(address: Any) -> bool:
        return not isinstance(address, tuple) or str(address[0]) in LOOPBACK

    def connect(self: socket.socket, address: Any) -> None:
        if not allowed(address):
            raise AssertionError(f"a test tried to connect to {address!r}: only loopback is allowed")
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if not allowed(address):
            raise AssertionError(f"a test tried to connect to {address!r}: only loopback is allowed")
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None and str(host) not in LOOPBACK:
            raise AssertionError(f"a test tried to resolve {host!r}: only loopback is allowed")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    for variable in ("KF_MODELS", "KF_LLM_API_BASE", "KF_LLM_API_KEY", "KF_LLM_MODEL_CONFIG"):
        monkeypatch.delenv(variable, raising=False)


@pytest.fixture(scope="module")
def kf_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private state folder, so compiled artifacts land in this module's own cache."""
    home = tmp_path_factory.mktemp("kf_home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KF_HOME", str(home))
        yield home


@pytest.fixture
def server() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as running:
        yield running


@pytest.fixture(scope="module")
def softmax() -> Problem:
    return load_problem("softmax")


def settings_for(server: ScriptedLLMServer, **overrides: Any) -> LLMSettings:
    """Settings that reach the scripted server; one request at a time so replies meet requests in order."""
    values: dict[str, Any] = {
        "models": [MODEL],
        "api_base": server.api_base,
        "api_key": "sk-test",
        "backoff_base_s": 0.01,
        "backoff_max_s": 0.05,
        "timeout_s": 20.0,
        "max_attempts": 3,
        "concurrency": 1,
    }
    return LLMSettings.model_validate(values | overrides)


def context_for(problem: Problem, **fields: Any) -> ProposalContext:
    values: dict[str, Any] = {
        "search_id": "s-llm",
        "problem": problem.name,
        "target": "cpu-x86_64-test",
        "generation": 1,
        "count": 1,
        "seed": 0,
    }
    return ProposalContext.model_validate(values | fields)


def harness() -> tuple[Any, Any]:
    """The compile and validate functions of the CPU harness."""
    cpu_backend = pytest.importorskip("engine.harness.cpu")
    evaluation = pytest.importorskip("engine.harness.evaluation")
    return cpu_backend.compile_source, evaluation.validate_artifact


# --- replies: extraction and checks ---------------------------------------------------------------------


def test_reply_code_is_extracted_from_the_c_block_with_rationale_and_tags(softmax: Problem) -> None:
    reply = (
        "Plan:\n```text\nnot code\n```\n"
        + reply_with(GOOD_SOFTMAX, "fewer passes", "Online-Softmax, unroll=4, `simd`")
        + "\n```python\nprint('x')\n```"
    )
    parsed = parse_reply(reply, softmax.entry, len(softmax.params))
    assert parsed.source.strip() == GOOD_SOFTMAX.strip()
    assert parsed.rationale == "fewer passes"
    assert parsed.tags == ["online-softmax", "unroll=4", "simd"]
    # Without a c-tagged block, the largest block is the code.
    untagged = "```\n" + GOOD_SOFTMAX + "```\n```\nint x;\n```"
    assert parse_reply(untagged, softmax.entry, 4).source.strip() == GOOD_SOFTMAX.strip()


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("I would use online softmax.", "no_code"),
        ("```c\n\n```", "empty_code"),
        (reply_with(GOOD_SOFTMAX.replace("void softmax(", "void softmax_kernel(")), "missing_entry"),
        (reply_with(GOOD_SOFTMAX.replace("int64_t cols)", "int64_t cols, int extra)")), "wrong_arity"),
        (reply_with("#include <stdio.h>\n" + GOOD_SOFTMAX), "forbidden_include"),
        (reply_with("#include <unistd.h>\n" + GOOD_SOFTMAX), "forbidden_include"),
        (reply_with(GOOD_SOFTMAX.replace("float inv", 'system("id"); float inv')), "forbidden_call"),
        (reply_with(GOOD_SOFTMAX.replace("float inv", 'const char *k = getenv ("K"); float inv')), "forbidden_call"),
    ],
)
def test_unusable_replies_are_rejected_with_a_reason(softmax: Problem, reply: str, reason: str) -> None:
    with pytest.raises(ReplyRejected) as rejected:
        parse_reply(reply, softmax.entry, len(softmax.params))
    assert rejected.value.reason == reason
    assert rejected.value.message


def test_checks_ignore_comments_and_strings(softmax: Problem) -> None:
    source = GOOD_SOFTMAX.replace("/* One pass", "/* never call system() or fork() here. One pass")
    source = '// getenv("X") is not used\n' + source
    assert parse_reply(reply_with(source), softmax.entry, len(softmax.params)).source.strip() == source.strip()


# --- budget, roles, settings ----------------------------------------------------------------------------


def test_budget_counts_spent_plus_in_flight() -> None:
    budget = LLMBudget(limit_usd=1.0, spent_usd=0.25)
    first = budget.reserve(0.5)
    with pytest.raises(BudgetExhausted, match="in flight"):
        budget.reserve(0.5)  # 0.25 spent + 0.5 in flight + 0.5 > 1.0
    budget.settle(first, 0.1)
    assert budget.spent_usd == pytest.approx(0.35)
    assert budget.in_flight_usd == 0
    second = budget.reserve(0.5)
    assert budget.remaining_usd() == pytest.approx(0.15)
    budget.settle(second, 0.0)
    with pytest.raises(ValueError, match="already settled"):
        budget.settle(second, 0.0)
    unlimited = LLMBudget(limit_usd=None, spent_usd=100.0)
    unlimited.reserve(1e6)
    assert unlimited.remaining_usd() is None


def test_fixers_take_the_newest_failures_then_explorers_and_tuners(softmax: Problem) -> None:
    failures = [
        RecentFailure(stage="compile", verdict="compile_error", message=f"error {i}", candidate_id=str(i))
        for i in range(3)
    ]
    plan = plan_requests(context_for(softmax, count=4, recent_failures=failures), ["m1", "m2"])
    assert [p.role for p in plan] == ["fixer", "fixer", "explorer", "tuner"]
    assert [p.failure.message for p in plan if p.failure] == ["error 0", "error 1"]
    assert [p.model for p in plan] == ["m2", "m1", "m2", "m1"]
    assert [p.role for p in plan_requests(context_for(softmax, count=1, recent_failures=failures), ["m"])] == ["fixer"]
    assert [p.role for p in plan_requests(context_for(softmax, count=3), ["m"])] == ["explorer", "tuner", "explorer"]


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KF_MODELS", "openai/a, anthropic/b ,")
    monkeypatch.setenv("KF_LLM_API_BASE", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("KF_LLM_MAX_TOKENS", "1000")
    monkeypatch.setenv(
        "KF_LLM_MODEL_CONFIG", '{"openai/a": {"api_base": "http://127.0.0.1:8/v1", "input_usd_per_mtok": 1}}'
    )
    settings = LLMSettings.from_env()
    assert settings.models == ["openai/a", "anthropic/b"]
    assert settings.max_tokens == 1000
    assert settings.api_base_for("openai/a") == "http://127.0.0.1:8/v1"
    assert settings.api_base_for("anthropic/b") == "http://127.0.0.1:9/v1"
    # Built in code, the arguments are the settings.
    assert LLMSettings(models=["x"], max_tokens=100).models == ["x"]
    monkeypatch.setenv("KF_LLM_MODEL_CONFIG", "{nope")
    with pytest.raises(ConfigurationError, match="KF_LLM_MODEL_CONFIG is not JSON"):
        LLMSettings.from_env()
    monkeypatch.delenv("KF_LLM_MODEL_CONFIG")
    monkeypatch.setenv("KF_LLM_TIMEOUT_S", "-1")
    with pytest.raises(ConfigurationError, match=r"KF_LLM_TIMEOUT_S='-1': Input should be greater than 0"):
        LLMSettings.from_env()
    monkeypatch.setenv("KF_LLM_TIMEOUT_S", "30")
    monkeypatch.setenv("KF_LLM_MODEL_CONFIG", '{"openai/a": {"price": 1}}')
    with pytest.raises(ConfigurationError, match=r"KF_LLM_MODEL_CONFIG at openai/a\.price: Extra inputs"):
        LLMSettings.from_env()


def test_llm_kinds_need_a_model_and_are_registered() -> None:
    with pytest.raises(UserError, match="KF_MODELS"):
        proposer_for("llm", models=[])
    assert isinstance(proposer_for("llm", models=[MODEL]), LLMProposer)
    mixed = proposer_for("mixed", models=[MODEL])
    assert isinstance(mixed, MixedProposer)


# --- through litellm and the scripted server ------------------------------------------------------------


def test_a_good_reply_becomes_a_candidate_that_compiles_and_validates(
    softmax: Problem, server: ScriptedLLMServer, kf_home: Path
) -> None:
    compile_source, validate_artifact = harness()
    server.script(chat(reply_with(GOOD_SOFTMAX), prompt_tokens=900, completion_tokens=300))
    incumbent = Candidate.create(softmax.seed_source(), None, label="seed", proposer="seed")
    batch = LLMProposer(settings_for(server)).propose_with_outcomes(
        softmax, context_for(softmax, incumbent=incumbent, incumbent_evidence={"speedup": 1.2})
    )
    assert batch.failures == []
    [candidate] = batch.candidates
    assert candidate.proposer == f"llm:explorer:{MODEL}"
    assert candidate.parent_id == incumbent.candidate_id
    assert candidate.tags == ["online-softmax"]
    assert candidate.rationale == "online softmax saves a pass"
    [call] = batch.calls
    assert (call.status, call.attempts, call.prompt_tokens, call.completion_tokens) == ("ok", 1, 900, 300)
    assert call.latency_s > 0
    # The test model has no price: its cost is recorded as unknown, not guessed.
    assert (call.cost_usd, call.cost_known, call.cost_source) == (0.0, False, "unknown")
    request = server.requests[0]
    assert request["model"] == "test-model"
    assert request["max_tokens"] == LLMSettings().max_tokens

    compiled = compile_source(softmax, candidate.source, candidate.flags)
    assert compiled.verdict == "ok", compiled.first_error
    report = validate_artifact(softmax, compiled.artifact_id, base_seed=7, threads=1)
    assert report.verdict == "ok", report.message


def test_bad_replies_are_recorded_outcomes_and_the_next_prompt_is_a_fixer(
    softmax: Problem, server: ScriptedLLMServer, kf_home: Path
) -> None:
    compile_source, validate_artifact = harness()
    server.script(
        chat("Use an online softmax; I will write it next time."),
        chat(reply_with(NOT_COMPILING, tags="online-softmax")),
        chat(reply_with(WRONG_SOFTMAX, tags="online-softmax, scaled")),
    )
    proposer = LLMProposer(settings_for(server))
    batch = proposer.propose_with_outcomes(softmax, context_for(softmax, count=3))
    [no_code] = batch.failures
    assert (no_code.reason, no_code.role, no_code.model) == ("no_code", "explorer", MODEL)
    assert "online softmax" in no_code.reply_excerpt
    assert [c.status for c in batch.calls] == ["ok", "ok", "ok"]
    broken, wrong = batch.candidates

    compiled = compile_source(softmax, broken.source, broken.flags)
    assert compiled.verdict == "compile_error"
    built = compile_source(softmax, wrong.source, wrong.flags)
    assert built.verdict == "ok", built.first_error
    report = validate_artifact(softmax, built.artifact_id, base_seed=3, threads=1)
    assert report.verdict == "incorrect"

    failures = [
        failure_from_rejected_reply(no_code.reason, no_code.message, no_code.reply_excerpt, label=no_code.label),
        failure_from_compile(broken.candidate_id, broken.source, compiled, label=broken.label),
        failure_from_validation(wrong.candidate_id, wrong.source, report, label=wrong.label),
    ]
    assert "total_sum" in failures[1].message
    for failure, expected in zip(failures, ["no fenced code block", "total_sum", failures[2].message], strict=True):
        server.script(chat(reply_with(GOOD_SOFTMAX)))
        fixed = proposer.propose_with_outcomes(
            softmax, context_for(softmax, generation=2, count=1, recent_failures=[failure])
        )
        system, user = server.requests[-1]["messages"]
        assert "You are the FIXER" in system["content"]
        assert expected in user["content"]
        [candidate] = fixed.candidates
        assert candidate.proposer == f"llm:fixer:{MODEL}"
        assert candidate.parent_id == failure.candidate_id
    # The failing sources reach the fixer, so it can repair them.
    assert "1.0f / total_sum" in server.prompts()[-2]
    assert "* inv * 0.5f" in server.prompts()[-1]


def test_a_rate_limit_is_retried_with_back_off(softmax: Problem, server: ScriptedLLMServer) -> None:
    server.script(rate_limited(retry_after_s=0.02), rate_limited(), chat(reply_with(GOOD_SOFTMAX)))
    batch = LLMProposer(settings_for(server)).propose_with_outcomes(softmax, context_for(softmax))
    [call] = batch.calls
    assert (call.status, call.attempts) == ("ok", 3)
    assert call.backoff_s >= 0.02  # the Retry-After header was honoured
    assert len(batch.candidates) == 1
    assert len(server.requests) == 3


def test_attempts_are_bounded_and_a_failed_call_is_an_outcome(softmax: Problem, server: ScriptedLLMServer) -> None:
    server.script(rate_limited(), rate_limited(), rate_limited(), error(401, "Incorrect API key sk-test", "auth"))
    proposer = LLMProposer(settings_for(server, max_attempts=3))
    batch = proposer.propose_with_outcomes(softmax, context_for(softmax))
    [call] = batch.calls
    assert (call.status, call.attempts) == ("rate_limited", 3)
    [failure] = batch.failures
    assert failure.reason == "call_failed"
    assert "rate_limited after 3 attempt(s)" in failure.message
    # An authentication error is not worth retrying, and the key never appears in the record.
    batch = proposer.propose_with_outcomes(softmax, context_for(softmax))
    [call] = batch.calls
    assert (call.status, call.attempts) == ("error", 1)
    assert "sk-test" not in call.error and "sk-test" not in batch.failures[0].message
    assert len(server.requests) == 4


def test_a_timeout_is_retried_and_counted_at_its_worst_case(softmax: Problem, server: ScriptedLLMServer) -> None:
    server.script(slow(chat(reply_with(GOOD_SOFTMAX)), 3.0), chat(reply_with(GOOD_SOFTMAX), completion_tokens=50))
    # $1000 per million output tokens, 1000 max tokens: each attempt reserves $1.00.
    priced = {MODEL: ModelConfig(input_usd_per_mtok=0.0, output_usd_per_mtok=1000.0)}
    settings = settings_for(server, timeout_s=0.5, max_tokens=1000, model_configs=priced)
    batch = LLMProposer(settings).propose_with_outcomes(softmax, context_for(softmax, llm_budget_usd=10.0))
    [call] = batch.calls
    assert (call.status, call.attempts) == ("ok", 2)
    assert len(batch.candidates) == 1
    # The abandoned request may still be billed: it counts at its worst case, the answered one at its usage.
    assert call.cost_usd == pytest.approx(1.0 + 0.05)

    # When the retry no longer fits the budget, it is not sent.
    server.script(slow(chat(reply_with(GOOD_SOFTMAX)), 3.0), chat(reply_with(GOOD_SOFTMAX)))
    batch = LLMProposer(settings).propose_with_outcomes(softmax, context_for(softmax, llm_budget_usd=1.5))
    [call] = batch.calls
    assert (call.status, call.attempts, call.cost_usd) == ("budget_exhausted", 1, pytest.approx(1.0))
    assert batch.budget_exhausted and batch.candidates == []
    assert [f.reason for f in batch.failures] == ["call_failed"]
    assert server.pending == 1


def test_the_budget_stops_proposals_before_it_is_exceeded(softmax: Problem, server: ScriptedLLMServer) -> None:
    # Output at $1000 per million tokens and 1000 max tokens: every call reserves exactly $1.00.
    priced = {MODEL: ModelConfig(input_usd_per_mtok=0.0, output_usd_per_mtok=1000.0)}
    settings = settings_for(server, max_tokens=1000, concurrency=2, model_configs=priced)
    # The first reply takes a while, so it is surely in flight when the second request is planned (on a busy
    # machine a fast reply could settle at $0.08 first, and then the second would fit).
    server.script(slow(chat(reply_with(GOOD_SOFTMAX), completion_tokens=80), 2.0), chat(reply_with(WRONG_SOFTMAX)))

    # Two requests of $1.00 each against $1.50: the second does not fit while the first is in flight.
    batch = LLMProposer(settings).propose_with_outcomes(softmax, context_for(softmax, count=2, llm_budget_usd=1.5))
    assert len(server.requests) == 1
    assert batch.budget_exhausted
    assert "$1.5000 would be exceeded" in batch.stop_reason
    [call] = batch.calls
    assert (call.reserved_usd, call.cost_usd, call.cost_known, call.cost_source) == (
        pytest.approx(1.0),
        pytest.approx(0.08),
        True,
        "configured",
    )
    assert batch.spent_usd == pytest.approx(0.08)

    # A search that has spent $0.60 of $1.50 cannot afford a $1.00 call: nothing is sent at all.
    batch = LLMProposer(settings).propose_with_outcomes(
        softmax, context_for(softmax, count=2, llm_budget_usd=1.5, llm_spent_usd=0.6)
    )
    assert (batch.candidates, batch.calls, batch.budget_exhausted) == ([], [], True)
    assert len(server.requests) == 1
    assert server.pending == 1


def test_a_model_without_a_price_is_not_called_under_a_budget(softmax: Problem, server: ScriptedLLMServer) -> None:
    batch = LLMProposer(settings_for(server)).propose_with_outcomes(softmax, context_for(softmax, llm_budget_usd=5))
    [failure] = batch.failures
    assert failure.reason == "price_unknown"
    assert "KF_LLM_MODEL_CONFIG" in failure.message
    assert server.requests == []


def test_the_prompt_holds_problem_incumbent_evidence_failures_lessons_and_hints(
    softmax: Problem, server: ScriptedLLMServer
) -> None:
    server.script(chat(reply_with(GOOD_SOFTMAX)), chat(reply_with(WRONG_SOFTMAX)))
    incumbent = Candidate.create(
        softmax.render_template(
            {"VEC": 256, "ONLINE": 1, "UNROLL": 4, "EXP": 5, "SIMD": 1, "FUSED": 1, "KEEP": 0, "NT": 0, "PF": 0}
            | {"ALIGN": 0, "PIPE": 0, "ROWS": 1, "SPLIT": 0}
        ),
        None,
        label="template X",
        proposer="random",
    )
    failure = RecentFailure(
        stage="validate",
        verdict="incorrect",
        message="y differs at [3, 7]: expected 0.25, got nan",
        candidate_id="c" * 64,
        label="llm tuner",
        source="void softmax(...) { /* bad */ }",
    )
    context = context_for(
        softmax,
        count=2,
        generation=4,
        incumbent=incumbent,
        incumbent_evidence={"speedup": 1.5, "ci_low": 1.4, "ci_high": 1.6, "generation": 3},
        recent_failures=[failure],
        lessons_summary="online-softmax: 9 attempts, 100% correct, median speedup over parent 1.31x",
        hints=["rows are long: vectorise across columns"],
        flags=["-O3"],
    )
    LLMProposer(settings_for(server)).propose_with_outcomes(softmax, context)
    fixer, explorer = server.prompts()
    for prompt in (fixer, explorer):
        assert softmax.signature in prompt
        assert "exp(x[r, :] - max(x[r, :]))" in prompt  # the semantics, from problem.py's docstring
        assert "cpu-x86_64-test" in prompt and "-O3" in prompt
        assert "#define ONLINE 1" in prompt  # the incumbent's source
        assert "1.500x faster than numpy (95% interval [1.400, 1.600])" in prompt
        assert "online-softmax: 9 attempts" in prompt
        assert "rows are long: vectorise across columns" in prompt
        assert "expected 0.25, got nan" in prompt
    assert "You are the FIXER" in fixer and "/* bad */" in fixer
    assert "You are the EXPLORER" in explorer and "/* bad */" not in explorer


def test_a_local_server_is_reached_through_the_environment(
    softmax: Problem, server: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The way a local vLLM / llama.cpp / Ollama server is configured: an `openai/` model and a base URL.
    monkeypatch.setenv("KF_MODELS", "openai/local-coder")
    monkeypatch.setenv("KF_LLM_API_BASE", f"http://127.0.0.1:{server.port}")
    monkeypatch.setenv("KF_LLM_API_KEY", "local")
    server.script(chat(reply_with(GOOD_SOFTMAX)))
    proposer = proposer_for("llm", models=[])
    batch = propose_batch(proposer, softmax, context_for(softmax))
    assert [c.proposer for c in batch.candidates] == ["llm:explorer:openai/local-coder"]
    assert server.paths == ["/chat/completions"]
    assert server.requests[0]["model"] == "local-coder"


def test_the_mixed_proposer_splits_a_generation_between_llm_roles_and_the_offline_proposer(
    softmax: Problem, server: ScriptedLLMServer
) -> None:
    failure = RecentFailure(stage="compile", verdict="compile_error", message="error: 'q' undeclared", candidate_id="f")
    server.script(chat(reply_with(GOOD_SOFTMAX)), chat("no code, sorry"))
    mixed = proposer_for("mixed", models=[MODEL])
    assert isinstance(mixed, MixedProposer) and isinstance(mixed.offline, SearchProposer)
    mixed.llm = LLMProposer(settings_for(server))
    batch = mixed.propose_with_outcomes(softmax, context_for(softmax, count=4, recent_failures=[failure]))
    roles = [c.role for c in batch.calls]
    assert roles == ["fixer", "explorer"]
    # One LLM reply was rejected: the offline proposer fills the generation to its count.
    assert len(batch.candidates) == 4
    assert [c.proposer for c in batch.candidates].count(f"llm:fixer:{MODEL}") == 1
    assert [c.proposer for c in batch.candidates].count("search") == 3
    assert len({c.candidate_id for c in batch.candidates}) == 4
    assert [f.reason for f in batch.failures] == ["no_code"]
    assert isinstance(propose_batch(proposer_for("random"), softmax, context_for(softmax)), ProposalBatch)


def failure_log() -> list[tuple[str, dict[str, Any]]]:
    """A search's stream with a compile error, a wrong result, a passing candidate and a rejected reply."""
    proposed = {"candidate_id": "a" * 64, "source": "int broken;", "label": "llm tuner"}
    return [
        ("candidate.proposed", {"generation": 1, "candidate": proposed}),
        (
            "candidate.compiled",
            {
                "generation": 1,
                "candidate_id": "a" * 64,
                "output": {"verdict": "compile_error"},
                "evidence": {
                    "verdict": "compile_error",
                    "first_error": "error: x undeclared",
                    "error_category": "undeclared",
                },
            },
        ),
        (
            "candidate.validated",
            {
                "generation": 1,
                "candidate_id": "b" * 64,
                "output": {"verdict": "incorrect"},
                "evidence": {
                    "verdict": "incorrect",
                    "cases": [
                        {"phase": "validation", "check": "output", "max_abs_err": 0.1, "message": "small"},
                        {
                            "phase": "validation",
                            "check": "output",
                            "max_abs_err": 9.0,
                            "message": "worst",
                            "shape": {"rows": 3, "cols": 7},
                        },
                    ],
                },
            },
        ),
        ("candidate.validated", {"candidate_id": "c" * 64, "output": {"verdict": "ok"}, "evidence": {}}),
        (
            "proposal.failed",
            {"reason": "no_code", "message": "no block", "role": "explorer", "model": MODEL, "reply_excerpt": "hm"},
        ),
    ]


def test_recent_failures_are_read_from_the_event_log() -> None:
    events = [recorded_event(n, kind, payload) for n, (kind, payload) in enumerate(failure_log(), start=1)]
    newest, wrong, broken = recent_failures_from_events(events)
    assert (newest.stage, newest.verdict, newest.label, newest.source) == (
        "proposal",
        "no_code",
        f"llm explorer {MODEL}",
        "hm",
    )
    assert wrong.message.startswith("worst (shape {'rows': 3, 'cols': 7}") and wrong.category == "output"
    assert (broken.stage, broken.message, broken.category, broken.source) == (
        "compile",
        "error: x undeclared",
        "undeclared",
        "int broken;",
    )
    assert recent_failures_from_events(events, limit=1) == [newest]


async def test_the_propose_step_reads_only_the_failures_it_needs_from_the_log(store: EventStore) -> None:
    """The database picks the failures out of a long stream: the same failures, newest first, as decoding
    the whole stream gives, among many passing candidates and a failure that was the harness's."""
    log = failure_log()
    ok_source = {"candidate_id": "", "source": "int fine;", "label": "fine"}
    for n in range(40):
        cid = f"{n:064d}"
        log.insert(0, ("candidate.proposed", {"generation": 0, "candidate": {**ok_source, "candidate_id": cid}}))
        log.insert(1, ("candidate.compiled", {"candidate_id": cid, "output": {"verdict": "ok"}, "evidence": {}}))
    harness = {"candidate_id": "d" * 64, "output": {"verdict": "harness_error"}, "evidence": {}}
    log.append(("candidate.proposed", {"generation": 2, "candidate": {**ok_source, "candidate_id": "d" * 64}}))
    log.append(("candidate.benchmarked", harness))
    await store.append(
        "search-s", [NewEvent(event_id=f"e{n}", type=kind, payload=payload) for n, (kind, payload) in enumerate(log)]
    )
    await store.append("search-other", [NewEvent(event_id="x", type=failure_log()[1][0], payload=failure_log()[1][1])])
    whole = recent_failures_from_events(await store.read_stream("search-s"))
    assert [(f.stage, f.verdict) for f in whole] == [
        ("proposal", "no_code"),
        ("validate", "incorrect"),
        ("compile", "compile_error"),
    ]
    assert await read_recent_failures(store, "search-s") == whole
    assert await read_recent_failures(store, "search-s", limit=2) == whole[:2]
    assert (await read_recent_failures(store, "search-s"))[-1].source == "int broken;"
    assert await read_recent_failures(store, "search-none") == []


def test_the_candidate_process_environment_holds_no_api_key(
    softmax: Problem, kf_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compile_source, _ = harness()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-worker-secret")
    monkeypatch.setenv("KF_LLM_API_KEY", "sk-worker-secret")
    # A kernel may not even look: getenv is outside the screen's allow-list.
    compiled = compile_source(softmax, KEY_PROBE, None)
    assert compiled.verdict == "forbidden" and "getenv" in (compiled.first_error or ""), compiled.first_error
    # And the sandboxed worker's environment (which a kernel could reach without symbols) holds no key.
    from engine.harness.sandbox import Sandbox, SandboxLimits

    probe = "import os, sys; sys.exit(3 if any('sk-worker-secret' in v for v in os.environ.values()) else 0)"
    control = "import os, sys; sys.exit(3 if 'PATH' in os.environ else 0)"
    with Sandbox() as sandbox:
        assert sandbox.run([sys.executable, "-I", "-c", probe], SandboxLimits(wall_seconds=60)).exit_code == 0
        assert sandbox.run([sys.executable, "-I", "-c", control], SandboxLimits(wall_seconds=60)).exit_code == 3


def test_a_rounds_outcome_events_feed_the_next_rounds_fixer() -> None:
    batch = ProposalBatch(
        failures=[ProposalFailure(reason="forbidden_call", message="calls system()", role="tuner", model=MODEL)],
        calls=[LLMCall(model=MODEL, role="tuner", status="ok", attempts=1, cost_usd=0.02, cost_known=True)],
    )
    records = batch.outcome_events("s", 3)
    assert [(i, t) for i, t, _ in records] == [
        ("s/g3/proposal-failed/0", "proposal.failed"),
        ("s/g3/llm-call/0", "llm.called"),
    ]
    events = [recorded_event(n, kind, payload) for n, (_, kind, payload) in enumerate(records, start=1)]
    [failure] = recent_failures_from_events(events)
    assert (failure.stage, failure.verdict, failure.message, failure.label) == (
        "proposal",
        "forbidden_call",
        "calls system()",
        f"llm tuner {MODEL}",
    )
    assert batch.spent_usd == pytest.approx(0.02)


async def test_the_newest_failures_are_found_past_a_page_of_harness_failures(store: EventStore) -> None:
    """A long search is read a page of failures at a time: kernel failures behind more than a page of the
    harness's own failures are still found, each at its first failing step, and the newest come first."""
    log: list[tuple[str, dict[str, Any]]] = []

    def candidate(cid: str, source: str) -> None:
        log.append(("candidate.proposed", {"generation": 1, "candidate": {"candidate_id": cid, "source": source}}))

    for n in range(3):
        cid = f"k{n}"
        candidate(cid, f"int broken{n};")
        compile_error = {"verdict": "compile_error", "first_error": f"error {n}", "log": ""}
        log.append(
            (
                "candidate.compiled",
                {"candidate_id": cid, "output": {"verdict": "compile_error"}, "evidence": compile_error},
            )
        )
    for n in range(2 * FAILURE_PAGE + 5):
        cid = f"h{n}"
        candidate(cid, "int fine;")
        harness = {"candidate_id": cid, "output": {"verdict": "harness_error"}, "evidence": {}}
        log.append(("candidate.benchmarked", harness))
    await store.append(
        "search-long", [NewEvent(event_id=f"l{n}", type=kind, payload=payload) for n, (kind, payload) in enumerate(log)]
    )
    whole = recent_failures_from_events(await store.read_stream("search-long"))
    assert [f.candidate_id for f in whole] == ["k2", "k1", "k0"]
    assert await read_recent_failures(store, "search-long") == whole
    assert await read_recent_failures(store, "search-long", limit=1) == whole[:1]
    assert whole[0].source == "int broken2;" and "error 2" in whole[0].message
