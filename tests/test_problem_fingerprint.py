"""A problem's fingerprint (engine/problem_fingerprint.py) covers every file its definition may read: an edit
anywhere in the folder is a new definition, judged by a freshly imported problem.py, while byte code and tool
caches change nothing."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from test_problem_check import folder_like

from engine import problem_fingerprint
from engine.problem_fingerprint import folder_fingerprint
from engine.problems import load_problem
from kernels import SUITE_DIR

# problem.py reads a data file of its own, in a subfolder, when it is imported: its roofline scales with it.
READS_DATA = {
    "problem_py": (
        "NAME = ",
        'from pathlib import Path\n_SCALE = int((Path(__file__).parent / "data" / "scale.txt").read_text())\n\nNAME = ',
    )
}


def scaled_roofline_folder(tmp_path: Path) -> Path:
    folder = folder_like("l2norm", tmp_path, **READS_DATA)
    text = (folder / "problem.py").read_text()
    (folder / "problem.py").write_text(text.replace('{"bytes": 8 * n,', '{"bytes": 8 * n * _SCALE,'))
    (folder / "data").mkdir()
    (folder / "data" / "scale.txt").write_text("1")
    return folder


def test_a_data_file_problem_py_reads_is_part_of_the_definition_that_judges(tmp_path: Path) -> None:
    folder = scaled_roofline_folder(tmp_path)
    first = load_problem(str(folder))
    shape = first.benchmark_shapes[0][0]
    before = first.fingerprint(), first.roofline(shape)["bytes"]
    (folder / "data" / "scale.txt").write_text("3")  # same size: only the content says it changed
    second = load_problem(str(folder))
    # A new definition: its evidence is not the old one's, and it is judged by problem.py imported anew.
    assert second.fingerprint() != before[0]
    assert second.roofline(shape)["bytes"] == 3 * before[1]


@pytest.mark.parametrize(
    "relative",
    ["tile.cuh", "kernel.inc", "lib/helpers.py", "lib/deeper/table.bin", ".hidden_constants", "template.c"],
)
def test_an_edit_of_any_file_in_the_folder_changes_its_fingerprint(tmp_path: Path, relative: str) -> None:
    folder = folder_like("l2norm", tmp_path)
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"first")
    written = folder_fingerprint(folder)
    path.write_bytes(b"other")
    edited = folder_fingerprint(folder)
    path.unlink()
    removed = folder_fingerprint(folder)
    assert len({written, edited, removed}) == 3


def test_byte_code_tool_caches_and_the_state_folder_are_not_the_definition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = folder_like("l2norm", tmp_path)
    fingerprint = folder_fingerprint(folder)
    # `kf up` run from inside the problem folder keeps its databases in .kf there (or where KF_HOME says): their
    # files change all the time, and the definition must not.
    monkeypatch.setenv("KF_HOME", str(folder / "state"))
    for relative in [
        "__pycache__/problem.cpython-311.pyc",
        ".git/index",
        "lib/__pycache__/x.pyc",
        "stray.pyc",
        ".problem.py.swp",
        "problem.py~",
        ".kf/postgres/base/1/1259",
        "state/temporal.db",
    ]:
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(os.urandom(64))
    assert folder_fingerprint(folder) == fingerprint


def test_a_fifo_or_a_link_to_a_folder_is_named_not_read(tmp_path: Path) -> None:
    folder = folder_like("l2norm", tmp_path)
    for target in ("a", "b"):
        (tmp_path / target).mkdir()
        (tmp_path / target / "same.txt").write_text("same")
    fingerprint = folder_fingerprint(folder)
    os.mkfifo(folder / "pipe")  # reading it would block the judge
    with_fifo = folder_fingerprint(folder)
    (folder / "elsewhere").symlink_to(tmp_path / "a")
    linked_a = folder_fingerprint(folder)
    (folder / "elsewhere").unlink()
    (folder / "elsewhere").symlink_to(tmp_path / "b")
    linked_b = folder_fingerprint(folder)
    (folder / "elsewhere").unlink()
    (folder / "elsewhere").symlink_to(tmp_path / "gone")  # dangling: named by its target too
    assert len({fingerprint, with_fifo, linked_a, linked_b, folder_fingerprint(folder)}) == 5


def test_a_kept_hash_is_dropped_when_its_file_changes_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = folder_like("l2norm", tmp_path)
    data = folder / "weights.bin"
    data.write_bytes(b"a" * 64)
    monkeypatch.setattr(problem_fingerprint, "SETTLED_S", 0.0)  # every file settled: its hash is kept
    first = folder_fingerprint(folder)
    assert folder_fingerprint(folder) == first
    written = data.stat()
    data.write_bytes(b"b" * 64)
    # Same size, and the modification time put back: only the change time says it was written.
    os.utime(data, ns=(written.st_atime_ns, written.st_mtime_ns))
    assert folder_fingerprint(folder) != first


def test_a_file_written_just_now_is_read_on_every_call_and_a_settled_one_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A just-written file's change time may not move on its next write (timestamps move in steps of
    # milliseconds on some file systems): its hash is kept only once it has settled.
    folder = folder_like("l2norm", tmp_path)
    (folder / "weights.bin").write_bytes(b"a" * 64)
    opened: list[str] = []
    real_open = Path.open

    def counted(self: Path, *args: Any, **kwargs: Any) -> Any:
        opened.append(self.name)
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", counted)
    for _ in range(3):
        folder_fingerprint(folder)
    assert opened.count("weights.bin") == 3
    opened.clear()
    monkeypatch.setattr(problem_fingerprint, "SETTLED_S", 0.0)
    for _ in range(3):
        folder_fingerprint(folder)
    assert opened.count("weights.bin") == 1


def test_a_folder_of_top_level_definition_files_keeps_the_fingerprint_its_evidence_was_recorded_under() -> None:
    # The digest of earlier versions, which hashed top-level .py .c .h .cu .json files only: every built-in
    # problem's recorded evidence and landscapes are keyed on it.
    for problem in sorted(SUITE_DIR.glob("*/problem.py")):
        digest = hashlib.sha256()
        for path in sorted(problem.parent.iterdir()):
            if path.is_file() and path.suffix in (".py", ".c", ".h", ".cu", ".json"):
                digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        assert folder_fingerprint(problem.parent) == digest.hexdigest(), problem.parent.name
