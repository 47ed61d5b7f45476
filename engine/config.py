"""Where Kernel Factory keeps its state and which servers it talks to.

Everything is read from the environment at call time (pydantic-settings, ``Settings``), so tests can point a
process at their own servers; a malformed variable is a ConfigurationError naming it and the fix:

- ``KF_HOME``: the state folder of the embedded default (default ``.kf`` in the working directory).
- ``KF_DATABASE_URL``: a Postgres URL; when set, the embedded Postgres is not used. It names the role the
  application connects as, which may only append to and read the event log (``kf_app``).
- ``KF_DATABASE_OWNER_URL``: the same database as the role that owns the log and runs the migrations
  (``kf_owner``); needed only by ``kf up`` and ``kf db``. Unset, the migrations use ``KF_DATABASE_URL``.
- ``KF_TEMPORAL_ADDRESS``: ``host:port`` of a Temporal frontend; when set, no embedded dev server is used.
- ``KF_TEMPORAL_NAMESPACE``: the Temporal namespace (default ``default``).
- ``KF_TEMPORAL_PORT``, ``KF_TEMPORAL_UI_PORT``: the ports a new embedded dev server listens on (default 7233, and
  the gRPC port + 1000 for the Web UI).
- ``KF_TEMPORAL_UI_URL``: where links to the Web UI point (default: the embedded dev server's).
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
- ``KF_CUDA_ISOLATION`` (``process-group`` or ``namespaces``) and ``KF_CUDA_INPUT_CACHE_BYTES`` (default 2 GiB):
  the CUDA judge's child and its kept inputs (engine/harness/cuda/).
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Any, Literal

import psutil
from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from engine.errors import ConfigurationError

DEFAULT_TEMPORAL_PORT = 7233
DEFAULT_TEMPORAL_UI_PORT = 8233
DEFAULT_OUTAGE_PATIENCE_S = 600.0
DEFAULT_PROBLEM_CALL_S = 300.0


class Settings(BaseSettings):
    """The ``KF_*`` environment variables (the module docstring says what each is for), validated together: a
    malformed one is a ConfigurationError naming the variable, its value and the fix, whichever setting a
    command asks for. An empty variable counts as unset."""

    model_config = SettingsConfigDict(env_prefix="KF_", env_ignore_empty=True, extra="ignore", frozen=True)

    home: Path = Path(".kf")
    """``KF_HOME``: the state folder, relative to the working directory unless absolute."""
    database_url: str | None = None
    """``KF_DATABASE_URL``: the event log's Postgres as the application's role; None for the embedded one."""
    database_owner_url: str | None = None
    """``KF_DATABASE_OWNER_URL``: the same database as the log's owner role; None for KF_DATABASE_URL's."""
    temporal_address: str | None = None
    """``KF_TEMPORAL_ADDRESS``: ``host:port`` of a Temporal frontend; None for the embedded dev server."""
    temporal_namespace: str = "default"
    """``KF_TEMPORAL_NAMESPACE``: the namespace searches run in."""
    temporal_retention_days: int = Field(default=30, ge=1, le=3650)
    """``KF_TEMPORAL_RETENTION_DAYS``: how long the embedded dev server keeps a closed search's history (its own
    default is a day); `kf up` sets it on the namespace. The event log keeps everything regardless."""
    temporal_port: int = DEFAULT_TEMPORAL_PORT
    """``KF_TEMPORAL_PORT``: the gRPC port a new embedded dev server listens on."""
    temporal_ui_port: int | None = None
    """``KF_TEMPORAL_UI_PORT``: its Web UI's port; None for the gRPC port + 1000, as the temporal CLI does."""
    temporal_ui_url: str | None = None
    """``KF_TEMPORAL_UI_URL``: the Web UI links point at this (a Temporal outside this machine's embedded one)."""
    machine_dir: Path | None = None
    """``KF_MACHINE_DIR``: where this machine's measured figures live; None for ``machine/`` in the cache."""
    metrics_port: int | None = None
    """``KF_METRICS_PORT``: the port `kf worker` serves Prometheus metrics on; None for no metrics."""
    outage_patience_s: float = DEFAULT_OUTAGE_PATIENCE_S
    """``KF_OUTAGE_PATIENCE_S``: seconds an unreachable Postgres or Temporal is waited out (0 allowed)."""
    problem_call_s: float = DEFAULT_PROBLEM_CALL_S
    """``KF_PROBLEM_CALL_S``: seconds one call of a problem folder's data functions may run."""
    problem_reply_mb: float | None = None
    """``KF_PROBLEM_REPLY_MB``: the largest reply of a problem folder's process, in MB; None for a quarter of
    the memory available when the reply comes."""
    cuda_isolation: Literal["process-group", "namespaces"] = "process-group"
    """``KF_CUDA_ISOLATION``: how the CUDA judge's child is confined (engine/harness/cuda/child.py says why a
    process group of its own by default)."""
    cuda_input_cache_bytes: int = Field(default=2 << 30, ge=0)
    """``KF_CUDA_INPUT_CACHE_BYTES``: how many bytes of GPU benchmark inputs a worker keeps for the next
    benchmark of the same shapes and seeds (engine/harness/cuda/inputs.py)."""

    @field_validator("temporal_port", "temporal_ui_port", mode="before")
    @classmethod
    def _tcp_port(cls, raw: Any, info: ValidationInfo) -> Any:
        if not isinstance(raw, str):
            return raw
        text = raw.strip()
        if not text.isdigit() or not 0 < int(text) < 65536:
            raise ValueError(f"{_variable(info)}={raw!r} is not a TCP port; set it to a number from 1 to 65535")
        return int(text)

    @field_validator("metrics_port", mode="before")
    @classmethod
    def _metrics_port(cls, raw: Any) -> Any:
        if not isinstance(raw, str):
            return raw
        text = raw.strip()
        if not text.isdigit() or not 1 <= int(text) <= 65535:
            raise ValueError(f"KF_METRICS_PORT={raw!r} is not a port from 1 to 65535; unset it for no metrics")
        return int(text)

    @field_validator("outage_patience_s", "problem_call_s", mode="before")
    @classmethod
    def _seconds(cls, raw: Any, info: ValidationInfo) -> Any:
        if not isinstance(raw, str):
            return raw
        zero_ok = info.field_name == "outage_patience_s"
        value = _number(raw)
        if not ((value >= 0 if zero_ok else value > 0) and value < math.inf):  # NaN fails both
            default = DEFAULT_OUTAGE_PATIENCE_S if zero_ok else DEFAULT_PROBLEM_CALL_S
            example = "900" if zero_ok else "600"
            raise ValueError(
                f"{_variable(info)}={raw!r} is not a number of seconds {'>=' if zero_ok else '>'} 0; unset it for "
                f"the default ({default:g}) or set e.g. {_variable(info)}={example}"
            )
        return value

    @field_validator("problem_reply_mb", mode="before")
    @classmethod
    def _megabytes(cls, raw: Any) -> Any:
        if not isinstance(raw, str):
            return raw
        value = _number(raw)
        if not (0 < value < math.inf):
            raise ValueError(
                f"KF_PROBLEM_REPLY_MB={raw!r} is not a positive number of MB; unset it for a quarter of the "
                "available memory or set e.g. KF_PROBLEM_REPLY_MB=8192"
            )
        return value


def settings() -> Settings:
    """The settings of the environment as it is now (tests point a process at their own servers by changing it)."""
    # pydantic-settings matches names regardless of case (kf_home too), so the cache key must as well.
    return _settings_of(tuple(sorted((name, value) for name, value in os.environ.items() if name[:3].upper() == "KF_")))


@functools.lru_cache(maxsize=16)
def _settings_of(environment: tuple[tuple[str, str], ...]) -> Settings:
    # Keyed by the KF_* variables, so that asking for a setting in a loop does not parse the environment each time.
    try:
        return Settings()
    except ValidationError as error:
        reasons = []
        for item in error.errors():
            reason = str(item.get("ctx", {}).get("error") or item["msg"])
            # The validators above name their variable; pydantic's own checks (a choice, a bound) do not.
            variable = f"KF_{str(item['loc'][0]).upper()}" if item["loc"] else "KF_*"
            reasons.append(
                reason if variable in reason else f"{variable}={item['input']!r}: {reason}; unset it for its default"
            )
        raise ConfigurationError("; ".join(reasons)) from None


def kf_home() -> Path:
    """The state folder: embedded databases, pid files, logs and the artifact cache live under it."""
    return settings().home.resolve()


def database_url_override() -> str | None:
    """The Postgres URL the user asked for, or None to use the embedded server."""
    return settings().database_url


def database_owner_url_override() -> str | None:
    """The Postgres URL of the log's owner role the user asked for, or None (see ``KF_DATABASE_OWNER_URL``)."""
    return settings().database_owner_url


def temporal_address_override() -> str | None:
    """The Temporal frontend the user asked for, or None to use the embedded dev server."""
    return settings().temporal_address


def temporal_namespace() -> str:
    """The Temporal namespace searches run in."""
    return settings().temporal_namespace


def temporal_retention_days() -> int:
    """Days the embedded dev server keeps closed searches' histories (``KF_TEMPORAL_RETENTION_DAYS``)."""
    return settings().temporal_retention_days


def temporal_ports() -> tuple[int, int]:
    """(gRPC port, Web UI port) a new embedded dev server listens on: KF_TEMPORAL_PORT, KF_TEMPORAL_UI_PORT."""
    current = settings()
    # Like the temporal CLI itself: the UI defaults to the gRPC port + 1000, which is 8233 by default.
    ui_default = current.temporal_port + (DEFAULT_TEMPORAL_UI_PORT - DEFAULT_TEMPORAL_PORT)
    ui_port = current.temporal_ui_port
    return current.temporal_port, ui_port if ui_port is not None else (ui_default if ui_default < 65536 else 0)


def temporal_ui_url_override() -> str | None:
    """The Web UI address the user asked links to point at (``KF_TEMPORAL_UI_URL``), or None."""
    return settings().temporal_ui_url


def cache_dir() -> Path:
    """Content-addressed build artifacts (compiled kernels) live here."""
    return kf_home() / "cache"


def machine_dir(cache: Path | None = None) -> Path:
    """Where this machine's measured figures live: ``KF_MACHINE_DIR``, else ``machine/`` in the cache folder."""
    override = settings().machine_dir
    if override is not None:
        return override.resolve()
    return (cache or cache_dir()) / "machine"


def metrics_port() -> int | None:
    """The port `kf worker` serves Prometheus metrics on (``KF_METRICS_PORT``), or None for no metrics."""
    return settings().metrics_port


def outage_patience_s() -> float:
    """Seconds an unreachable Postgres or Temporal is waited out before the step fails (``KF_OUTAGE_PATIENCE_S``)."""
    return settings().outage_patience_s


def problem_call_s() -> float:
    """Seconds one call of a problem.py data function may run before it counts as hung (``KF_PROBLEM_CALL_S``)."""
    return settings().problem_call_s


def problem_reply_bytes() -> int:
    """The largest reply a problem folder's process may send the judge, in bytes (``KF_PROBLEM_REPLY_MB``; by
    default a quarter of the memory available now: a reply bigger than that would leave the judge too little
    for the reference and the kernel's outputs)."""
    megabytes = settings().problem_reply_mb
    if megabytes is None:
        return int(psutil.virtual_memory().available // 4)
    return int(megabytes * 1e6)


def _variable(info: ValidationInfo) -> str:
    return f"KF_{(info.field_name or '').upper()}"


def _number(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        return math.nan
