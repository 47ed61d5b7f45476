"""The file a command's ``--output`` names: its place checked before any work, so that a place that cannot hold
the file is bad input (exit status 2) found before a server is contacted, and a write that fails afterwards (a
full disk, a file system gone read-only) is the machine's (exit status 3).

Asking ``os.access`` is not enough: root may "write" to ``/proc`` and ``/sys``, whose folders refuse every new
file, and a file system mounted read-only passes it too. So a file is created in the folder and removed.

A name that is already something other than a regular file (``/dev/stdout``, a named pipe, a terminal) is
written into as it stands: replacing it with a file (as a command that writes its file whole and renames it into
place would) would remove a device node or a pipe a reader waits on. A regular file is written whole
(``written_whole``): next to its place, then renamed into it, so a write cut short (a full disk, a size limit, a
kill) leaves the earlier file as it was and no file that looks finished.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from engine.errors import UserError

MACHINE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ENOMEM, errno.EMFILE, errno.ENFILE})
"""Failures of the machine, not of the place: the same place takes the file once they are fixed."""


def is_stream(path: Path) -> bool:
    """True when ``path`` already exists as something other than a regular file (a device, a pipe, a socket)."""
    return path.exists() and not path.is_file()


def checked_output(option: str, value: str, example: str) -> Path:
    """``value`` as a path for ``option``, refused (UserError) when its place cannot hold a new file; ``example``
    is a file name to suggest when ``value`` is a folder. An OSError of the machine's (MACHINE_ERRNOS) passes."""
    path = Path(value)
    if path.is_dir():
        raise UserError(f"{option} {value} is a directory; name a file in it, e.g. {path / example}")
    if path.parent.exists() and not path.parent.is_dir():
        raise UserError(f"{option} {value}: {path.parent} is not a folder; name a file in a folder")
    if not path.parent.is_dir():
        raise UserError(f"{option} {value}: the folder {path.parent} does not exist; create it first")
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"{option} {value} exists and this user may not write it; choose another place")
    if is_stream(path):
        return path
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".kf-probe-"):
            pass
    except OSError as error:
        if error.errno in MACHINE_ERRNOS:
            raise
        raise UserError(
            f"{option} {value}: the folder {path.parent} cannot hold a new file ({error.strerror or error}); "
            "choose another place"
        ) from None
    return path


@contextlib.contextmanager
def written_whole(path: Path) -> Iterator[BinaryIO]:
    """A file to write that becomes ``path`` only when the block ends without an error; until then ``path`` keeps
    what it held. Written into the same folder (a rename across file systems would copy) and removed on failure.
    """
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}-", suffix=".partial", delete=False) as f:
        partial = Path(f.name)
    try:
        with partial.open("wb") as file:
            yield file
        # The temporary file was created private (0600); the finished one gets the mode any new file would.
        umask = os.umask(0)
        os.umask(umask)
        partial.chmod(0o666 & ~umask)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
