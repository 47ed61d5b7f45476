"""`kf schedule`: a real Temporal Schedule on the dev server whose runs are searches, warm-started.

The commands run as a user types them (cli.main, in a thread: each handler runs its own event loop), against
the session's dev server; the searches run on this test's worker and queues (--prefix).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from search_fixtures import QUICK, running_worker, start
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from activities.schedule_client import describe_schedule
from cli import main
from engine.evidence.store import EventStore
from engine.search.history import load_search_history
from engine.search.schedules import INTERVAL_FORM
from engine.search.state import SearchResult


def kf(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run `kf ARGV…` in this process; its exit status, standard output and standard error."""
    capsys.readouterr()
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("every", ["0s", "abc", "-1h", "inf", "1.5h", "30s", "400d", ""])
def test_a_bad_interval_exits_2_naming_the_option_and_the_allowed_form(
    capsys: pytest.CaptureFixture[str], every: str
) -> None:
    status, _, err = kf(capsys, "schedule", "create", "softmax", "--every", every)
    assert status == 2
    assert "argument --every" in err and INTERVAL_FORM in err, err


def test_a_schedule_cannot_pin_its_runs_to_one_earlier_search(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = kf(capsys, "schedule", "create", "softmax", "--every", "24h", "--spec", '{"resume_from": "x"}')
    assert status == 2 and "resume_from" in err and "--cold" in err
    status, _, err = kf(capsys, "schedule", "create", "softmax", "--every", "24h", "--resume-from", "x")
    assert status == 2 and "--resume-from" in err


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float = 60) -> Any:
    """``check()``'s first truthy answer, asked every half second (Temporal's list views lag a little)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        answer = await check()
        if answer:
            return answer
        assert asyncio.get_running_loop().time() < deadline, "no answer in time"
        await asyncio.sleep(0.5)


@pytest.mark.slow
async def test_a_schedule_runs_a_search_warm_from_the_last_incumbent(
    temporal_env: WorkflowEnvironment,
    client: Client,
    store: EventStore,
    prefix: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KF_TEMPORAL_ADDRESS", client.service_client.config.target_host)
    monkeypatch.setenv("KF_TEMPORAL_UI_URL", "http://127.0.0.1:8233")
    schedule_id = f"schedule-test-{prefix}"

    async def cli(*argv: str) -> tuple[int, str, str]:
        return await asyncio.to_thread(kf, capsys, *argv)

    # One candidate each: generation 0 alone (the seed kernel, or for the warm run the earlier incumbent).
    small = {"problem": "softmax", "generations": 1, "budget": {"max_candidates": 1}, **QUICK}
    async with running_worker(client, store, prefix):
        earlier = await (await start(client, prefix, small)).result()
        assert earlier.incumbent is not None

        status, out, err = await cli(
            "schedule", "create", "softmax", "--every", "24h", "--generations", "1", "--max-candidates", "1",
            "--spec", json.dumps(QUICK), "--prefix", prefix, "--id", schedule_id, "--json",
        )  # fmt: skip
        assert status == 0, err
        created = json.loads(out)
        assert created["schedule_id"] == schedule_id and created["every"] == "1d" and not created["paused"]
        assert created["next_run"] and created["runs"] == 0
        assert "every 1d" in created["summary"] and "warm from the newest incumbent" in created["summary"]

        status, _, err = await cli("schedule", "trigger", schedule_id)
        assert status == 0, err
        row = await eventually(lambda: _with_run(client, schedule_id))
        handle = client.get_workflow_handle(row.last_search_id, result_type=SearchResult)
        result = await handle.result()
        description = await handle.describe()

    assert result.status == "budget_exhausted" and result.candidates_done == 1
    # Warm: generation 0 re-timed the earlier search's incumbent instead of the seed kernel.
    history = await load_search_history(store, handle.id)
    assert history.started is not None and history.started.payload["resumed_from"] == earlier.search_id
    assert next(iter(history.candidates)) == earlier.incumbent.candidate_id
    assert "every 1d" in (await description.static_summary() or "")

    listed = await eventually(lambda: _listed(cli, schedule_id))
    assert listed["runs"] == 1 and listed["last_search_id"] == handle.id and listed["problem"] == "softmax"

    status, out, _ = await cli("schedule", "pause", schedule_id, "--note", "compiler upgrade", "--json")
    assert status == 0 and json.loads(out)["paused"] and json.loads(out)["note"] == "compiler upgrade"
    status, out, _ = await cli("schedule", "unpause", schedule_id, "--json")
    assert status == 0 and not json.loads(out)["paused"]
    status, out, _ = await cli("schedule", "delete", schedule_id)
    assert status == 0 and schedule_id in out
    status, _, err = await cli("schedule", "pause", schedule_id)
    assert status == 2 and f"no schedule {schedule_id!r}" in err


async def _with_run(client: Client, schedule_id: str) -> Any:
    row = await describe_schedule(client, schedule_id)
    return row if row.last_search_id else None


async def _listed(cli: Callable[..., Awaitable[tuple[int, str, str]]], schedule_id: str) -> dict[str, Any] | None:
    status, out, err = await cli("schedule", "list", "--json")
    assert status == 0, err
    return next((row for row in json.loads(out) if row["schedule_id"] == schedule_id), None)
