"""Outages are waited out, never verdicts: a search through a dozen worker kills, sandboxed harness processes
killed from outside, a Temporal restart while a proposal is in flight and half a minute without Postgres
completes soon after the last fault, with one outcome per step, no false verdict and a clean audit; the user
following it with `kf search show --wait` is told Temporal was unreachable, not that the search failed.

The scenario and its figures are tests/chaos_fixtures.py (bench/chaos.py prints the same figures, with a minute
without Postgres). Half a minute is enough here: the steps' back-off (engine/outages.py) reaches its longest
wait after 25 s, so the outage is waited out at the longest wait as a minute's would be.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from chaos_fixtures import ChaosConfig, run_chaos

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
async def test_a_search_comes_through_chaos_with_an_honest_record() -> None:
    folder = Path(tempfile.mkdtemp(prefix="kf-test-chaos-"))  # not tmp_path: Postgres runs as another user
    # Two generations after the seed's: one for the Temporal restart and the kill storm, one for the outage.
    report = await run_chaos(ChaosConfig(generations=2, postgres_outage_s=30.0), folder)
    figures = report.figures()
    where = f"(servers' and workers' logs in {folder})"

    assert report.result is not None, f"the search did not finish within minutes of the last fault {where}"
    assert report.result.status == "completed", figures
    kinds = figures["faults"]
    assert kinds.get("worker_sigkill", 0) >= 10, kinds
    assert kinds.get("temporal_restart") == 1 and kinds.get("postgres_outage") == 1, kinds
    assert report.duplicate_outcomes == 0, report.problems
    assert report.events_lost == 0, report.problems
    assert report.false_verdicts == 0, report.problems
    assert report.audit_clean, figures
    # The follower outlived the restart and printed the result.
    assert report.follower_exit == 0, report.follower_stderr[-2000:]
    assert "failed" not in report.follower_stderr, report.follower_stderr[-2000:]
    assert "Temporal unreachable, retrying" in report.follower_stderr, report.follower_stderr[-2000:]
