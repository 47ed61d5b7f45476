"""bench/proposal_cost.py: it times real proposals of the asked size on a problem's whole space, and refuses a name
that is not a built-in problem before measuring anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.problems import load_problem
from engine.proposers.random_template import template_space

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_each_problem_gets_its_space_size_and_its_proposals_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import proposal_cost

    row = proposal_cost.measure("kda", 3, 2)
    assert row["space_settings"] == len(template_space(load_problem("kda")))
    low, high = row["propose_ms_spread"]
    assert 0 < low <= row["propose_ms"] <= high
    # Asked for more than the space holds, a proposal offers every setting once.
    assert proposal_cost.proposal_ms("kda", 1, row["space_settings"] + 10) > 0


@pytest.mark.parametrize("proposer", ["search", "gp"])
def test_a_proposal_with_evidence_offers_only_what_was_not_measured(
    monkeypatch: pytest.MonkeyPatch, proposer: str
) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import proposal_cost

    problem = load_problem("kda")
    lessons = proposal_cost.evidence(problem, 90)
    assert len(lessons["settings"]) == 90 and {s["problem"] for s in lessons["settings"]} == {"kda"}
    # 96 settings, 90 measured: a proposal of 10 can offer the other 6 only (proposal_ms checks the count).
    assert proposal_cost.proposal_ms("kda", 2, 10, proposer, 90) > 0


def test_an_unknown_problem_is_refused_before_anything_is_measured(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import proposal_cost

    with pytest.raises(SystemExit) as stopped:
        proposal_cost.main(["--problems", "kda,no_such_problem"])
    assert stopped.value.code == 2
    assert "no built-in CPU problem named no_such_problem; choose from" in capsys.readouterr().err
