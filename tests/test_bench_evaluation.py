"""bench/evaluation.py's command line: its problem list reads as the other benchmarks' does, and a name that is
not a built-in problem is refused before anything is measured."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize(
    "given",
    [["softmax,no_such_problem"], ["softmax", "no_such_problem"], ["softmax,", "no_such_problem"]],
)
def test_problems_are_read_space_or_comma_separated_and_unknown_ones_refused(
    given: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import evaluation

    with pytest.raises(SystemExit) as stopped:
        evaluation.main(["--roofline-only", "--problems", *given])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    # Only the unknown name is named: "softmax" was read as a problem of its own, not as part of one long name.
    assert "no built-in CPU problem named no_such_problem;" in err
    assert "choose from add_rmsnorm, bias_gelu" in err


def test_a_problem_list_of_commas_alone_is_refused_rather_than_read_as_every_problem(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import evaluation

    with pytest.raises(SystemExit) as stopped:
        evaluation.main(["--roofline-only", "--problems", ",", ","])
    assert stopped.value.code == 2
    assert "--problems: no problem named; choose from add_rmsnorm" in capsys.readouterr().err
