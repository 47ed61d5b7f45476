"""A tripwire on the worker's own interpreter, armed once a candidate's library is loaded.

A kernel shares its process with the worker's Python, and Python is easy to reach from C: walk libc's dynamic
symbols to ``dlsym``, then call ``PyRun_SimpleString``. Python run that way can rewrite the batch loop the
judge trusts (run half the calls it was asked for, say) or forge anything the worker reports. Once armed,
the worker's interpreter has nothing left to compile, import or open: serving the judge's commands raises
only the audit events listed in :data:`EXPECTED_EVENTS`. Any other event is the candidate's doing, and the
worker leaves at once with :data:`engine.harness.protocol.EXIT_INTERPRETER`, before the code it was asked to
run can act (the parent judges that ``forbidden``).

This is a tripwire, not a wall. It catches every route that runs Python source (``compile`` and ``exec``
fire first) and every import, open, ``ctypes`` lookup or frame inspection. It does not catch a kernel that
edits objects through the C API alone (``PyObject_SetAttrString`` raises no audit event), nor one that edits
the hook list in memory; keeping Python out of the candidate's process entirely is the way to close those.
"""

from __future__ import annotations

import os
import sys

from engine.harness.protocol import EXIT_INTERPRETER

EXPECTED_EVENTS = frozenset({"mmap.__new__"})
"""The audit events a confined artifact worker raises of its own accord after the load: preparing a benchmark
shape maps the pool file and places each output slot in a mapping of its own (worker._placed_empty)."""

MARK = "kf-tripwire:"
"""How the line the worker writes to stderr on tripping starts; the parent quotes the event from it."""


def arm() -> None:
    """Install the hook: from now on, an event outside :data:`EXPECTED_EVENTS` ends the process."""

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event in EXPECTED_EVENTS:
            return
        # os.write and os._exit raise no audit events of their own; nothing here may open or import.
        name = "".join(c for c in event[:80] if c.isalnum() or c in "._")
        os.write(2, f"{MARK} {name}\n".encode())
        os._exit(EXIT_INTERPRETER)

    sys.addaudithook(hook)


def tripped_event(output_tail: str) -> str | None:
    """The event a tripped worker named on stderr, or None (the candidate may write stderr too: this is
    detail for the message, never the evidence of the verdict, which is the exit status)."""
    for line in reversed(output_tail.splitlines()):
        if line.startswith(MARK):
            return line[len(MARK) :].strip()[:80] or None
    return None
