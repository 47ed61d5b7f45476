"""The judge: everything that decides whether a candidate kernel is correct and how fast it is.

Where to look:

- how a candidate is built: ``cpu.py`` (the CPU backend: compiler, flags, artifact cache);
- where it runs: ``sandbox.py`` (limits, namespaces, privileges) and ``child.py`` (the sandboxed program);
- whether it is correct: ``validation.py``;
- how it is timed: ``benchmarking.py``, with the statistics in ``stats.py``;
- what the outcomes mean: ``verdicts.py``; the whole chain from Python: ``evaluation.py``.

Kept free of imports: the sandboxed child imports this package with the standard library only.
"""
