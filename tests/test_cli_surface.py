"""The `kf` command line as a user meets it: its version, its help, and every example the docs show.

- `kf --version` names the installed distribution's version.
- Every option of every command has help, and the help says its default (argparse's own defaults, appended by
  cli/parser.py, or the help's own words for an option whose default is "not given"), and `--help` renders it
  (a stray ``%`` would break that, or print ``%%``).
- Every `kf …` line in a code block of README.md and docs/ parses (`cli.build_parser().parse_args`), and every
  `kf …` written inline names commands and options that exist: an example cannot drift from the parser.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from cli import COMMAND_MODULES, MODULE_OF, build_parser, exit_status, main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("kf",)
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every parser under ``parser`` (itself included), with the words that reach it."""
    yield " ".join(path), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


COMMANDS = list(commands(build_parser()))


def test_each_command_is_found_in_its_own_module() -> None:
    # `kf CMD` imports CMD's module alone (cli.MODULE_OF); the map must name every command, each in its module.
    registered: dict[str, str] = {}
    for module in COMMAND_MODULES:
        scratch = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).register(scratch)
        registered |= dict.fromkeys(scratch.choices, module)
    assert MODULE_OF == registered


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"kf {version('kernel-factory')}"


def test_help_lists_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for status, meaning in exit_status.STATUSES:
        assert f"{status} {' '.join(meaning.split())}" in text


@pytest.mark.parametrize(("name", "parser"), COMMANDS, ids=[name for name, _ in COMMANDS])
def test_every_option_has_help_that_says_its_default(name: str, parser: argparse.ArgumentParser) -> None:
    undocumented = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction):
            continue
        label = "/".join(action.option_strings) or action.dest
        if not action.help:
            undocumented.append(f"{label}: no help")
        elif action.option_strings and action.nargs != 0 and not action.required:
            # A value option: its default is said, by the formatter (a real default) or by the help's words.
            shown = parser.formatter_class(prog="kf")._get_help_string(action) or ""
            if "default" not in shown.lower():
                undocumented.append(f"{label}: help does not say its default ({action.help!r})")
    assert undocumented == [], f"{name}: {undocumented}"
    rendered = parser.format_help()  # raises on a help string whose % is not %%
    assert "%%" not in rendered


def test_evaluate_help_says_95_percent_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", "--help"]) == 0
    text = capsys.readouterr().out
    assert "95% confidence" in " ".join(text.split()) and "%%" not in text


def test_a_closed_set_of_values_is_a_choice() -> None:
    proposer = next(a for a in dict(COMMANDS)["kf search start"]._actions if "--proposer" in a.option_strings)
    assert proposer.choices and "search" in proposer.choices


# -- the docs' examples --------------------------------------------------------------------------------------

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
_INLINE = re.compile(r"`((?:[A-Z_]+=\S+ )*kf [^`]*)`")
_ALTERNATIVES = re.compile(r"^[a-z-]+(\|[a-z-]+)+$")


def _argv(line: str) -> list[list[str]]:
    """The kf argument lists a shell line runs (one per `a|b|c` alternative), without env assignments, `&`
    and comments; none when the line does not run kf."""
    words = shlex.split(line, comments=True)
    while words and re.match(r"^[A-Z_]+=", words[0]):
        words.pop(0)
    if not words or words[0] != "kf":
        return []
    words = words[1:]
    # The shell's part of the line (a redirection, a pipe, `&`) is not kf's; `[--json]` is usage notation.
    cut = next((i for i, w in enumerate(words) if w in (">", ">>", "<", "|", "&", "&&", ";", "2>")), len(words))
    words = [w[1:-1] if w.startswith("[") and w.endswith("]") else w for w in words[:cut]]
    choice = next((i for i, w in enumerate(words) if _ALTERNATIVES.match(w)), None)
    if choice is None:
        return [words]
    return [[*words[:choice], alternative, *words[choice + 1 :]] for alternative in words[choice].split("|")]


def _examples() -> Iterator[tuple[str, str, bool]]:
    """(where, the kf text, whether it is a whole command line) for each kf example of the docs."""
    for doc in DOCS:
        text = doc.read_text()
        fenced = [(m.start(1), m.group(1)) for m in _FENCE.finditer(text)]
        for start, block in fenced:
            for offset, line in enumerate(block.splitlines()):
                if line.strip().startswith(("kf ", "KF_")) or re.match(r"^[A-Z_]+=\S+ kf ", line.strip()):
                    where = f"{doc.name}:{text.count(chr(10), 0, start) + offset + 1}"
                    yield where, line.strip(), True
        outside = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for match in _INLINE.finditer(outside):
            if "…" not in match.group(1):
                yield f"{doc.name}:{outside.count(chr(10), 0, match.start()) + 1}", match.group(1), False


EXAMPLES = list(_examples())


def test_the_docs_have_examples() -> None:
    assert sum(whole for _, _, whole in EXAMPLES) >= 20


@pytest.mark.parametrize(("where", "text", "whole"), EXAMPLES, ids=[f"{w} {t}" for w, t, _ in EXAMPLES])
def test_every_kf_example_in_the_docs_parses(where: str, text: str, whole: bool) -> None:
    for argv in _argv(text):
        if whole:
            try:
                build_parser().parse_args(argv)
            except SystemExit as refused:
                pytest.fail(f"{where}: `{text}` does not parse (exit {refused.code})")
        else:
            _check_names(where, text, argv)


def _check_names(where: str, text: str, argv: list[str]) -> None:
    """An inline mention (`kf search start --resume-latest`) may leave out required values, but every command and
    option it names must exist where it names it."""
    parser = build_parser()
    for word in argv:
        verbs = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if verbs is not None and word in verbs.choices:
            parser = verbs.choices[word]
        elif word.startswith("-"):
            option = word.split("=", 1)[0]
            assert option in parser._option_string_actions, f"{where}: `{text}`: {parser.prog} has no {option}"
        elif verbs is not None and not any(a.option_strings == [] and a is not verbs for a in parser._actions):
            pytest.fail(f"{where}: `{text}`: {parser.prog} has no command {word!r}")
