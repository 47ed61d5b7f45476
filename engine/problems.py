"""Problems: load a problem folder (built in under ``kernels/`` or any path) and check its format.

A problem folder holds ``problem.py`` (numpy only) plus its seed kernels and templates: C (``seed.c``) for
the CPU backend, CUDA (``seed.cu``) for the CUDA backend, or both; the format is documented in
docs/problems.md. A loaded :class:`Problem` is a view for one backend (:meth:`Problem.for_backend`): its
entry point, seed and template are that backend's, everything else (inputs, reference, tolerances) is shared.
The harness never trusts a folder blindly: missing names and malformed parameter lists are reported with the
file and the fix.

``bfloat16`` arrays are stored as their bit patterns in ``uint16`` (numpy has no bfloat16):
:func:`float32_to_bf16` makes them, :func:`bf16_to_float32` and :meth:`Problem.decode_output` read them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import math
import os
import re
import sys
import threading
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
import psutil
from threadpoolctl import threadpool_limits

from engine.config import problem_call_s
from engine.errors import ProblemDefinitionError, UnknownProblemError, UserError
from engine.harness.protocol import bf16_rounded
from engine.problem_fingerprint import folder_fingerprint
from engine.problem_host import HostedModule, HostEnded, ProblemHost, Raised, forget, host_for
from kernels import SUITE_DIR

# References and baselines run in the judge's own process, from several threads (a worker runs steps
# concurrently; the template space test validates two settings at once). OpenBLAS's own thread pool hung
# there once: a 100x257 by 257x130 float64 product spun for over ten minutes at 100% system time in a CI
# run. The judge's arrays are small, so it gets one BLAS thread. Sandboxed children set their own thread
# count (engine/harness/sandbox.py) and never import this module.
threadpool_limits(limits=1, user_api="blas")

ROLES = ("in", "out", "inout", "size", "scalar")
# How each declared dtype is stored in numpy. bfloat16 has no numpy type: its 16 bits are kept as uint16.
DTYPES = {"float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32, "bfloat16": np.uint16}
# The C++ type of one element in a CUDA kernel's parameters (bfloat16 as its bits, converted by hand).
CUDA_TYPES = {
    "float32": "float",
    "float64": "double",
    "int64": "long long",
    "int32": "int",
    "bfloat16": "unsigned short",
}
BACKENDS = ("cpu", "cuda")
MEMORY_HEADROOM = 4
"""A shape's arrays may take at most 1 / MEMORY_HEADROOM of the machine's memory: a trial holds the
inputs, a float64 reference and the kernel's outputs together, and timing keeps pools of them."""
REQUIRED = (
    "NAME",
    "PARAMS",
    "VALIDATION_SHAPES",
    "BENCHMARK_SHAPES",
    "TOLERANCES",
    "DISTRIBUTIONS",
    "make_inputs",
    "reference",
    "baseline",
    "roofline",
)
# What each backend needs besides REQUIRED, checked only where the folder declares that backend: ENTRY
# declares a C kernel, CUDA_ENTRY a CUDA kernel, and a CUDA-only folder needs no C parts at all.
REQUIRED_FOR = {"cpu": ("ENTRY", "SIGNATURE"), "cuda": ("CUDA_ENTRY", "cuda_baseline")}
_DECLARES = {"cpu": "ENTRY", "cuda": "CUDA_ENTRY"}

MAX_RTOL = 0.1
"""The largest relative tolerance any call of Problem.tolerance accepts. At rtol >= 1 an answer of zeros passes
everywhere; the loosest built-in is 8e-3 (bfloat16 outputs, one step of 2^-7). How loose a tolerance may be
for the values a problem has is kf problem check's question (engine/problem_check.py), at every shape."""

MAX_TEMPLATE_SETTINGS = 250_000
"""The most settings (the product of a template's value counts) a problem may declare: proposers enumerate the
whole space and ask template_allows about each, so a product of billions would fill the memory of the worker or
the ``kf`` command that loaded it. The built-in spaces have up to 69,120."""


class _Declarations(NamedTuple):
    """What a backend's seed, template, parameter space and restrictions are called in problem.py."""

    seed: str
    default_seed: str
    template: str
    template_params: str
    template_allows: str


_NAMES = {
    "cpu": _Declarations("SEED", "seed.c", "TEMPLATE", "TEMPLATE_PARAMS", "template_allows"),
    "cuda": _Declarations("CUDA_SEED", "seed.cu", "CUDA_TEMPLATE", "CUDA_TEMPLATE_PARAMS", "cuda_template_allows"),
}
_PLACEHOLDER = re.compile(r"\{\{([A-Z_][A-Z0-9_]*)\}\}")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def bf16_to_float32(bits: Any) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as float32 values: exact, a bfloat16 is the top half of a float32."""
    wide = np.asarray(bits, dtype=np.uint16).astype(np.uint32)
    return np.asarray((wide << np.uint32(16)).view(np.float32))


def float32_to_bf16(values: Any) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16, ties to even, as bit patterns (uint16); NaN stays a
    (quiet) NaN and values beyond the largest bfloat16 round to infinity, as hardware conversions do."""
    single = np.array(values, dtype=np.float32)
    bits = single.view(np.uint32)
    rounded = bf16_rounded(bits)  # NaN's bits may carry past 32 there: replaced below
    quiet_nan = (bits >> np.uint32(16)) | np.uint32(0x0040)
    return np.asarray(np.where(np.isnan(single), quiet_nan, rounded).astype(np.uint16))


@dataclass(frozen=True)
class Param:
    """One argument of the kernel's entry point, in ABI order."""

    name: str
    role: str
    dtype: str
    shape: tuple[str, ...] = ()
    vary: bool = True
    """Whether the judge may change this input a little between timed calls (PARAMS' "vary", default True): a
    float or bfloat16 input's drift and the fresh-input probe's refresh. False for an input whose values a small
    change can make invalid (sorted edges, probabilities below 1)."""

    @property
    def is_array(self) -> bool:
        return self.role in ("in", "out", "inout")

    def dims(self, shape: dict[str, int]) -> tuple[int, ...]:
        return tuple(int(shape[d]) for d in self.shape)


WATCHED_FUNCTIONS = frozenset({"make_inputs", "reference", "baseline", "tolerance_for"})
"""A built-in problem.py's data functions, which the judge calls in a thread with a deadline
(KF_PROBLEM_CALL_S): they work on whole arrays. The small pure ones (roofline, template_allows) are called
directly. A user's folder runs all of them in its host process instead (engine/problem_host.py), where a hung
call can be killed."""


_PRINTS_LOCK = threading.Lock()
_prints_depth = 0
_prints_saved: Any = None
_prints_saved_fd: int | None = None


@contextlib.contextmanager
def _prints_to_stderr() -> Iterator[None]:
    """What problem.py prints while it is imported or called goes to stderr: standard output is the command's
    (`kf problem check --json` prints one JSON document there). Both sys.stdout and file descriptor 1 (what
    ``os.write(1, …)`` or a C library's printf writes to) point at stderr meanwhile. Counted, so that calls from
    several threads at once restore the real stream only when the last one is done."""
    global _prints_depth, _prints_saved, _prints_saved_fd
    with _PRINTS_LOCK:
        if _prints_depth == 0:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            _prints_saved, sys.stdout = sys.stdout, sys.stderr
            _prints_saved_fd = _point_stdout_at_stderr()
        _prints_depth += 1
    try:
        yield
    finally:
        with _PRINTS_LOCK:
            _prints_depth -= 1
            if _prints_depth == 0:
                sys.stdout, _prints_saved = _prints_saved, None
                if _prints_saved_fd is not None:
                    os.dup2(_prints_saved_fd, 1)
                    os.close(_prints_saved_fd)
                    _prints_saved_fd = None


def _point_stdout_at_stderr() -> int | None:
    """Point file descriptor 1 at what 2 is, returning a copy of what 1 was (None where either is closed)."""
    try:
        saved = os.dup(1)
    except OSError:
        return None
    try:
        os.dup2(2, 1)
    except OSError:
        os.close(saved)
        return None
    return saved


def _watched(call: Callable[..., Any], args: tuple[Any, ...], seconds: float, where: str) -> Any:
    """``call(*args)`` in a thread of its own, its result or its exception; a ProblemDefinitionError when it
    has not returned within ``seconds``. Python cannot stop a thread: a hung call is left running (a daemon,
    so it never holds the process open), and what called it gets the problem's error at once instead of
    waiting with it."""
    done: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            done.append((True, call(*args)))
        except BaseException as error:  # handed to the caller, who decides what it means
            done.append((False, error))

    thread = threading.Thread(target=run, name="kf-problem-call", daemon=True)
    thread.start()
    thread.join(seconds)
    if not done:
        raise ProblemDefinitionError(
            f"{where} did not return within {seconds:g} s (KF_PROBLEM_CALL_S); look for an endless loop or a wait "
            "in problem.py, or make the shape smaller",
            hung=True,
        )
    ok, value = done[0]
    if ok:
        return value
    raise value


def _host_ended(where: str, ended: HostEnded, hint: str = "") -> ProblemDefinitionError:
    """The problem's error for a call (``where``) whose host process hung or ended."""
    fix = ended.fix or f"look for an endless loop, a wait or an exit in problem.py{hint}"
    return ProblemDefinitionError(f"{where} {ended.how}; {fix}", hung=ended.hung)


ProblemModule = ModuleType | HostedModule
"""problem.py as the judge holds it: imported (a built-in problem), or its declarations as its host sent them."""


def _shown(value: Any) -> str:
    """An argument of a problem.py function as an error message shows it: shapes, names and template settings
    as they are, inputs (arrays) and the random generator by what they are."""
    if isinstance(value, np.random.Generator):
        return "rng"
    if isinstance(value, dict) and any(isinstance(v, np.ndarray) for v in value.values()):
        return "inputs"
    return repr(value)


def _represents(kind: np.dtype[Any], dtype: str) -> bool:
    """Whether arrays of numpy dtype ``kind`` hold every value of the declared ``dtype`` as a float: float64
    does for all of them, float32 for float32 and bfloat16 (whose values are float32's top halves), an integer
    or float16 array for none."""
    values = np.dtype(np.float32) if dtype == "bfloat16" else np.dtype(DTYPES[dtype])
    return kind.kind == "f" and np.can_cast(values, kind, "safe")


def cuda_signature(entry: str, params: tuple[Param, ...]) -> str:
    """The CUDA kernel's declaration for ``params``: arrays as device pointers (``const`` for ``in``), sizes as
    ``long long``, scalars by value, in PARAMS order."""
    args = []
    for p in params:
        base = "long long" if p.role == "size" else CUDA_TYPES[p.dtype]
        if p.is_array:
            args.append(f"{'const ' if p.role == 'in' else ''}{base} *{p.name}")
        else:
            args.append(f"{base} {p.name}")
    return f'extern "C" __global__ void {entry}({", ".join(args)})'


def declared_backends(module: ProblemModule) -> tuple[str, ...]:
    """The backends a problem.py declares a kernel for: ``cpu`` with ``ENTRY``, ``cuda`` with ``CUDA_ENTRY``."""
    return tuple(b for b in BACKENDS if hasattr(module, _DECLARES[b]))


@dataclass(frozen=True)
class Problem:
    """A loaded problem folder: its declarations and the functions of its ``problem.py``, viewed for one
    backend (``backend``): the entry point, signature, seed, template and benchmark shapes are that backend's."""

    name: str
    folder: Path
    module: ProblemModule = field(repr=False)
    """problem.py: the module itself for a built-in problem; for a user's folder, the declarations its host
    process sent (the judge never imports a user's problem.py)."""
    params: tuple[Param, ...]
    backend: str = "cpu"
    host: ProblemHost | None = field(default=None, repr=False, compare=False)
    """The child process that runs problem.py's functions (engine/problem_host.py); None for a built-in
    problem, whose functions run in this process."""

    @property
    def backends(self) -> tuple[str, ...]:
        """Every backend the folder declares a kernel for, e.g. ``("cpu", "cuda")``."""
        return declared_backends(self.module)

    def for_backend(self, backend: str) -> Problem:
        """This problem as seen by ``backend`` (``cpu`` or ``cuda``): proposers and the harness use the view's
        seed, template and entry point unchanged. A backend the folder does not declare is a UserError."""
        if backend not in BACKENDS:
            raise UserError(f"unknown backend {backend!r}; expected one of {list(BACKENDS)}")
        if backend not in self.backends:
            needs = "ENTRY and SIGNATURE (and seed.c)" if backend == "cpu" else "CUDA_ENTRY (and seed.cu)"
            raise UserError(
                f"problem {self.name!r} has no {backend} kernel: {self.folder / 'problem.py'} declares only "
                f"{list(self.backends)}; pick a target of those, or declare {needs} (see docs/problems.md)"
            )
        return self if backend == self.backend else dataclasses.replace(self, backend=backend)

    @property
    def _names(self) -> _Declarations:
        return _NAMES[self.backend]

    @property
    def entry(self) -> str:
        return str(getattr(self.module, _DECLARES[self.backend]))

    @property
    def signature(self) -> str:
        """The entry point's declaration: the C prototype (``SIGNATURE``), or the CUDA kernel's, derived from
        PARAMS (:func:`cuda_signature`)."""
        if self.backend == "cuda":
            return cuda_signature(self.entry, self.params)
        return str(self.module.SIGNATURE)

    @property
    def family(self) -> str:
        return str(getattr(self.module, "FAMILY", self.name))

    @property
    def validation_shapes(self) -> list[dict[str, int]]:
        return [dict(s) for s in self.module.VALIDATION_SHAPES]

    @property
    def benchmark_shapes(self) -> list[tuple[dict[str, int], float]]:
        """``BENCHMARK_SHAPES``; for the CUDA view ``CUDA_BENCHMARK_SHAPES`` where declared (a GPU needs far
        larger shapes than a core to be bound by its memory rather than by launch overhead)."""
        shapes = self.module.BENCHMARK_SHAPES
        if self.backend == "cuda":
            shapes = getattr(self.module, "CUDA_BENCHMARK_SHAPES", shapes)
        return [(dict(s), float(w)) for s, w in shapes]

    @property
    def distributions(self) -> list[str]:
        return list(self.module.DISTRIBUTIONS)

    @property
    def timed_distribution(self) -> str:
        """The distribution the judge's timed calls draw: ``normal`` when DISTRIBUTIONS has it, else the first."""
        return "normal" if "normal" in self.distributions else self.distributions[0]

    def tolerance(
        self, dtype: str, shape: dict[str, int] | None = None, inputs: dict[str, Any] | None = None
    ) -> tuple[float, float]:
        """(atol, rtol) for outputs of this dtype: an output ``y`` passes where
        ``|y - ref| <= atol + rtol * |ref|`` elementwise (``numpy.isclose``).

        Pass the trial's ``shape`` and ``inputs``: a problem whose rounding error grows with its inputs (a
        k-long dot product grows with k and with the magnitude of its operands) defines
        ``tolerance_for(dtype, shape, inputs)`` in its problem.py, and only that gives the right bound for
        the trial. Without them, or without that function, the fixed ``TOLERANCES[dtype]`` apply.
        """
        scaled = getattr(self.module, "tolerance_for", None)
        if scaled is not None and shape is not None and inputs is not None:
            tol = self._call("tolerance_for", dtype, shape, inputs)
        else:
            if dtype not in self.module.TOLERANCES:
                raise ProblemDefinitionError(
                    f"{self.folder / 'problem.py'} TOLERANCES has no entry for dtype {dtype!r}; add "
                    f"{{{dtype!r}: {{'atol': ..., 'rtol': ...}}}}"
                )
            tol = self.module.TOLERANCES[dtype]
        try:
            atol, rtol = float(tol["atol"]), float(tol["rtol"])
        except (TypeError, KeyError, ValueError):
            raise ProblemDefinitionError(
                f"{self.folder / 'problem.py'}: the tolerance for {dtype} is {tol!r}; "
                "give {'atol': ..., 'rtol': ...}, two numbers >= 0"
            ) from None
        where = f"{self.folder / 'problem.py'}: the tolerance for {dtype}" + (f" at {shape}" if shape else "")
        if not (0 <= atol < math.inf and 0 <= rtol < math.inf):  # NaN fails too
            raise ProblemDefinitionError(f"{where} is {tol!r}; atol and rtol must be finite numbers >= 0")
        if rtol > MAX_RTOL:
            # Checked on every call, so at every shape the judge compares on (the timed outputs' benchmark
            # shapes too), not only where kf problem check looked.
            raise ProblemDefinitionError(
                f"{where} is {tol!r}; rtol must be at most {MAX_RTOL:g}: a tolerance of more than {MAX_RTOL:.0%} "
                "of every value checks nothing (bfloat16 outputs need 2^-7); fix TOLERANCES or tolerance_for()"
            )
        return atol, rtol

    def make_inputs(self, shape: dict[str, int], distribution: str, seed: int) -> dict[str, Any]:
        """Fresh inputs for one trial; the same (shape, distribution, seed) always gives the same arrays.

        Holds every ``in`` and ``inout`` array (C-contiguous, of the declared dtype and shape) and every
        ``scalar``; a problem.py that returns anything else is reported here, naming what was wrong.
        """
        if distribution not in self.distributions:
            raise UserError(
                f"problem {self.name!r} has no input distribution {distribution!r}; choose one of {self.distributions}"
            )
        rng = np.random.default_rng(seed)
        inputs = self._call("make_inputs", shape, distribution, rng)
        if not isinstance(inputs, dict):
            raise ProblemDefinitionError(
                f"{self.folder / 'problem.py'} make_inputs({shape}, {distribution!r}) returned "
                f"{type(inputs).__name__}; it must return a dict of every in/inout/scalar param"
            )
        self._check_inputs(inputs, shape, distribution)
        return inputs

    def _call(self, function: str, *args: Any) -> Any:
        """``function`` of problem.py called with ``args``. What it raises is said as a ProblemDefinitionError
        that names the function, the shape and the fix: a user's problem.py may hold anything, and its bug is
        neither the kernel's verdict nor the harness's. A user's folder runs in its host process, every call
        with the deadline (KF_PROBLEM_CALL_S); a built-in one here, its data functions with the deadline."""
        if self.host is not None:
            where = self._where(function, args)
            try:
                value = self.host.call(function, args, problem_call_s())
            except HostEnded as ended:
                raise _host_ended(where, ended, ", or make the shape smaller") from None
            if isinstance(value, Raised):
                if value.memory:
                    raise self._out_of_memory(where)
                raise ProblemDefinitionError(f"{where} {value.words(function)}")
            return value
        with _prints_to_stderr():
            return self._call_here(function, args)

    def _call_here(self, function: str, args: tuple[Any, ...]) -> Any:
        """``function`` of a built-in problem.py called in this process, what it prints already sent to stderr
        (see _call)."""
        call = getattr(self.module, function)
        try:
            if function not in WATCHED_FUNCTIONS:
                return call(*args)
            return _watched(call, args, problem_call_s(), self._where(function, args))
        except MemoryError:
            raise self._out_of_memory(self._where(function, args)) from None
        except ProblemDefinitionError:
            raise
        except (Exception, SystemExit) as error:
            where = self._where(function, args)
            raise ProblemDefinitionError(f"{where} raised {error!r}; fix {function}() in problem.py") from error

    def _where(self, function: str, args: tuple[Any, ...]) -> str:
        """The call as messages name it, e.g. ``…/problem.py make_inputs({'n': 4}, 'normal', 7)``. Formatted only
        when a message needs it: template_allows is called for every setting of a product of 100,000."""
        shown = ", ".join(_shown(a) for a in args)
        return f"{self.folder / 'problem.py'} {function}({shown})"

    @staticmethod
    def _out_of_memory(where: str) -> ProblemDefinitionError:
        return ProblemDefinitionError(
            f"{where} ran out of memory: the shape needs more than this machine has; use smaller shapes "
            "(docs/problems.md, Shapes)"
        )

    def _check_outputs(self, function: str, out: Any, shape: dict[str, int], finite: bool) -> dict[str, np.ndarray]:
        """``out``, what ``function`` (reference or baseline) returned: a dict with every output, each an array
        of the output's shape; with ``finite`` (the reference), no inf or NaN (no kernel can match one: NaN never
        passes), in a float dtype that holds every value of the output's declared dtype."""
        where = f"{self.folder / 'problem.py'} {function}(inputs, {shape})"
        if not isinstance(out, dict):
            raise ProblemDefinitionError(
                f"{where} returned {type(out).__name__}; it must return a dict of every out/inout param"
            )
        for p in self.outputs:
            if p.name not in out:
                raise ProblemDefinitionError(f"{where} returned no {p.name!r}; it must return every out/inout param")
            try:
                array = np.asarray(out[p.name])
            except Exception as error:  # a user's object numpy cannot read
                raise ProblemDefinitionError(f"{where}: {p.name!r} is not an array ({error!r})") from None
            if array.shape != p.dims(shape):
                raise ProblemDefinitionError(
                    f"{where}: {p.name!r} has shape {array.shape}, but PARAMS declares {p.dims(shape)}; "
                    f"return the whole output"
                )
            if finite and not _represents(array.dtype, p.dtype):
                # Validation rounds the reference to the output's dtype before comparing: a reference in
                # integers (or in float16 for a float32 output) has already lost what a correct kernel keeps,
                # so the kernel would be judged against a rounded-off answer (or blamed for its digits).
                raise ProblemDefinitionError(
                    f"{where}: {p.name!r} is a{'n' if array.dtype.name[0] in 'aeiou' else ''} {array.dtype} "
                    f"array; a reference must be a float array wide enough for the {p.dtype} output (float64, as "
                    "docs/problems.md asks, an integer output's values included): return "
                    "np.asarray(..., dtype=np.float64)"
                )
            if finite and array.dtype.kind in "fc" and not np.isfinite(array).all():
                bad = tuple(int(i) for i in np.argwhere(~np.isfinite(array))[0])
                raise ProblemDefinitionError(
                    f"{where}: {p.name!r} holds {array[bad]} at {bad}; a reference must be finite (no kernel can "
                    "match NaN or inf): fix reference() or the inputs make_inputs draws"
                )
        return out

    def _check_inputs(self, inputs: dict[str, Any], shape: dict[str, int], distribution: str) -> None:
        where = f"{self.folder / 'problem.py'} make_inputs({shape}, {distribution!r})"
        for p in self.params:
            if p.role in ("out", "size"):
                continue
            if p.name not in inputs:
                raise ProblemDefinitionError(
                    f"{where} returned no {p.name!r}; it must return every in/inout/scalar param"
                )
            value = inputs[p.name]
            if p.role == "scalar":
                problem = _scalar_problem(value, p.dtype)
                if problem:
                    raise ProblemDefinitionError(
                        f"{where}: scalar {p.name!r} is {value!r}, {problem}; return a {p.dtype} number "
                        f"(e.g. np.{p.dtype}(...))"
                    )
                continue
            want = p.dims(shape)
            if (
                not isinstance(value, np.ndarray)
                or value.dtype != np.dtype(DTYPES[p.dtype])
                or value.shape != want
                or not value.flags.c_contiguous
            ):
                got = f"{value.dtype} {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
                raise ProblemDefinitionError(
                    f"{where}: {p.name!r} must be a C-contiguous {p.dtype} array of shape {want}, got {got}; "
                    f"use np.ascontiguousarray(..., dtype=np.{p.dtype})"
                )

    def reference(self, inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
        """The exact answer (problem.py's ``reference``): every output, of its declared shape, finite."""
        return self._check_outputs("reference", self._call("reference", inputs, shape), shape, finite=True)

    def baseline(self, inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
        """What a numpy user writes (problem.py's ``baseline``): every output, of its declared shape."""
        return self._check_outputs("baseline", self._call("baseline", inputs, shape), shape, finite=False)

    def cuda_baseline(self, cp: Any, inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, Any]:
        """The library baseline on the GPU: what a Python GPU user calls, through CuPy. ``cp`` is the cupy
        module (imported by the caller, never here), ``inputs`` hold cupy arrays of the declared storage dtypes
        (``inout`` ones are copies the baseline may overwrite) and numpy scalars; returns a cupy array for
        every ``out`` and ``inout`` name."""
        # CuPy's arrays live in this process, so here problem.py is imported after all: only the sandboxed GPU
        # child calls this (engine/harness/cuda/worker.py), a process a crash or a hang may end.
        module = self.module if self.host is None else _in_process_module(self.folder, self.fingerprint())
        out: dict[str, Any] = module.cuda_baseline(cp, inputs, shape)
        return out

    def decode_output(self, name: str, array: np.ndarray) -> np.ndarray:
        """The values of output ``name`` as floats, for comparing with the reference: a bfloat16 array's bit
        patterns decoded to float32 (exactly), any other array unchanged."""
        param = next((p for p in self.params if p.name == name), None)
        if param is None:
            raise UserError(
                f"problem {self.name!r} has no parameter {name!r}; its outputs are {[p.name for p in self.outputs]}"
            )
        if param.dtype == "bfloat16":
            return bf16_to_float32(array)
        return np.asarray(array)

    def roofline(self, shape: dict[str, int]) -> dict[str, int]:
        """``{"bytes": int, "flops": int}`` (problem.py's ``roofline``): bytes > 0, flops >= 0 (0 where absent).

        Every kernel reads its inputs and writes its outputs, so a count of no bytes (or fewer, or NaN) is no
        model: the bound it gives, bytes / bandwidth, would be 0 ns or less, and no timing would be impossible.
        A copy does no arithmetic, so flops may be 0."""
        model = self._call("roofline", shape)
        where = f"{self.folder / 'problem.py'} roofline({shape})"
        if not isinstance(model, dict):
            raise ProblemDefinitionError(
                f"{where} returned {type(model).__name__}; it must return {{'bytes': int, 'flops': int}}"
            )
        checked: dict[str, int] = {}
        for key, least in (("bytes", "> 0"), ("flops", ">= 0")):
            value = model.get(key, 0)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float | np.integer | np.floating)
                or not math.isfinite(float(value))
                or not (value > 0 if key == "bytes" else value >= 0)
            ):
                raise ProblemDefinitionError(
                    f"{where}: {key!r} is {value!r}; it must be a finite number {least} (the bytes any kernel "
                    "moves: each input read once, each output written once; the flops it must do)"
                )
            # Rounded up: 0.5 bytes stored as int 0 was the no-bytes model refused above, and every timing passed.
            checked[key] = math.ceil(float(value))
        return checked

    @property
    def deterministic(self) -> bool:
        """False when the problem declares ``DETERMINISTIC = False``: its kernels may give different bits on
        identical inputs (atomics, parallel reductions), so validation does not demand bitwise repeats."""
        return bool(getattr(self.module, "DETERMINISTIC", True))

    @property
    def outputs(self) -> list[Param]:
        return [p for p in self.params if p.role in ("out", "inout")]

    @property
    def seed_path(self) -> Path:
        """The file of this backend's seed kernel (seed.c, seed.cu, or what SEED / CUDA_SEED name)."""
        return self.folder / str(getattr(self.module, self._names.seed, self._names.default_seed))

    def seed_source(self) -> str:
        return self.seed_path.read_text()

    def template_source(self) -> str | None:
        name = getattr(self.module, self._names.template, None)
        return (self.folder / str(name)).read_text() if name else None

    @property
    def template_params(self) -> dict[str, list[Any]]:
        return {k: list(v) for k, v in getattr(self.module, self._names.template_params, {}).items()}

    def template_allows(self, params: dict[str, Any]) -> bool:
        """Whether the template allows ``params`` (problem.py's template_allows; True when it has none)."""
        return self.allowed([params])[0]

    def allowed(self, settings: list[dict[str, Any]]) -> list[bool]:
        """template_allows of each setting, in order: a user's folder answers all of them in one call of its
        host (a template space has thousands of settings), with one deadline for the lot."""
        name = self._names.template_allows
        if not getattr(self.module, name, None):
            return [True] * len(settings)
        if self.host is None:
            # One redirection of what it prints for the lot (see _call).
            with _prints_to_stderr():
                return [bool(self._call_here(name, (s,))) for s in settings]
        where = f"{self.folder / 'problem.py'} {name}"
        try:
            answers = self.host.map(name, [(s,) for s in settings], problem_call_s())
        except HostEnded as ended:
            raise _host_ended(f"{where} over {len(settings)} settings", ended) from None
        if isinstance(answers, Raised):
            shown = repr(settings[answers.at]) if answers.at is not None else "a setting"
            raise ProblemDefinitionError(f"{where}({shown}) {answers.words(name)}")
        for setting, answer in zip(settings, answers, strict=True):
            # bool() of an array raises, and of anything else is a guess: say which setting got what.
            if not isinstance(answer, bool | int | np.bool_ | np.integer):
                raise ProblemDefinitionError(
                    f"{where}({setting!r}) returned {_shown(answer)[:80]}; it must return True or False"
                )
        return [bool(a) for a in answers]

    def render_template(self, params: dict[str, Any]) -> str:
        """The template's source with every ``{{NAME}}`` replaced by its parameter value."""
        source = self.template_source()
        if source is None:
            raise UserError(
                f"problem {self.name!r} has no {self.backend} template; add {self._names.template} to its problem.py"
            )
        missing = sorted(set(_PLACEHOLDER.findall(source)) - set(params))
        if missing:
            raise UserError(f"template of {self.name!r} needs values for {missing}; got {sorted(params)}")
        return _PLACEHOLDER.sub(lambda m: str(params[m.group(1)]), source)

    def fingerprint(self) -> str:
        """Hash of the problem folder's files: evidence records which definition judged a candidate."""
        return folder_fingerprint(self.folder)

    def space_identity(self) -> Hashable:
        """What this view's template space is a function of (caches of what is derived from the space are keyed on
        it): the folder, the backend and the folder's content. By content rather than by the Problem: a worker
        loads the problem afresh for every step, and a folder whose files are unchanged has the same space."""
        return (str(self.folder), self.backend, self.fingerprint())


def builtin_problems(backend: str | None = None) -> list[str]:
    """Names of the problems shipped under ``kernels/``; with ``backend``, only those with a kernel for it."""
    names = sorted(p.parent.name for p in SUITE_DIR.glob("*/problem.py"))
    if backend is None:
        return names
    return [n for n in names if backend in load_problem(n).backends]


def _problem_folder(text: str) -> Path | None:
    """The folder holding ``problem.py`` that ``text`` names (a built-in name or a path), or None. Only a bare
    name can be a built-in's: ``./softmax`` (a path) named the built-in softmax, not the folder the user meant."""
    bare = re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]*", text) is not None
    folder = SUITE_DIR / text
    if not bare or not (folder / "problem.py").is_file():
        folder = Path(text).expanduser()
        if folder.is_file() and folder.name == "problem.py":
            folder = folder.parent
    return folder if (folder / "problem.py").is_file() else None


def changed_input(first: dict[str, Any], second: dict[str, Any]) -> str | None:
    """The name of an input that differs bitwise between two draws of make_inputs, or None: the judge redraws
    inputs from their seeds, so a make_inputs that does not draw from its rng fails the comparison."""
    for name, value in first.items():
        a, b = np.asarray(value), np.asarray(second.get(name))
        if a.shape != b.shape or a.dtype != b.dtype or a.tobytes() != b.tobytes():
            return name
    return None


def names_a_problem(text: str) -> bool:
    """True when ``text`` is a built-in problem's name or a path to a folder holding problem.py (or to that
    file)."""
    try:
        return bool(text) and _problem_folder(text) is not None
    except OSError:  # a name the file system cannot even look up (too long, say)
        return False


def problem_argument(text: str) -> str:
    """How ``text`` (a built-in name or a folder path, as a user typed it) is written into a search: a built-in
    name as it is; a path to a problem folder on this machine as its absolute path, since the workers that load
    it run elsewhere (another folder, another machine). A path this machine does not hold is left as typed: the
    workers may hold it."""
    try:
        folder = _problem_folder(text)
    except OSError:  # not a usable path here: the workers will say so
        return text
    if folder is None or folder == SUITE_DIR / text:  # nothing here, or a built-in name
        return text
    return str(folder.resolve())


def load_problem(name_or_path: str | Path) -> Problem:
    """Load a built-in problem by name, or a problem folder by path."""
    text = str(name_or_path)
    try:
        folder = _problem_folder(text)
    except OSError as error:  # e.g. a path component over NAME_MAX: say which input it was
        raise UnknownProblemError(f"problem {text[:80]!r}… is not a usable path: {error.strerror}") from None
    if folder is None:
        raise UnknownProblemError(
            f"unknown problem {text!r}: not one of the built-in problems {builtin_problems()} and not a "
            "folder holding a problem.py; pass a built-in name or the path of a problem folder "
            "(see docs/problems.md)"
        )
    folder = folder.resolve()
    host = _started_host(folder)
    module: ProblemModule
    if host is None:
        module = _import_problem_module(folder)
    else:
        assert host.declarations is not None  # set by a start that succeeded
        module = HostedModule(folder, host.declarations)
    missing = [n for n in REQUIRED if not hasattr(module, n)]
    if missing:
        raise UserError(
            f"{folder / 'problem.py'} lacks {missing}; every problem.py defines {list(REQUIRED)} (see docs/problems.md)"
        )
    backends = declared_backends(module)
    if not backends:
        raise UserError(
            f"{folder / 'problem.py'} declares no kernel: define ENTRY and SIGNATURE for a C kernel (seed.c), "
            "CUDA_ENTRY for a CUDA kernel (seed.cu), or both (see docs/problems.md)"
        )
    for backend in backends:
        lacking = [n for n in REQUIRED_FOR[backend] if not hasattr(module, n)]
        if lacking:
            raise UserError(
                f"{folder / 'problem.py'} declares a {backend} kernel ({_DECLARES[backend]}) but lacks {lacking}; "
                f"a {backend} kernel needs {list(REQUIRED_FOR[backend])} (see docs/problems.md)"
            )
    _check_names_and_types(folder, module, backends)
    params = tuple(_parse_param(folder, raw) for raw in module.PARAMS)
    duplicated = sorted({p.name for p in params if sum(q.name == p.name for q in params) > 1})
    if duplicated:
        raise UserError(
            f"{folder / 'problem.py'}: PARAMS names {duplicated} more than once; each argument needs its own name"
        )
    _check_declarations(folder, module, params)
    if "cpu" in backends:
        _check_c_signature(folder, str(module.ENTRY), str(module.SIGNATURE), params)
        _check_kernel_files(folder, module, _NAMES["cpu"])
    if "cuda" in backends:
        _check_cuda_declarations(folder, module)
        _check_kernel_files(folder, module, _NAMES["cuda"])
    # The C view comes first where there is one: it is what every CPU caller has always received.
    return Problem(name=str(module.NAME), folder=folder, module=module, params=params, backend=backends[0], host=host)


def _module_name(folder: Path) -> str:
    return f"kf_problem_{hashlib.sha256(str(folder).encode()).hexdigest()[:12]}"


def _started_host(folder: Path) -> ProblemHost | None:
    """The host process of a user's folder, with its problem.py imported and its declarations received (None
    for a built-in problem, which this process imports). An import that raises, hangs or ends the process is
    a UserError naming problem.py: this process never imports the file itself."""
    if folder.parent == SUITE_DIR.resolve():
        return None
    host, new = host_for(folder, _module_name(folder), folder_fingerprint(folder))
    if new or host.declarations is None:
        where = folder / "problem.py"
        try:
            raised = host.start(problem_call_s())
        except HostEnded as ended:
            forget(host)
            raise UserError(
                f"{where} failed to import: importing it {ended.how}; "
                + (ended.fix or "look for an endless loop, a wait or an exit at the top level of problem.py")
            ) from None
        if raised is not None:
            forget(host)
            if raised.refused:
                raise UserError(f"{where} failed to import: its import {raised.words('import')}")
            raise UserError(f"{where} failed to import: {raised.shown}")
    return host


@functools.cache
def _in_process_module(folder: Path, fingerprint: str) -> ModuleType:
    """A user's problem.py imported into this process, once per version of the folder (``fingerprint``): for
    the sandboxed GPU child's library baseline only (Problem.cuda_baseline)."""
    del fingerprint  # part of the cache's key: an edited folder is imported anew
    return _import_problem_module(folder)


def _import_problem_module(folder: Path) -> ModuleType:
    module_name = _module_name(folder)
    spec = importlib.util.spec_from_file_location(module_name, folder / "problem.py")
    if spec is None or spec.loader is None:
        raise UserError(f"cannot import {folder / 'problem.py'}")
    module = importlib.util.module_from_spec(spec)
    try:
        with _prints_to_stderr():
            spec.loader.exec_module(module)
    # A user's folder may hold anything; say where it broke. SystemExit too: a problem.py that calls sys.exit()
    # must not end the worker or the command that loaded it.
    except (Exception, SystemExit) as error:
        raise UserError(f"{folder / 'problem.py'} failed to import: {error!r}") from error
    return module


def _check_names_and_types(folder: Path, module: ProblemModule, backends: tuple[str, ...]) -> None:
    """The declarations' types, before anything reads them: names that events, workflow ids and C accept, and
    the lists and tables the format describes (docs/problems.md), each refused with the fix."""
    where = folder / "problem.py"
    for name in ("NAME", *(("FAMILY",) if hasattr(module, "FAMILY") else ())):
        value = getattr(module, name)
        if not isinstance(value, str) or not _NAME.fullmatch(value):
            raise UserError(
                f"{where}: {name} is {value!r}; it must be a string of letters, digits, '_', '.' or '-', starting "
                "with a letter, at most 64 characters (it names the problem in events, lessons and search ids)"
            )
    for backend in backends:
        entry = getattr(module, _DECLARES[backend])
        if not isinstance(entry, str) or not _C_IDENTIFIER.fullmatch(entry):
            raise UserError(f"{where}: {_DECLARES[backend]} is {entry!r}; it must be the kernel's C identifier")
    if not isinstance(module.PARAMS, list | tuple) or not module.PARAMS:
        raise UserError(f"{where}: PARAMS is {module.PARAMS!r}; it must be a list of the entry point's arguments")
    for raw in module.PARAMS:
        if (
            not isinstance(raw, dict)
            or not isinstance(raw.get("name"), str)
            or not _C_IDENTIFIER.fullmatch(raw["name"])
        ):
            raise UserError(
                f"{where}: PARAMS entry {raw!r} must be a dict whose 'name' is a C identifier, e.g. "
                "{'name': 'x', 'role': 'in', 'dtype': 'float32', 'shape': ['rows', 'cols']}"
            )
    for name in ("VALIDATION_SHAPES", "BENCHMARK_SHAPES", "DISTRIBUTIONS"):
        value = getattr(module, name)
        if not isinstance(value, list | tuple) or not value:
            raise UserError(f"{where}: {name} is {value!r}; it must be a non-empty list (see docs/problems.md)")
    if not all(isinstance(d, str) for d in module.DISTRIBUTIONS):
        raise UserError(f"{where}: DISTRIBUTIONS is {module.DISTRIBUTIONS!r}; it must list distribution names")
    if not all(isinstance(s, dict) for s in module.VALIDATION_SHAPES):
        raise UserError(f"{where}: every VALIDATION_SHAPES entry must be a shape dict, e.g. {{'rows': 3, 'cols': 7}}")
    deterministic = getattr(module, "DETERMINISTIC", True)
    if not isinstance(deterministic, bool):
        # bool() of it was taken: [] or 0 turned validation's identical-bits repeat off, "no" left it on.
        raise UserError(
            f"{where}: DETERMINISTIC is {deterministic!r}; it must be True or False (False: a correct kernel may "
            "give different bits on identical inputs)"
        )
    tolerances = module.TOLERANCES
    if not isinstance(tolerances, dict) or not all(isinstance(t, dict) for t in tolerances.values()):
        raise UserError(
            f"{where}: TOLERANCES is {tolerances!r}; it must map each output dtype to {{'atol': ..., 'rtol': ...}}"
        )


def _parse_param(folder: Path, raw: dict[str, Any]) -> Param:
    where = f"{folder / 'problem.py'} PARAMS entry {raw!r}"
    if not isinstance(raw.get("role"), str) or raw["role"] not in ROLES:
        raise UserError(f"{where}: role must be one of {ROLES}")
    if not isinstance(raw.get("dtype"), str) or raw["dtype"] not in DTYPES:
        raise UserError(f"{where}: dtype must be one of {sorted(DTYPES)}")
    given = raw.get("shape", ())
    if not isinstance(given, list | tuple) or not all(isinstance(size, str) for size in given):
        raise UserError(f"{where}: shape must be a list of size names, e.g. ['rows', 'cols'] (or [] for none)")
    shape = tuple(given)
    if raw["role"] in ("in", "out", "inout") and not shape:
        raise UserError(f"{where}: an array parameter needs a shape, e.g. ['rows', 'cols']")
    vary = raw.get("vary", True)
    if not isinstance(vary, bool):
        raise UserError(
            f"{where}: vary must be True or False (False: the judge leaves this input as drawn between timed calls, "
            "for values a small change could make invalid, e.g. sorted edges or probabilities)"
        )
    return Param(name=str(raw["name"]), role=str(raw["role"]), dtype=str(raw["dtype"]), shape=shape, vary=vary)


def _check_declarations(folder: Path, module: ProblemModule, params: tuple[Param, ...]) -> None:
    """Shapes that name every size, positive weights, a tolerance for every output dtype."""
    where = folder / "problem.py"
    sizes = {p.name for p in params if p.role == "size"}
    for p in params:
        unknown = sorted(set(p.shape) - sizes)
        if unknown:
            raise UserError(
                f"{where}: array {p.name!r} is shaped by {unknown}, which are not size params {sorted(sizes)}"
            )
    benchmarks = {"BENCHMARK_SHAPES": list(module.BENCHMARK_SHAPES)}
    if hasattr(module, "CUDA_BENCHMARK_SHAPES"):
        benchmarks["CUDA_BENCHMARK_SHAPES"] = list(module.CUDA_BENCHMARK_SHAPES)
    for name, benchmark in benchmarks.items():
        for entry in benchmark:
            if not (
                isinstance(entry, tuple | list)
                and len(entry) == 2
                and isinstance(entry[0], dict)
                and isinstance(entry[1], int | float)
                and not isinstance(entry[1], bool)
                and 0 < entry[1] < math.inf
            ):
                raise UserError(f"{where}: {name} entry {entry!r} must be a (shape, weight) pair, weight > 0")
    for function in ("make_inputs", "reference", "baseline", "roofline"):
        if not callable(getattr(module, function)):
            raise UserError(f"{where}: {function} must be a function (see docs/problems.md)")
    memory = psutil.virtual_memory().total
    for label, shapes in (
        ("VALIDATION_SHAPES", list(module.VALIDATION_SHAPES)),
        *((name, [s for s, _ in benchmark]) for name, benchmark in benchmarks.items()),
    ):
        if not shapes:
            raise UserError(f"{where}: {label} is empty; give at least one shape")
        for shape in shapes:
            if set(shape) != sizes or any(
                not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in shape.values()
            ):
                raise UserError(f"{where}: {label} entry {shape!r} must give each of {sorted(sizes)} a positive int")
            needed = sum(
                math.prod(shape[d] for d in p.shape) * np.dtype(DTYPES[p.dtype]).itemsize for p in params if p.is_array
            )
            # A trial holds its inputs, the reference (float64) and the kernel's outputs at once, and timing
            # keeps pools of them: a shape whose arrays alone fill a quarter of the memory cannot be judged here.
            if needed * MEMORY_HEADROOM > memory:
                raise UserError(
                    f"{where}: {label} entry {shape!r} needs {needed / 2**30:.1f} GiB for its arrays alone; this "
                    f"machine has {memory / 2**30:.1f} GiB of memory: use smaller shapes (docs/problems.md, Shapes)"
                )
    missing = sorted({p.dtype for p in params if p.role in ("out", "inout")} - set(module.TOLERANCES))
    if missing:
        raise UserError(
            f"{where}: TOLERANCES has no entry for output dtype(s) {missing}; "
            "add {dtype: {'atol': ..., 'rtol': ...}}"
        )


# The C types one element of each dtype may be spelt as in SIGNATURE (after dropping const and restrict).
_C_SPELLINGS = {
    "float32": {"float"},
    "float64": {"double"},
    "int64": {"int64_t", "long long", "long long int", "long", "long int", "signed long long"},
    "int32": {"int32_t", "int", "signed int", "signed"},
    "bfloat16": {"uint16_t", "unsigned short", "unsigned short int"},
}
# How the prototype to write names each dtype.
_C_NAME = {"float32": "float", "float64": "double", "int64": "int64_t", "int32": "int32_t", "bfloat16": "uint16_t"}
_SIGNATURE = re.compile(r"\s*void\s+([A-Za-z_]\w*)\s*\(([^()]*)\)\s*;?\s*")
_C_PARAMETER = re.compile(r"([A-Za-z_][\w\s]*?)\s*(\*?)\s*([A-Za-z_]\w*)")


def _check_c_signature(folder: Path, entry: str, signature: str, params: tuple[Param, ...]) -> None:
    """SIGNATURE is one C prototype of ``void ENTRY(...)`` whose arguments are PARAMS, in order, with their C
    types: an array a pointer to its element type, a size or scalar its type by value. The harness
    calls the kernel as PARAMS say and puts SIGNATURE before the source as the prototype the kernel must match,
    so a SIGNATURE that says otherwise makes every seed written to it wrong (or lets one line of it carry a
    #define into every kernel)."""
    where = folder / "problem.py"
    wanted = ", ".join(
        f"{'const ' if p.role == 'in' else ''}{_C_NAME[p.dtype]} *{p.name}"
        if p.is_array
        else f"{_C_NAME[p.dtype]} {p.name}"
        for p in params
    )
    fix = f"write it as `void {entry}({wanted})`"
    whole = _SIGNATURE.fullmatch(signature)
    if whole is None or "\n" in signature.strip():
        raise UserError(f"{where}: SIGNATURE {signature[:200]!r} is not one C prototype `void NAME(...)`; {fix}")
    if whole.group(1) != entry:
        raise UserError(f"{where}: SIGNATURE declares {whole.group(1)!r}, but ENTRY is {entry!r}; {fix}")
    pieces = [piece.strip() for piece in whole.group(2).split(",")] if whole.group(2).strip() else []
    if len(pieces) != len(params):
        raise UserError(f"{where}: SIGNATURE has {len(pieces)} arguments, but PARAMS declares {len(params)}; {fix}")
    for piece, p in zip(pieces, params, strict=True):
        # Qualifiers of the pointer itself (`float *restrict y`, `float *const y`) say nothing of the ABI.
        parsed = _C_PARAMETER.fullmatch(
            re.sub(r"\*\s*(?:(?:const|restrict|__restrict__|__restrict)\b\s*)+", "* ", piece)
        )
        words = parsed.group(1).split() if parsed else []
        base = " ".join(w for w in words if w not in ("const", "restrict", "__restrict", "__restrict__"))
        pointer = bool(parsed and parsed.group(2))
        if parsed is None or pointer != p.is_array or base not in _C_SPELLINGS[p.dtype]:
            kind = f"a pointer to {p.dtype}" if p.is_array else f"a {p.dtype} by value"
            raise UserError(
                f"{where}: SIGNATURE's argument {piece!r} does not match PARAMS' {p.name!r} ({kind}); {fix}"
            )


def _scalar_problem(value: Any, dtype: str) -> str | None:
    """What is wrong with ``value`` as a scalar argument of C type ``dtype``, or None: it must be one real
    number that the C type holds as it is (a kernel gets it converted: a string fails deep in the harness, an
    int32 past 2**31 wraps, a float32 past 3.4e38 becomes inf, and the kernel would be blamed for either)."""
    if (
        np.ndim(value) != 0
        or isinstance(value, bool | np.bool_)
        or not isinstance(value, int | float | np.number)
        or np.iscomplexobj(value)
    ):
        return "not a single real number"
    kind = np.dtype(DTYPES[dtype])
    if kind.kind in "iu":
        if not float(value).is_integer():
            return f"not a whole number, which {dtype} arguments need"
        limits = np.iinfo(str(kind))
        if not limits.min <= int(value) <= limits.max:
            return f"outside the {dtype} range [{limits.min}, {limits.max}]"
        return None
    if not math.isfinite(float(value)):
        return "not finite"
    if abs(float(value)) > float(np.finfo(str(kind)).max):
        return f"outside the {dtype} range (it would become inf)"
    return None


def _check_inside(folder: Path, declaration: str, name: object) -> None:
    """A file problem.py names lies in its folder: a problem travels as its folder (a search records it by
    path, a worker on another machine gets the folder), and a name like '/etc/passwd' or '../other/seed.c'
    would make a kernel of whatever file sits there."""
    path = folder / str(name)
    try:
        resolved = path.resolve(strict=False)
        resolved.is_file()  # a name too long for the file system fails here
    except (OSError, ValueError, RuntimeError) as error:  # a NUL byte, a symlink loop, a name too long
        raise UserError(
            f"{folder / 'problem.py'}: {declaration} is {str(name)[:80]!r}, which is not a usable file name "
            f"({error}); name a file in the problem's folder, e.g. seed.c"
        ) from None
    if not resolved.is_relative_to(folder.resolve()):
        raise UserError(
            f"{folder / 'problem.py'}: {declaration} is {str(name)!r}, which is outside {folder}; name a file in "
            "the problem's folder (copy it there)"
        )


def _check_kernel_files(folder: Path, module: ProblemModule, names: _Declarations) -> None:
    """A backend's seed file exists in the folder; a template comes with a space of non-empty value lists that
    names every placeholder it has, and ``template_allows`` is a function."""
    where = folder / "problem.py"
    seed = str(getattr(module, names.seed, names.default_seed))
    _check_inside(folder, names.seed, seed)
    if not (folder / seed).is_file():
        raise UserError(
            f"{where}: {names.seed} is {seed!r}, which is not a file in {folder}; add the naive kernel there "
            f"(or set {names.seed} to its file name)"
        )
    try:
        (folder / seed).read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{where}: cannot read {names.seed} {seed!r} as UTF-8 text: {error}") from None
    template = getattr(module, names.template, None)
    if template is None:
        return
    _check_inside(folder, names.template, template)
    if not (folder / str(template)).is_file():
        raise UserError(f"{where}: {names.template} names {template!r}, which is not a file in {folder}")
    space = getattr(module, names.template_params, None)
    if not isinstance(space, dict) or not space:
        raise UserError(f"{where}: {names.template} needs {names.template_params}, {{PARAM: [values...]}}")
    for name, values in space.items():
        if not isinstance(values, list | tuple) or not values:
            raise UserError(
                f"{where}: {names.template_params}[{name!r}] is {values!r}; give a non-empty list of the values "
                "the search may try"
            )
    settings = math.prod(len(values) for values in space.values())
    if settings > MAX_TEMPLATE_SETTINGS:
        counts = " x ".join(f"{len(v)} {k}" for k, v in space.items())
        raise UserError(
            f"{where}: {names.template_params} spans {settings:,} settings ({counts}), more than the "
            f"{MAX_TEMPLATE_SETTINGS:,} a search enumerates; drop values or knobs that cannot matter, or make one "
            "knob of knobs that only make sense together"
        )
    try:
        placeholders = set(_PLACEHOLDER.findall((folder / str(template)).read_text()))
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{where}: cannot read {names.template} {template!r}: {error}") from None
    unnamed = sorted(placeholders - set(space))
    if unnamed:
        raise UserError(
            f"{where}: {template} has placeholders {['{{' + n + '}}' for n in unnamed]} that "
            f"{names.template_params} does not name; add their values to {names.template_params} or fix the template"
        )
    allows = getattr(module, names.template_allows, None)
    if allows is not None and not callable(allows):
        raise UserError(f"{where}: {names.template_allows} must be a function (params) -> bool")


def _check_cuda_declarations(folder: Path, module: ProblemModule) -> None:
    """The CUDA seed and template files exist, a template comes with its parameters, the baseline is callable."""
    where = folder / "problem.py"
    seed = str(getattr(module, "CUDA_SEED", "seed.cu"))
    _check_inside(folder, "CUDA_SEED", seed)
    if not (folder / seed).is_file():
        raise UserError(f"{where}: CUDA_SEED names {seed!r}, which is not in {folder}; add the naive CUDA kernel")
    template = getattr(module, "CUDA_TEMPLATE", None)
    if template is not None:
        _check_inside(folder, "CUDA_TEMPLATE", template)
        if not (folder / str(template)).is_file():
            raise UserError(f"{where}: CUDA_TEMPLATE names {template!r}, which is not in {folder}")
        if not getattr(module, "CUDA_TEMPLATE_PARAMS", None):
            raise UserError(f"{where}: CUDA_TEMPLATE needs CUDA_TEMPLATE_PARAMS, {{PARAM: [values...]}}")
    if not callable(module.cuda_baseline):
        raise UserError(f"{where}: cuda_baseline must be a function (cp, inputs, shape) -> {{output: cupy array}}")
