"""The built-in problem suite: one folder per problem (see docs/problems.md for the format).

Problem folders import numpy only; the harness in ``engine.problems`` loads them by path.
"""

from pathlib import Path

SUITE_DIR = Path(__file__).resolve().parent
