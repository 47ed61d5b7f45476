"""The LLM path end to end: a KernelSearch whose proposers are LLMs, through real litellm, against a scripted
OpenAI-compatible server on 127.0.0.1, on the real Temporal dev server and Postgres.

Replies are scripted so that each generation holds a good kernel and a bad reply; the order requests meet
replies does not matter to the assertions.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from scripted_llm_server import ScriptedLLMServer, chat
from search_fixtures import QUICK, running_worker, start
from temporalio.client import Client
from test_llm_proposer import GOOD_SOFTMAX, MODEL, WRONG_SOFTMAX, reply_with

from engine.evidence.store import EventStore
from engine.search.history import load_search_history, stream_of

pytestmark = pytest.mark.slow


@pytest.fixture
def llm_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as server:
        monkeypatch.setenv("KF_LLM_API_BASE", server.api_base)
        monkeypatch.setenv("KF_LLM_API_KEY", "sk-test")
        monkeypatch.setenv("KF_LLM_CONCURRENCY", "1")
        monkeypatch.delenv("KF_MODELS", raising=False)
        yield server


async def test_an_llm_search_evaluates_good_replies_and_records_bad_ones(
    client: Client, store: EventStore, prefix: str, llm_server: ScriptedLLMServer
) -> None:
    variant = GOOD_SOFTMAX.replace("#include <math.h>", "#include <math.h>\n/* variant two */")
    llm_server.script(
        # Generation 1: an explorer and a tuner.
        chat(reply_with(GOOD_SOFTMAX)),
        chat("I would use an online softmax, but here is no code."),
        # Generation 2: a fixer for the reply without code, and an explorer.
        chat(reply_with(WRONG_SOFTMAX, tags="scaled")),
        chat(reply_with(variant, tags="variant")),
    )
    async with running_worker(client, store, prefix):
        handle = await start(
            client,
            prefix,
            {
                "problem": "softmax",
                "generations": 2,
                "candidates_per_generation": 2,
                "proposer": {"kind": "llm", "models": [MODEL]},
                **QUICK,
            },
        )
        result = await handle.result()

    assert result.status == "completed"
    events = await store.read_stream(stream_of(handle.id))
    types = [e.type for e in events]
    assert types.count("llm.called") == 4
    assert types.count("proposal.failed") == 1
    failed = next(e for e in events if e.type == "proposal.failed")
    assert failed.payload["reason"] == "no_code"

    history = await load_search_history(store, handle.id)
    llm_candidates = [c for c in history.candidates.values() if c.proposer.startswith("llm:")]
    verdicts = sorted(c.verdict for c in llm_candidates)
    assert verdicts == ["incorrect", "ok", "ok"], verdicts
    # The second generation's prompts include a fixer holding the first generation's failure.
    systems = [r["messages"][0]["content"] for r in llm_server.requests]
    assert any("FIXER" in s for s in systems[2:])
    assert result.candidates_done == 4  # the seed and three LLM kernels; the reply without code is no candidate
    assert await store.verify(stream_of(handle.id)) is None
