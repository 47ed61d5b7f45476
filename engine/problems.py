"""Problems: load a problem folder (built in under ``kernels/`` or any path) and check its format.

A problem folder holds ``problem.py`` (numpy only) plus its C seed kernel and template; the format is
documented in docs/problems.md. The harness never trusts a folder blindly: missing names and malformed
parameter lists are reported with the file and the fix.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from engine.errors import UnknownProblemError, UserError
from kernels import SUITE_DIR

ROLES = ("in", "out", "inout", "size", "scalar")
DTYPES = {"float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32}
REQUIRED = (
    "NAME",
    "ENTRY",
    "SIGNATURE",
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
_PLACEHOLDER = re.compile(r"\{\{([A-Z_][A-Z0-9_]*)\}\}")


@dataclass(frozen=True)
class Param:
    """One argument of the kernel's C entry point, in ABI order."""

    name: str
    role: str
    dtype: str
    shape: tuple[str, ...] = ()

    @property
    def is_array(self) -> bool:
        return self.role in ("in", "out", "inout")

    def dims(self, shape: dict[str, int]) -> tuple[int, ...]:
        return tuple(int(shape[d]) for d in self.shape)


@dataclass(frozen=True)
class Problem:
    """A loaded problem folder: its declarations and the functions of its ``problem.py``."""

    name: str
    folder: Path
    module: ModuleType = field(repr=False)
    params: tuple[Param, ...]

    @property
    def entry(self) -> str:
        return str(self.module.ENTRY)

    @property
    def signature(self) -> str:
        return str(self.module.SIGNATURE)

    @property
    def family(self) -> str:
        return str(getattr(self.module, "FAMILY", self.name))

    @property
    def validation_shapes(self) -> list[dict[str, int]]:
        return [dict(s) for s in self.module.VALIDATION_SHAPES]

    @property
    def benchmark_shapes(self) -> list[tuple[dict[str, int], float]]:
        return [(dict(s), float(w)) for s, w in self.module.BENCHMARK_SHAPES]

    @property
    def distributions(self) -> list[str]:
        return list(self.module.DISTRIBUTIONS)

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
            tol = scaled(dtype, shape, inputs)
        else:
            if dtype not in self.module.TOLERANCES:
                raise UserError(
                    f"{self.folder / 'problem.py'} TOLERANCES has no entry for dtype {dtype!r}; add "
                    f"{{{dtype!r}: {{'atol': ..., 'rtol': ...}}}}"
                )
            tol = self.module.TOLERANCES[dtype]
        return float(tol["atol"]), float(tol["rtol"])

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
        inputs: dict[str, Any] = self.module.make_inputs(shape, distribution, rng)
        self._check_inputs(inputs, shape, distribution)
        return inputs

    def _check_inputs(self, inputs: dict[str, Any], shape: dict[str, int], distribution: str) -> None:
        where = f"{self.folder / 'problem.py'} make_inputs({shape}, {distribution!r})"
        for p in self.params:
            if p.role in ("out", "size"):
                continue
            if p.name not in inputs:
                raise UserError(f"{where} returned no {p.name!r}; it must return every in/inout/scalar param")
            value = inputs[p.name]
            if p.role == "scalar":
                if np.ndim(value) != 0:
                    raise UserError(f"{where}: scalar {p.name!r} must be a single number, got {value!r}")
                continue
            want = p.dims(shape)
            if (
                not isinstance(value, np.ndarray)
                or value.dtype != np.dtype(DTYPES[p.dtype])
                or value.shape != want
                or not value.flags.c_contiguous
            ):
                got = f"{value.dtype} {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
                raise UserError(
                    f"{where}: {p.name!r} must be a C-contiguous {p.dtype} array of shape {want}, got {got}; "
                    f"use np.ascontiguousarray(..., dtype=np.{p.dtype})"
                )

    def reference(self, inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = self.module.reference(inputs, shape)
        return out

    def baseline(self, inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = self.module.baseline(inputs, shape)
        return out

    def roofline(self, shape: dict[str, int]) -> dict[str, int]:
        model: dict[str, int] = self.module.roofline(shape)
        return model

    @property
    def deterministic(self) -> bool:
        """False when the problem declares ``DETERMINISTIC = False``: its kernels may give different bits on
        identical inputs (atomics, parallel reductions), so validation does not demand bitwise repeats."""
        return bool(getattr(self.module, "DETERMINISTIC", True))

    @property
    def outputs(self) -> list[Param]:
        return [p for p in self.params if p.role in ("out", "inout")]

    def seed_source(self) -> str:
        return (self.folder / str(getattr(self.module, "SEED", "seed.c"))).read_text()

    def template_source(self) -> str | None:
        name = getattr(self.module, "TEMPLATE", None)
        return (self.folder / str(name)).read_text() if name else None

    @property
    def template_params(self) -> dict[str, list[Any]]:
        return {k: list(v) for k, v in getattr(self.module, "TEMPLATE_PARAMS", {}).items()}

    def template_allows(self, params: dict[str, Any]) -> bool:
        check = getattr(self.module, "template_allows", None)
        return bool(check(params)) if check else True

    def render_template(self, params: dict[str, Any]) -> str:
        """The template's C source with every ``{{NAME}}`` replaced by its parameter value."""
        source = self.template_source()
        if source is None:
            raise UserError(f"problem {self.name!r} has no template; add TEMPLATE to its problem.py")
        missing = sorted(set(_PLACEHOLDER.findall(source)) - set(params))
        if missing:
            raise UserError(f"template of {self.name!r} needs values for {missing}; got {sorted(params)}")
        return _PLACEHOLDER.sub(lambda m: str(params[m.group(1)]), source)

    def fingerprint(self) -> str:
        """Hash of the problem folder's files: evidence records which definition judged a candidate."""
        digest = hashlib.sha256()
        for path in sorted(self.folder.iterdir()):
            if path.is_file() and path.suffix in (".py", ".c", ".h", ".json"):
                digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        return digest.hexdigest()


def builtin_problems() -> list[str]:
    """Names of the problems shipped under ``kernels/``."""
    return sorted(p.parent.name for p in SUITE_DIR.glob("*/problem.py"))


def load_problem(name_or_path: str | Path) -> Problem:
    """Load a built-in problem by name, or a problem folder by path."""
    text = str(name_or_path)
    folder = SUITE_DIR / text
    if not (folder / "problem.py").is_file():
        folder = Path(text).expanduser()
        if folder.is_file() and folder.name == "problem.py":
            folder = folder.parent
    if not (folder / "problem.py").is_file():
        raise UnknownProblemError(
            f"unknown problem {text!r}: not one of the built-in problems {builtin_problems()} and not a "
            "folder holding a problem.py; pass a built-in name or the path of a problem folder "
            "(see docs/problems.md)"
        )
    folder = folder.resolve()
    module = _import_problem_module(folder)
    missing = [n for n in REQUIRED if not hasattr(module, n)]
    if missing:
        raise UserError(
            f"{folder / 'problem.py'} lacks {missing}; every problem.py defines {list(REQUIRED)} (see docs/problems.md)"
        )
    params = tuple(_parse_param(folder, raw) for raw in module.PARAMS)
    _check_declarations(folder, module, params)
    return Problem(name=str(module.NAME), folder=folder, module=module, params=params)


def _import_problem_module(folder: Path) -> ModuleType:
    module_name = f"kf_problem_{hashlib.sha256(str(folder).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(module_name, folder / "problem.py")
    if spec is None or spec.loader is None:
        raise UserError(f"cannot import {folder / 'problem.py'}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # a user's folder may hold anything; say where it broke
        raise UserError(f"{folder / 'problem.py'} failed to import: {error!r}") from error
    return module


def _parse_param(folder: Path, raw: dict[str, Any]) -> Param:
    where = f"{folder / 'problem.py'} PARAMS entry {raw!r}"
    if raw.get("role") not in ROLES:
        raise UserError(f"{where}: role must be one of {ROLES}")
    if raw.get("dtype") not in DTYPES:
        raise UserError(f"{where}: dtype must be one of {sorted(DTYPES)}")
    shape = tuple(raw.get("shape", ()))
    if raw["role"] in ("in", "out", "inout") and not shape:
        raise UserError(f"{where}: an array parameter needs a shape, e.g. ['rows', 'cols']")
    return Param(name=str(raw["name"]), role=str(raw["role"]), dtype=str(raw["dtype"]), shape=shape)


def _check_declarations(folder: Path, module: ModuleType, params: tuple[Param, ...]) -> None:
    """Shapes that name every size, positive weights, a tolerance for every output dtype."""
    where = folder / "problem.py"
    sizes = {p.name for p in params if p.role == "size"}
    for p in params:
        unknown = sorted(set(p.shape) - sizes)
        if unknown:
            raise UserError(
                f"{where}: array {p.name!r} is shaped by {unknown}, which are not size params {sorted(sizes)}"
            )
    benchmark = list(module.BENCHMARK_SHAPES)
    for entry in benchmark:
        if not (isinstance(entry, tuple | list) and len(entry) == 2 and float(entry[1]) > 0):
            raise UserError(f"{where}: BENCHMARK_SHAPES entry {entry!r} must be a (shape, weight) pair, weight > 0")
    for label, shapes in (
        ("VALIDATION_SHAPES", list(module.VALIDATION_SHAPES)),
        ("BENCHMARK_SHAPES", [s for s, _ in benchmark]),
    ):
        if not shapes:
            raise UserError(f"{where}: {label} is empty; give at least one shape")
        for shape in shapes:
            if set(shape) != sizes or any(not isinstance(v, int) or v < 1 for v in shape.values()):
                raise UserError(f"{where}: {label} entry {shape!r} must give each of {sorted(sizes)} a positive int")
    missing = sorted({p.dtype for p in params if p.role in ("out", "inout")} - set(module.TOLERANCES))
    if missing:
        raise UserError(
            f"{where}: TOLERANCES has no entry for output dtype(s) {missing}; "
            "add {dtype: {'atol': ..., 'rtol': ...}}"
        )
