"""``kf problem check PATH``: run the generic checks on a problem folder (engine/problem_check.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from engine.errors import UserError
from engine.problem_check import check_problem
from engine.problems import load_problem, names_a_problem

MARKS = {"ok": "ok     ", "failed": "FAILED ", "skipped": "skipped"}


def register(subparsers: Any) -> None:
    problem = subparsers.add_parser("problem", help="check a problem folder before searching it")
    verbs = problem.add_subparsers(dest="verb", metavar="VERB", required=True)
    check = verbs.add_parser(
        "check",
        help="run the generic checks on a problem folder",
        description=(
            "Check a problem folder (or a built-in name): the baseline passes its tolerance, float16/bf16 answers "
            "and a skipped element fail it, the roofline counts bytes > 0 on every benchmark shape, the seed and "
            "a sample of template settings compile and validate, and one seed call takes 0.05-20 ms per benchmark "
            "shape. Exit 0 when every check passes, 1 when one fails, 2 when PATH is neither a built-in name nor a "
            "folder, 3 when the machine failed."
        ),
    )
    check.add_argument("path", metavar="PATH", help="the problem folder (or a built-in problem's name)")
    check.add_argument(
        "--no-timing", action="store_true", help="skip the seed timing check (it calibrates the machine once)"
    )
    check.add_argument("--json", action="store_true", help="print the checks as JSON")
    check.set_defaults(handler=run_check)


def run_check(args: argparse.Namespace) -> int:
    text = str(args.path)
    if Path(text).name == "problem.py" and Path(text).is_file():
        text = str(Path(text).parent)  # the folder's problem.py names the folder, as for `kf evaluate --problem`
    if ("/" in text or text.startswith(".")) and not Path(text).is_dir():
        raise UserError(
            f"PATH {text[:200]!r} is not a folder; pass a problem folder holding problem.py, or a built-in name"
        )
    if not text.strip() or (not names_a_problem(text) and not Path(text).expanduser().is_dir()):
        # Neither a built-in name nor a folder: nothing to check. The same error, and exit status 2, as
        # `kf evaluate --problem` gives. (A folder without a loadable problem.py is checked: `loads` fails.)
        load_problem(text)
    progress = (
        None if args.json or not sys.stderr.isatty() else (lambda step: print(f"checking {step} ...", file=sys.stderr))
    )
    result = check_problem(text, timing=not args.no_timing, progress=progress)
    if args.json:
        print(json.dumps(result.model_dump(mode="json") | {"passed": result.passed}))
    else:
        print(f"problem {result.problem or text}:")
        for check in result.checks:
            print(f"  {MARKS[check.status]} {check.name}: {check.message}")
        print("all checks passed" if result.passed else "some checks FAILED")
    return 0 if result.passed else 1
