"""Whether a failed compile was the machine's doing: a full scratch disk or a broken toolchain.

A compiler that cannot write its output, or cannot run its own parts (cc1, the assembler, the linker), fails
on every source. Recorded as the candidate's ``compile_error`` -- and cached, so reused -- such a failure would
blame the kernel for the machine (DESIGN.md: an outcome is the kernel's only when the kernel caused it). So a
compile that fails is checked against the machine before it becomes a verdict:

- the scratch filesystem the compile ran on has at least :data:`MIN_SCRATCH_FREE` bytes free (a compiler that
  hits a full disk exits with "No space left on device", or with no message at all when even its log could not
  be written);
- a known-good source (:data:`CANARY_SOURCE`, the default flags) compiles and links in a fresh sandbox.

Either failing makes the outcome a ``harness_error``: never cached, never a verdict, retried by the step. The
compiler's own words are not trusted for this: a candidate controls what the compiler prints (``#line`` names
the file in its diagnostics, the assembler's ``.print`` writes any line), so text alone could pass a kernel's
error off as the machine's. A candidate cannot reach the canary's sandbox, and the per-file size limit keeps its
own output from filling a disk that had room for a compile (``file_size_bytes`` of ``COMPILE_LIMITS``).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from engine.harness.sandbox import Sandbox, SandboxLimits

MIN_SCRATCH_FREE = 64 << 20
"""Free bytes below which the scratch filesystem counts as full: a compile's files take well under a MiB, but a
disk this close to full fails the next write of any size."""

CANARY_SOURCE = "int kf_canary(int x) { return x + 1; }\n"
"""Compiles on any working C toolchain: what it takes to build it is what every candidate needs."""


def scratch_shortage(folder: Path) -> str | None:
    """Why the filesystem holding ``folder`` is too full to compile on, or None when it has room."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError as error:
        return f"the scratch folder {folder} cannot be read ({error})"
    if free >= MIN_SCRATCH_FREE:
        return None
    return (
        f"the scratch disk is full: {free} bytes free where {folder.parent} lives (at least "
        f"{MIN_SCRATCH_FREE >> 20} MiB needed); free space there and the step is retried"
    )


def canary_failure(command: Callable[[str, str], list[str]], limits: SandboxLimits) -> str | None:
    """Why the toolchain cannot build :data:`CANARY_SOURCE` in a fresh sandbox, or None when it builds;
    ``command(source, output)`` is the compiler's command line for those file names."""
    with Sandbox(unprivileged=True, pin=False) as sandbox:
        shortage = scratch_shortage(sandbox.dir)
        if shortage is not None:
            return shortage
        try:
            (sandbox.dir / "canary.c").write_text(CANARY_SOURCE)
        except OSError as error:
            return f"the compiler's scratch folder cannot be written ({error})"
        outcome = sandbox.run(command("canary.c", "canary.so"), limits)
    if outcome.exit_code == 0 and outcome.killed is None and outcome.setup_error is None:
        return None
    said = next((line for line in reversed(outcome.output_tail.splitlines()) if line.strip()), "")
    how = (
        outcome.setup_error
        or outcome.killed
        or (f"signal {outcome.signal}" if outcome.signal is not None else f"exit status {outcome.exit_code}")
    )
    return (
        f"the compiler fails on a known-good source too ({how}{': ' + said.strip() if said else ''}): the "
        "toolchain or the machine is broken, not the candidate; check the compiler (CC) and the worker's machine"
    )
