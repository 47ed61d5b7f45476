"""Where Kernel Factory keeps its state and which servers it talks to.

Everything is read from the environment at call time, so tests can point a process at their own servers:

- ``KF_HOME``: the state folder of the embedded default (default ``.kf`` in the working directory).
- ``KF_DATABASE_URL``: a Postgres URL; when set, the embedded Postgres is not used. It names the role the
  application connects as, which may only append to and read the event log (``kf_app``).
- ``KF_DATABASE_OWNER_URL``: the same database as the role that owns the log and runs the migrations
  (``kf_owner``); needed only by ``kf up`` and ``kf db``. Unset, the migrations use ``KF_DATABASE_URL``.
- ``KF_TEMPORAL_ADDRESS``: ``host:port`` of a Temporal frontend; when set, no embedded dev server is used.
- ``KF_TEMPORAL_NAMESPACE``: the Temporal namespace (default ``default``).
- ``KF_MACHINE_DIR``: where this machine's measured figures (bandwidth, peak, noise floor) are kept
  (default ``machine/`` in the cache folder); a test session points every cache at one, so it measures once.
- ``KF_METRICS_PORT``: the port ``kf worker`` serves Prometheus metrics on (default: none; ``--metrics-port``).
- ``KF_OUTAGE_PATIENCE_S``: how long a step (and the CLI following a search) waits out an unreachable
  Postgres or Temporal before it fails as an infrastructure failure (default 600: time for an operator to
  notice and restart a server).
- ``KF_PROBLEM_CALL_S``: how long one call of a problem folder's data functions (``make_inputs``,
  ``reference``, ``baseline``, ``tolerance_for``) may run before it counts as hung and fails as the problem's
  error (default 300).
- ``KF_PROBLEM_REPLY_MB``: the largest reply (pickled arrays) a problem folder's process may send the judge, in
  MB (default: a quarter of the memory this machine has available when the reply comes).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import psutil

from engine.errors import ConfigurationError

DEFAULT_TEMPORAL_PORT = 7233
DEFAULT_TEMPORAL_UI_PORT = 8233
DEFAULT_OUTAGE_PATIENCE_S = 600.0
DEFAULT_PROBLEM_CALL_S = 300.0


def kf_home() -> Path:
    """The state folder: embedded databases, pid files, logs and the artifact cache live under it."""
    return Path(os.environ.get("KF_HOME", ".kf")).resolve()


def database_url_override() -> str | None:
    """The Postgres URL the user asked for, or None to use the embedded server."""
    return os.environ.get("KF_DATABASE_URL") or None


def database_owner_url_override() -> str | None:
    """The Postgres URL of the log's owner role the user asked for, or None (see ``KF_DATABASE_OWNER_URL``)."""
    return os.environ.get("KF_DATABASE_OWNER_URL") or None


def temporal_address_override() -> str | None:
    """The Temporal frontend the user asked for, or None to use the embedded dev server."""
    return os.environ.get("KF_TEMPORAL_ADDRESS") or None


def temporal_namespace() -> str:
    """The Temporal namespace searches run in."""
    return os.environ.get("KF_TEMPORAL_NAMESPACE", "default")


def cache_dir() -> Path:
    """Content-addressed build artifacts (compiled kernels) live here."""
    return kf_home() / "cache"


def machine_dir(cache: Path | None = None) -> Path:
    """Where this machine's measured figures live: ``KF_MACHINE_DIR``, else ``machine/`` in the cache folder."""
    override = os.environ.get("KF_MACHINE_DIR")
    if override:
        return Path(override).resolve()
    return (cache or cache_dir()) / "machine"


def metrics_port() -> int | None:
    """The port `kf worker` serves Prometheus metrics on (``KF_METRICS_PORT``), or None for no metrics."""
    raw = os.environ.get("KF_METRICS_PORT", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise ConfigurationError(f"KF_METRICS_PORT={raw!r} is not a port from 1 to 65535; unset it for no metrics")
    return int(raw)


def outage_patience_s() -> float:
    """Seconds an unreachable Postgres or Temporal is waited out before the step fails (``KF_OUTAGE_PATIENCE_S``)."""
    return _seconds("KF_OUTAGE_PATIENCE_S", DEFAULT_OUTAGE_PATIENCE_S, zero_ok=True, example="900")


def problem_call_s() -> float:
    """Seconds one call of a problem.py data function may run before it counts as hung (``KF_PROBLEM_CALL_S``)."""
    return _seconds("KF_PROBLEM_CALL_S", DEFAULT_PROBLEM_CALL_S, zero_ok=False, example="600")


def problem_reply_bytes() -> int:
    """The largest reply a problem folder's process may send the judge, in bytes (``KF_PROBLEM_REPLY_MB``; by
    default a quarter of the memory available now: a reply bigger than that would leave the judge too little
    for the reference and the kernel's outputs)."""
    raw = os.environ.get("KF_PROBLEM_REPLY_MB", "").strip()
    if not raw:
        return int(psutil.virtual_memory().available // 4)
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (0 < value < math.inf):
        raise ConfigurationError(
            f"KF_PROBLEM_REPLY_MB={raw!r} is not a positive number of MB; unset it for a quarter of the available "
            "memory or set e.g. KF_PROBLEM_REPLY_MB=8192"
        )
    return int(value * 1e6)


def _seconds(name: str, default: float, *, zero_ok: bool, example: str) -> float:
    """The environment variable ``name`` as a finite number of seconds (>= 0 with ``zero_ok``, else > 0);
    ``default`` when unset; anything else is a ConfigurationError naming the variable and the fix."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not ((value >= 0 if zero_ok else value > 0) and value < math.inf):  # NaN fails both
        raise ConfigurationError(
            f"{name}={raw!r} is not a number of seconds {'>=' if zero_ok else '>'} 0; unset it for the default "
            f"({default:g}) or set e.g. {name}={example}"
        )
    return value
