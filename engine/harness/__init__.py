"""The judge: everything that decides whether a candidate kernel is correct and how fast it is.

Where to look:

- which backend judges a target: ``backend.py`` (``cpu…`` targets: the modules below; ``cuda-sm…``: the
  ``cuda/`` package, built with NVRTC anywhere and judged on the GPU);
- how a candidate is built: ``cpu.py`` (the CPU backend: compiler, flags, artifact cache), ``includes.py``
  (which ``#include`` paths are refused) and ``screen.py`` (what a built library may contain and import);
- where it runs: ``sandbox.py`` (limits, namespaces, the supervisor's side) with ``init.py`` (the sandbox's
  first process), ``worker.py`` (the sandboxed program that loads and calls the candidate),
  ``privileges.py`` (the uid drop) and ``seccomp.py`` (the system calls it keeps);
- how the parent talks to it: ``protocol.py`` (the typed messages and shared constants) and ``driver.py``
  (one worker per contender, the parent's clock, the verdict of a worker that ended badly);
- whether it is correct: ``validation.py``;
- how it is timed: ``benchmarking.py``, with the statistics in ``stats.py``, the machine's bandwidth and
  peak in ``machine.py`` and its run-to-run noise floor in ``noise.py``;
- what the outcomes mean: ``verdicts.py``; the whole chain from Python: ``evaluation.py``.

Kept free of imports: the sandboxed worker imports modules of this package before it confines itself.
"""
