"""What `kf audit`, `kf report` and `kf export` say of a search id the event log holds no event of.

The log alone cannot tell a mistyped id from a search that Temporal ran but that ended before its first step
recorded anything (its input refused, its problem unknown, its resume_from unknown): only Temporal can. So the
CLI asks it, and says which; "`kf search list` shows the search ids" would send the user to a list that holds
the very id they typed.
"""

from __future__ import annotations

import asyncio
import shlex

from engine.errors import NoEvents

ASK_TEMPORAL_S = 5.0
"""How long the CLI waits for Temporal's word on such an id. Temporal's client waits about 30 s for a frontend that
accepts connections but does not answer (a stopped process, an overloaded host); the log's answer is complete
without Temporal's, so the command says it after this long instead (`kf export` of such an id took 31 s before)."""


def explained(error: NoEvents) -> NoEvents:
    """``error``, reworded when Temporal knows the search: that it exists but recorded no events, and how it
    ended. Unchanged when Temporal holds no such search or cannot be asked: the log's answer stands."""
    try:
        how = asyncio.run(asyncio.wait_for(_how_it_ended(error.search_id), ASK_TEMPORAL_S))
    except Exception:  # Temporal not configured or not answering: nothing to add, and no reason to fail otherwise
        return error
    if how is None:
        return error
    search = error.search_id
    follow = f"`kf search show {shlex.quote(search)} --wait`"
    if how == "running":
        said = f"search {search!r} is running in Temporal but has recorded no events yet: its first step has not run "
        said += f"(is a worker running? `kf worker`); {follow} follows it"
    else:
        said = f"search {search!r} exists in Temporal but recorded no events: it ended before its first step ({how})"
        said += "" if ":" in how else f"; {follow} says why"  # a failure's reason is said already
    return NoEvents(search, said)


async def _how_it_ended(search_id: str) -> str | None:
    from activities.search_client import how_it_ended
    from activities.temporal_client import connect

    return await how_it_ended(await connect(), search_id)
