"""Embedded servers of other state folders: what `kf` says when it is run from another folder than `kf up` was.

The state folder is ``KF_HOME``, by default ``.kf`` in the folder a command runs in. `kf up` in one folder and
`kf status` or `kf search start` in another look at two state folders: the second finds no server of its own
and said only "not running; run `kf up`" -- and `kf up` there then failed on ports the first folder's servers
hold. Here the running servers of every state folder are found from their command lines (the dev server's
``--db-filename HOME/temporal/temporal.db``, Postgres's ``-D HOME/postgres``; a folder counts only where
`kf up` left its pid files, so a Postgres that merely shares the layout is not taken for ours), so that the
message can name the folder and the fix: ``KF_HOME=HOME``.

Nothing here writes: another folder's pid files are that folder's business (``running`` of each server
module adopts and cleans its own).
"""

from __future__ import annotations

from pathlib import Path

from engine.services import processes
from engine.services.paths import StatePaths

SHOWN = 3
"""Most other state folders a message names: one is the usual case, a list of dozens helps nobody."""


def state_folder_of(argv: list[str]) -> Path | None:
    """The state folder of an embedded server from its command line, or None when ``argv`` is not one of ours."""
    if "start-dev" in argv:
        store = processes.flag(argv, "--db-filename")
        if store is None:
            return None
        path = Path(store)
        if path.name != "temporal.db" or path.parent.name != "temporal":
            return None
        home = path.parent.parent
        return home if StatePaths(home).temporal_pidfile.exists() else None
    if argv and Path(argv[0]).name == "postgres":
        data = processes.flag(argv, "-D")
        if data is None or Path(data).name != "postgres":
            return None
        home = Path(data).parent
        return home if StatePaths(home).postgres_pidfile.exists() else None
    return None


def other_state_folders(paths: StatePaths) -> list[Path]:
    """State folders other than ``paths.home`` whose embedded Temporal or Postgres runs now, sorted."""
    found: set[Path] = set()
    for pid in processes.find(lambda argv: state_folder_of(argv) is not None):
        argv = processes.command_line(pid)
        home = state_folder_of(argv) if argv else None
        if home is not None and home.resolve() != paths.home:
            found.add(home.resolve())
    return sorted(found)


def fix_for(home: Path) -> str:
    """How to point `kf` at the servers of state folder ``home``."""
    fix = f"set KF_HOME={home}"
    if home.name == ".kf":
        # The default state folder: running kf where it was started is the other way to find it.
        fix += f" (or run kf in {home.parent})"
    return fix


def hint(paths: StatePaths) -> str:
    """What to say after "the servers of ``paths.home`` do not run" when other state folders' servers do, else ''.

    E.g. ``; the embedded servers of /srv/kf/.kf run: set KF_HOME=/srv/kf/.kf (or run kf in /srv/kf) to use
    them``."""
    others = other_state_folders(paths)
    if not others:
        return ""
    if len(others) == 1:
        return f"; the embedded servers of {others[0]} run: {fix_for(others[0])} to use them"
    named = " or ".join(f"KF_HOME={home}" for home in others[:SHOWN])
    more = f" (and {len(others) - SHOWN} more: `kf status` lists them)" if len(others) > SHOWN else ""
    return f"; embedded servers of other state folders run: set {named}{more} to use theirs"
