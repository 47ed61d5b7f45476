"""Which definition of a problem judged a candidate: the hash of everything in its folder.

Evidence records it (a verdict is reused only under the definition that gave it), a user's problem.py runs in a
host process kept per fingerprint (engine/problem_host.py), and caches of a template space are keyed on it. So
every file problem.py or a kernel may read counts: a data file a reference loads (``scale.npy``), a helper module
in a subfolder, a header a template includes whatever its suffix (``.cuh``, ``.inc``). Leaving one out let an
edited definition reuse the old one's verdicts and keep judging with the old module until the process restarted.

What is left out is what no definition is: byte code, hidden folders (tools' state and caches) and the state folder
of `kf` itself (SKIPPED_DIRECTORIES, SKIPPED_SUFFIXES). A symbolic link to a folder counts as its target's path,
not its files (a link to a large tree would be walked on every call); a link to a file counts by the file's
content. Only the top-level definition files are read on every call; the others' hashes are kept once they have
settled (SETTLED_S).

The digest of a folder whose files are all top-level DEFINITION_SUFFIXES files is the one earlier versions
computed, so the evidence and the recorded landscapes of such folders (every built-in problem) keep their key.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

from engine.config import kf_home

DEFINITION_SUFFIXES = (".py", ".c", ".h", ".cu", ".json")
"""Top-level files hashed by name and content in the digest's first part (the whole digest of earlier versions)."""

SKIPPED_DIRECTORIES = frozenset({"__pycache__"})
"""Folders that hold no definition besides hidden ones (a name starting with a dot: .git, .venv, the tools'
caches, and ``.kf``, the state folder `kf` keeps in the working directory by default, whose database files
change all the time: a search started from inside its problem folder would otherwise see a new definition at
every step). The state folder (KF_HOME) is left out under any name."""

SKIPPED_SUFFIXES = (".pyc", ".pyo", ".swp", ".swo", "~")
"""Byte code (Python writes it as it imports) and editors' swap and backup files (vim rewrites its swap file every
few seconds while problem.py is open): they change without the definition changing."""

SETTLED_S = 2.0
"""A file last changed at least this long before it was read has its content hash kept, per (device, inode, size,
modification and change times): the fingerprint is taken several times per search step, and a folder of many files
or a large data set is then read once per version. A file changed more recently is read every time, because a
file system's timestamps move in steps of milliseconds and an edit that keeps the size within one step would keep
the key (git's "racily clean" files): any later edit of a settled file gives it a new change time."""

REMEMBERED_FILES = 4096
"""Files whose content hash is kept (the least recently used is forgotten first)."""

_remembered: OrderedDict[tuple[str, int, int, int, int, int], bytes] = OrderedDict()
_lock = threading.Lock()


def folder_fingerprint(folder: Path) -> str:
    """Hash of a problem folder's files: its top-level definition files, then every other file under it."""
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.suffix in DEFINITION_SUFFIXES:
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    # A distinct marker per entry: no arrangement of other files can spell the first part's bytes.
    for relative, entry in _other_entries(folder):
        digest.update(b"\x01" + relative.encode(errors="surrogateescape") + b"\0" + entry + b"\0")
    return digest.hexdigest()


def _other_entries(folder: Path) -> list[tuple[str, bytes]]:
    """(path relative to ``folder``, what identifies its content) of every file and folder link below ``folder``
    that the first part of the digest does not cover, in path order."""
    entries: list[tuple[str, bytes]] = []
    state = kf_home()
    for root, directories, files in os.walk(folder):
        base = Path(root)
        directories[:] = sorted(
            d
            for d in directories
            if not d.startswith(".") and d not in SKIPPED_DIRECTORIES and (base / d).resolve() != state
        )
        for name in directories:
            if (base / name).is_symlink():
                relative = (base / name).relative_to(folder).as_posix()
                entries.append((relative, b"link " + os.fsencode(os.readlink(base / name))))
        for name in files:
            path = base / name
            first_part = base == folder and path.suffix in DEFINITION_SUFFIXES and path.is_file()
            if name.endswith(SKIPPED_SUFFIXES) or first_part:
                continue
            if not path.is_file():  # a FIFO, a socket, a device, a dangling link: nothing to read (and no blocking)
                what = b"link " + os.fsencode(os.readlink(path)) if path.is_symlink() else b"not a file"
                entries.append((path.relative_to(folder).as_posix(), what))
                continue
            entries.append((path.relative_to(folder).as_posix(), _content_hash(path)))
    return sorted(entries)


def _content_hash(path: Path) -> bytes:
    """SHA-256 of a file's content (kept once the file has settled, see SETTLED_S); a file this process may not
    read counts as unreadable, so the folder still has a fingerprint and a later read that works changes it."""
    try:
        status = path.stat()
        key = (str(path), status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)
        with _lock:
            if key in _remembered:
                _remembered.move_to_end(key)
                return _remembered[key]
        hasher = hashlib.sha256()
        with path.open("rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                hasher.update(block)
        content = hasher.digest()
    except OSError:
        return b"unreadable"
    if time.time() - status.st_ctime >= SETTLED_S:
        with _lock:
            _remembered[key] = content
            while len(_remembered) > REMEMBERED_FILES:
                _remembered.popitem(last=False)
    return content
