"""A CUDA kernel's launch configuration as a function of the problem's shape, and its check against the arch.

Every CUDA source -- seed, rendered template, LLM candidate -- carries exactly one line such as::

    // kf-launch: grid=(cdiv(rows, 4), 1, 1) block=(128, 1, 1) shared=0

``grid`` and ``block`` are up to three expressions (missing ones are 1), ``shared`` the bytes of dynamic
shared memory (default 0). An expression uses integer literals, the problem's size names, ``+ - * // %``,
parentheses and the functions ``min``, ``max`` and ``cdiv`` (ceiling division). It is parsed with
:mod:`ast` and evaluated by walking a whitelist of node types -- never ``eval``: the line comes from the
candidate, and attribute access, other calls, comparisons or names other than sizes are refused with the
offending text.

The launch travels with the kernel (the artifact keeps the line's text), so the runtime needs nothing but
the shape to launch it, and a proposer can change the launch with the code that depends on it.
:func:`check_limits` holds a resolved launch to the architecture's limits (engine/harness/cuda/arch.py) and,
given the ptxas report, to its register file: the compile step checks every validation and benchmark shape,
so a launch that cannot run is a compile error naming the shape and the limit, not a failure on the GPU.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from engine.errors import UserError
from engine.harness.cuda.arch import limits_of
from engine.harness.cuda.ptxas import PtxasReport

MARK = "kf-launch:"
EXAMPLE = "// kf-launch: grid=(cdiv(rows, 4), 1, 1) block=(128, 1, 1) shared=0"
_LINE = re.compile(r"^[ \t]*//[ \t]*kf-launch:(?P<spec>[^\n]*)$", re.MULTILINE)
_KEY = re.compile(r"(?<![\w.])(?P<key>[A-Za-z_]\w*)\s*=(?!=)")
_KEYS = ("grid", "block", "shared")
_FUNCTIONS: dict[str, Callable[..., int]] = {"min": min, "max": max, "cdiv": lambda a, b: -(-a // b)}
_ARITY = {"cdiv": (2, 2), "min": (2, 8), "max": (2, 8)}
_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}
_GRAMMAR = "integers, size names, + - * // %, parentheses, min(…), max(…) and cdiv(a, b)"
# A launch line longer than this is not a launch configuration (and would only slow the parser down).
_MAX_SPEC = 1000
# Registers are handed to a block a warp at a time, in units of 256 (8 per thread): a 65-register kernel
# takes 72 per thread. Without the rounding a 1024-thread block of 65 registers would look like it fits.
_REGISTER_UNIT_PER_WARP = 256
_WARP = 32


class LaunchError(UserError):
    """A missing, malformed or unresolvable ``// kf-launch:`` line; the message says what and how to fix it."""


class Launch(BaseModel):
    """One resolved launch: what ``cuLaunchKernel`` is called with for one shape."""

    model_config = ConfigDict(frozen=True)

    grid: tuple[int, int, int]
    """Blocks in x, y, z."""
    block: tuple[int, int, int]
    """Threads per block in x, y, z."""
    shared_bytes: int = 0
    """Dynamic shared memory per block, in bytes (above 48 KiB the kernel must opt in before launching)."""

    @property
    def threads_per_block(self) -> int:
        return math.prod(self.block)


@dataclass(frozen=True)
class LaunchSpec:
    """A parsed ``kf-launch`` line: expressions over the size names, resolved per shape by :meth:`resolve`."""

    text: str
    """The line's text after ``kf-launch:``, as written (what the artifact stores)."""
    grid: tuple[ast.expr, ...] = field(compare=False, repr=False)
    block: tuple[ast.expr, ...] = field(compare=False, repr=False)
    shared: ast.expr = field(compare=False, repr=False)
    names: frozenset[str] = field(compare=False, repr=False)
    """The size names the expressions use."""

    def resolve(self, shape: Mapping[str, int]) -> Launch:
        """The launch for ``shape``; a name the shape lacks or a division by zero is a LaunchError."""
        grid = [*(_evaluate(e, shape, self.text) for e in self.grid), 1, 1]
        block = [*(_evaluate(e, shape, self.text) for e in self.block), 1, 1]
        return Launch(
            grid=(grid[0], grid[1], grid[2]),
            block=(block[0], block[1], block[2]),
            shared_bytes=_evaluate(self.shared, shape, self.text),
        )


def parse_launch(source: str, sizes: Collection[str] | None = None) -> LaunchSpec:
    """The launch configuration of a CUDA source: its one ``// kf-launch:`` line, parsed. With ``sizes`` (the
    problem's size names), a name outside them is refused here rather than when a shape is resolved."""
    lines = list(_LINE.finditer(source))
    if not lines:
        raise LaunchError(
            f"the source has no launch line; add one line such as `{EXAMPLE}`, whose expressions (over the "
            f"size names{_naming(sizes)}) give the grid, the block and the dynamic shared memory for any shape"
        )
    if len(lines) > 1:
        numbers = [source.count("\n", 0, m.start()) + 1 for m in lines]
        raise LaunchError(f"the source has {len(lines)} `// kf-launch:` lines (lines {numbers}); keep exactly one")
    text = lines[0].group("spec").strip()
    if len(text) > _MAX_SPEC:
        raise LaunchError(f"the `// kf-launch:` line is {len(text)} characters long; keep it under {_MAX_SPEC}")
    values = _fields(text)
    names: set[str] = set()
    grid = _dims("grid", values["grid"], text, names)
    block = _dims("block", values["block"], text, names)
    shared = _expression("shared", values.get("shared", "0"), text, names)
    if sizes is not None:
        unknown = sorted(names - set(sizes))
        if unknown:
            raise LaunchError(
                f"the launch line `{text}` uses {unknown}, which are not size names{_naming(sizes)}; write its "
                "expressions over the problem's sizes"
            )
    return LaunchSpec(text=text, grid=grid, block=block, shared=shared, names=frozenset(names))


def check_limits(launch: Launch, arch: str, ptxas: PtxasReport | None = None) -> str | None:
    """Why ``launch`` cannot run on ``arch`` -- the first limit it breaks, in words, with the limit's value --
    or None. With the kernel's ptxas report, its registers and static shared memory count too."""
    limits = limits_of(arch)
    if min(launch.grid) < 1 or min(launch.block) < 1:
        return f"grid {launch.grid} and block {launch.block} must be at least 1 in every dimension"
    if launch.shared_bytes < 0:
        return f"dynamic shared memory is {launch.shared_bytes} bytes, a negative size"
    for axis, size, most in zip("xyz", launch.block, limits.max_block, strict=True):
        if size > most:
            return f"block {launch.block} has {size} threads in {axis}; {arch} allows at most {most}"
    if launch.threads_per_block > limits.max_threads_per_block:
        return (
            f"block {launch.block} has {launch.threads_per_block} threads; {arch} allows at most "
            f"{limits.max_threads_per_block} threads per block"
        )
    for axis, size, most in zip("xyz", launch.grid, limits.max_grid, strict=True):
        if size > most:
            return f"grid {launch.grid} has {size} blocks in {axis}; {arch} allows at most {most}"
    static = ptxas.shared_bytes if ptxas is not None else 0
    if static + launch.shared_bytes > limits.max_shared_bytes:
        return (
            f"the block uses {static + launch.shared_bytes} bytes of shared memory ({launch.shared_bytes} dynamic"
            f" + {static} static); {arch} allows at most {limits.max_shared_bytes} bytes per block"
        )
    if ptxas is not None and ptxas.registers > 0:
        per_warp = -(-ptxas.registers * _WARP // _REGISTER_UNIT_PER_WARP) * _REGISTER_UNIT_PER_WARP
        needed = per_warp * -(-launch.threads_per_block // _WARP)
        if needed > limits.registers_per_block:
            return (
                f"{launch.threads_per_block} threads of {ptxas.registers} registers take {needed} registers; "
                f"{arch} has {limits.registers_per_block} per block (bound the registers with "
                "__launch_bounds__ or launch fewer threads)"
            )
    return None


def _naming(sizes: Collection[str] | None) -> str:
    return f" {sorted(sizes)}" if sizes is not None else ""


def _fields(text: str) -> dict[str, str]:
    """``grid=… block=… shared=…`` split into its fields (an expression never holds a lone ``=``)."""
    keys = list(_KEY.finditer(text))
    if not keys or text[: keys[0].start()].strip():
        raise LaunchError(f"the launch line `{text}` must read like `{EXAMPLE[3:]}`")
    values: dict[str, str] = {}
    for key, after in zip(keys, [*keys[1:], None], strict=True):
        name = key.group("key")
        if name not in _KEYS:
            raise LaunchError(f"the launch line `{text}` has a field {name!r}; its fields are {list(_KEYS)}")
        if name in values:
            raise LaunchError(f"the launch line `{text}` gives {name!r} twice")
        values[name] = text[key.end() : after.start() if after else len(text)].strip()
    for name in ("grid", "block"):
        if name not in values:
            raise LaunchError(f"the launch line `{text}` has no {name}=(…); it needs grid and block")
    return values


def _dims(label: str, value: str, text: str, names: set[str]) -> tuple[ast.expr, ...]:
    """Up to three expressions: a parenthesised tuple or a single expression."""
    body = _parse(label, value, text)
    elements = list(body.elts) if isinstance(body, ast.Tuple) else [body]
    if not 1 <= len(elements) <= 3:
        raise LaunchError(f"{label}={value} in `{text}` has {len(elements)} dimensions; give one to three")
    for element in elements:
        _check(element, label, text, names)
    return tuple(elements)


def _expression(label: str, value: str, text: str, names: set[str]) -> ast.expr:
    body = _parse(label, value, text)
    _check(body, label, text, names)
    return body


def _parse(label: str, value: str, text: str) -> ast.expr:
    try:
        return ast.parse(value, mode="eval").body
    except SyntaxError:
        raise LaunchError(f"{label}={value} in `{text}` is not an expression of {_GRAMMAR}") from None


def _check(node: ast.expr, label: str, text: str, names: set[str]) -> None:
    """Refuse every node outside the whitelist, naming it: the line is the candidate's and must stay arithmetic."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return
    if isinstance(node, ast.Name) and node.id not in _FUNCTIONS:
        names.add(node.id)
        return
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        _check(node.left, label, text, names)
        _check(node.right, label, text, names)
        return
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        _check(node.operand, label, text, names)
        return
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
        low, high = _ARITY[node.func.id]
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args) or not low <= len(node.args) <= high:
            raise LaunchError(
                f"`{ast.unparse(node)}` in {label} of `{text}`: {node.func.id} takes {low}"
                f"{'' if low == high else f' to {high}'} plain arguments"
            )
        for argument in node.args:
            _check(argument, label, text, names)
        return
    raise LaunchError(
        f"`{ast.unparse(node)}` in {label} of `{text}` is not allowed; a launch expression uses {_GRAMMAR}"
    )


def _evaluate(node: ast.expr, shape: Mapping[str, int], text: str) -> int:
    """The value of a checked expression for ``shape`` (only the node types :func:`_check` lets through)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in shape:
            raise LaunchError(f"the launch line `{text}` uses {node.id!r}, which the shape {dict(shape)} lacks")
        return int(shape[node.id])
    if isinstance(node, ast.UnaryOp):
        value = _evaluate(node.operand, shape, text)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, shape, text), _evaluate(node.right, shape, text)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if right == 0:
            raise LaunchError(f"`{ast.unparse(node)}` in `{text}` divides by zero for the shape {dict(shape)}")
        return left // right if isinstance(node.op, ast.FloorDiv) else left % right
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        arguments = [_evaluate(a, shape, text) for a in node.args]
        if node.func.id == "cdiv" and arguments[1] == 0:
            raise LaunchError(f"`{ast.unparse(node)}` in `{text}` divides by zero for the shape {dict(shape)}")
        return int(_FUNCTIONS[node.func.id](*arguments))
    raise LaunchError(f"`{ast.unparse(node)}` in `{text}` cannot be evaluated")  # unreachable after _check
