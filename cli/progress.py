"""Live progress of a long command: one line on stderr saying the current step and how long it has run.

On a terminal the line is rewritten in place and its clock ticks; anywhere else (a pipe, a log file, CI) each
step is one plain line, so logs stay readable. It goes to stderr, so a command's output (its JSON) on stdout
is untouched by it.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TextIO

TICK_S = 1.0
"""How often the clock of the line on a terminal is redrawn."""


class StepProgress:
    """Shows ``what: step (N s)`` for the step under way; a context manager that clears its line on exit."""

    def __init__(self, what: str, stream: TextIO | None = None) -> None:
        self.what = what
        self.stream = stream if stream is not None else sys.stderr
        self.live = _is_terminal(self.stream)
        self._step = ""
        self._began = time.monotonic()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._ticker: threading.Thread | None = None

    def step(self, text: str) -> None:
        """The command moved on to the step ``text`` (e.g. "validating")."""
        with self._lock:
            self._step, self._began = text, time.monotonic()
            if self.live:
                self._draw()
            else:
                print(f"{self.what}: {text}", file=self.stream, flush=True)
        if self.live and self._ticker is None:
            # A daemon thread: a command that ends abruptly (SIGTERM) must not wait for the clock.
            self._ticker = threading.Thread(target=self._tick, name="kf-progress", daemon=True)
            self._ticker.start()

    def close(self) -> None:
        """Stop the clock and clear the line, so what the command prints next starts on a clean line."""
        self._done.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2 * TICK_S)
        with self._lock:
            if self.live and self._step:
                print("\r\033[K", end="", file=self.stream, flush=True)
            self._step = ""

    def __enter__(self) -> StepProgress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def _tick(self) -> None:
        while not self._done.wait(TICK_S):
            with self._lock:
                if self._step:
                    self._draw()

    def _draw(self) -> None:
        seconds = time.monotonic() - self._began
        print(f"\r\033[K{self.what}: {self._step}… {seconds:.0f} s", end="", file=self.stream, flush=True)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or fake stream
        return False
