"""The one protocol between the judge (parent) and a sandboxed worker (engine/harness/worker.py).

Every message is a pydantic model framed on a pipe as ``<u32 length><JSON>`` followed by ``payload_bytes``
raw bytes (array contents), so the parent and the child share these models and nothing else: no dicts, no
files in the sandbox folder that the parent reads back. Commands go parent -> child on one pipe, replies
child -> parent on another; each command gets exactly one reply, so a reply the parent did not ask for
(a candidate writing to an inherited descriptor) is a protocol violation, never data.

The worker imports this module, so it imports only the standard library and pydantic. Constants both sides
rely on live here too.
"""

from __future__ import annotations

import array
import ctypes
import fcntl
import json
import os
import select
import struct
import termios
import time
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

# Benchmark inputs drift: use u of an input slot adds (u % BUMP_CYCLE + 1) * BUMP_STEP, in float32, to one
# element of its first float input, a different one for each call (drift_position; the previous use's element is
# restored first),
# so no input repeats exactly and a kernel cannot know where it changed without reading all of it: one that
# memoizes answers by buffer and recomputes only the part that can have changed finds nothing cheap to skip.
# A bfloat16 input (its bits, uint16) drifts the same way, rounded back to bfloat16 (drift_value).
BUMP_CYCLE = 8
BUMP_STEP = 1 / 64
_MASK64 = (1 << 64) - 1
# Refresh's change of each element: small enough to keep the inputs' distribution (and out of denormals), dense
# enough that no row, column or block of any input is one a call has read before. A bfloat16 holds 8 bits of
# precision, so a change of 1/1024 would round away, and a grown element shrunk by the next refresh would round
# back to what it was: its elements only grow, by 1/128 or 2/128 (one to four of its steps; a few percent over a
# probe's refreshes), so no refresh brings back a pool a call has read.
FRESH_STEP = 1 / 1024
BF16_FRESH_STEP = 1 / 128
# A bfloat16's exponent bits: all set is an infinity or a NaN, which drift and refresh leave as they are.
_BF16_EXPONENT = 0x7F80


def _is_bf16(np: Any, dtype: Any) -> bool:
    """Whether arrays of ``dtype`` hold bfloat16 bits: uint16 is that dtype's storage and no other's."""
    return bool(np.dtype(dtype) == np.uint16)


def refresh_factors(np: Any, seed: int, index: int, size: int, dtype: Any) -> Any:
    """Refresh ``seed``'s factors for the ``index``-th refreshed parameter, ``size`` elements of ``dtype``: each
    1 + FRESH_STEP or 1 - FRESH_STEP (for bfloat16 bits, float32 1 + BF16_FRESH_STEP or 1 + 2 * BF16_FRESH_STEP)
    as the top bit of a multiplicative hash of the element's index says. Every input slot's array of that
    parameter is changed by them (apply_refresh; each slot's content was already its own, so each becomes one no
    call has read); the worker applies them to its pool and the parent replays them on the inputs it checks an
    output against (the same arithmetic). ``np`` is numpy, passed in: this module imports none (and numpy.random's
    lazy imports would set off the tripwire on the worker's interpreter)."""
    salt = (seed + (index + 1) * 0x632BE59BD9B4E019) & _MASK64
    mixed = (np.arange(size, dtype=np.uint64) + np.uint64(salt)) * np.uint64(0x9E3779B97F4A7C15)
    if _is_bf16(np, dtype):
        more, less = np.float32(1 + 2 * BF16_FRESH_STEP), np.float32(1 + BF16_FRESH_STEP)
    else:
        kind = np.dtype(dtype).type
        more, less = kind(1 + FRESH_STEP), kind(1 - FRESH_STEP)
    return np.where(mixed >> np.uint64(63), more, less)


def bf16_rounded(wide: Any) -> Any:
    """float32 bit patterns (a uint32 numpy array, or an int) rounded to the nearest bfloat16, ties to even: the
    bfloat16's 16 bits (in the same type). Adding 0x7FFF plus the lowest kept bit rounds; the carry may ripple
    into the exponent, which is exactly right (up to the next binade, or to infinity). NaN is the caller's: its
    bits may carry past 32. The one rounding the worker's drift and refresh, the parent's replay of them and
    engine/problems.py's conversions all use."""
    return (wide + 0x7FFF + ((wide >> 16) & 1)) >> 16


def apply_refresh(np: Any, flat: Any, factors: Any) -> None:
    """Multiply the flat array ``flat`` by ``factors`` (refresh_factors) in place: float elements directly, the
    bits of bfloat16 ones widened to float32, multiplied and rounded back to the nearest bfloat16 (ties to even);
    an infinity or NaN is left as it is."""
    if not _is_bf16(np, flat.dtype):
        flat *= factors
        return
    wide = (flat.astype(np.uint32) << np.uint32(16)).view(np.float32) * factors
    bits = wide.view(np.uint32)
    rounded = bf16_rounded(bits).astype(np.uint16)
    special = (flat & np.uint16(_BF16_EXPONENT)) == np.uint16(_BF16_EXPONENT)
    flat[...] = np.where(special, flat, rounded)


def drift_steps(np: Any, dtype: Any) -> list[Any]:
    """What drift_value adds at each drift step to an element of ``dtype``: a float32 for float arrays (so
    float64 ones drift in float64 by a float32 step), a Python float for bfloat16 bits."""
    if _is_bf16(np, dtype):
        return [(k + 1) * BUMP_STEP for k in range(BUMP_CYCLE)]
    return [np.float32((k + 1) * BUMP_STEP) for k in range(BUMP_CYCLE)]


def drift_value(before: Any, step: Any) -> Any:
    """The drifted value of one element (a numpy scalar) by ``step`` (drift_steps): the worker's drift and the
    parent's replay of it, the same arithmetic on both sides. bfloat16 bits: the value plus the step, rounded
    to the nearest bfloat16 (ties to even); where that rounds back to the same value (a large element: its
    steps are coarser than the drift), its last bit flips instead, so every use's input is one of its own. An
    infinity or NaN stays as it is (a float one too: inf + step is inf)."""
    if before.dtype.kind != "u":
        return before + step
    bits = int(before)
    if bits & _BF16_EXPONENT == _BF16_EXPONENT:
        return before
    (value,) = struct.unpack("<f", struct.pack("<I", bits << 16))
    (wide,) = struct.unpack("<I", struct.pack("<f", value + step))
    rounded = bf16_rounded(wide) & 0xFFFF
    return before.dtype.type(rounded if rounded != bits else bits ^ 1)


def storage(dtype: str) -> str:
    """The numpy dtype an element of the declared ``dtype`` is stored as: bfloat16 as its 16 bits (uint16; numpy
    has no bfloat16), every other one as itself. The worker builds its arrays from declared dtypes with it."""
    return "uint16" if dtype == "bfloat16" else dtype


def varies(param: Any) -> bool:
    """Whether the judge varies a parameter's arrays between timed calls (``param`` a ParamSpec, or the engine's
    Param: its role, dtype and vary): every float32, float64 and bfloat16 input the problem did not mark
    ``vary: False`` (integers are left as drawn: a changed index or count could be one the problem never
    allows). The first such array drifts (drift_position); Refresh changes them all."""
    return bool(param.vary) and param.role in ("in", "inout") and param.dtype in ("float32", "float64", "bfloat16")


def varied(params: Any) -> list[Any]:
    """The parameters of ``params`` (ParamSpecs or Params, in PARAMS order) the judge varies (varies): the first
    drifts, Refresh changes them all. Empty where nothing may change (the probe then draws new pools)."""
    return [q for q in params if varies(q)]


def drift_position(key: int, call: int, size: int) -> int:
    """The element the drift of call ``call`` (from 0, counted over a shape's batches) changes, of ``size``.

    A function of the call's index and the shape's key (PreparePools.drift_key) rather than a draw in the worker:
    the parent replays it from its own count of the calls it asked for, so a fetched output whose bookkeeping
    the kernel's process rewrote (a shortened batch loop, a stale kept copy) does not match. splitmix64's mix."""
    z = (key + (call + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) % max(1, size)


def timed_call_inputs(call: int, slots: int) -> tuple[int, int]:
    """(input slot, drift step) of call ``call`` of a shape: the slots are used in turn from call 0, and use u
    of a slot drifts by step u % BUMP_CYCLE."""
    return call % slots, (call // slots) % BUMP_CYCLE


# Exit statuses of the worker (the init reports them).
EXIT_PROTOCOL = 5
EXIT_WORKER_ERROR = 6
EXIT_INTERPRETER = 7
"""The tripwire on the worker's interpreter went off: the candidate ran Python in it (engine/harness/tripwire.py)."""
EXIT_PROBLEM = 8
"""The numpy worker's problem.py code (its baseline) raised: the problem's fault, said on stderr after
:data:`PROBLEM_MARK`."""
PROBLEM_MARK = "kf-problem:"
# A frame's JSON header may not exceed this; anything larger is garbage, not a message.
MAX_HEADER_BYTES = 1 << 20
_LENGTH = struct.Struct("<I")
MessageT = TypeVar("MessageT")


class ParamSpec(BaseModel):
    """One argument of the kernel's C entry point, in ABI order."""

    name: str = Field(description="Parameter name, as in the problem's PARAMS.")
    role: Literal["in", "out", "inout", "size", "scalar"] = Field(description="How the kernel uses it.")
    dtype: str = Field(description="Element or scalar type: float32, float64, int64, int32.")
    shape: list[str] = Field(default_factory=list, description="Names of the dimensions, for arrays.")
    vary: bool = Field(
        default=True, description="Whether the judge may change this input a little between timed calls (varies)."
    )

    @property
    def is_array(self) -> bool:
        return self.role in ("in", "out", "inout")


class ArraySpec(BaseModel):
    """One array in a message's payload, in order."""

    name: str = Field(description="The parameter it belongs to.")
    dtype: str = Field(description="numpy dtype name.")
    dims: list[int] = Field(description="Array dimensions.")
    nbytes: int = Field(description="Bytes it takes in the payload.")
    offset: int | None = Field(default=None, description="Where it starts in the shared pool file, if there.")


# -------------------------------------------------------------------------------------- parent -> child


class WarmUp(BaseModel):
    """Problem code to run once before the filter goes on, so its lazy imports (numpy.random...) are done."""

    shape: dict[str, int] = Field(description="A small shape (the first validation shape).")
    distribution: str = Field(description="An input distribution.")


class Plan(BaseModel):
    """The first command: what this worker runs and how."""

    kind: Literal["plan"] = "plan"
    entry: str = Field(description="The kernel's C entry point.")
    params: list[ParamSpec] = Field(description="The entry point's parameters.")
    contender: Literal["artifact", "numpy", "none"] = Field(
        description="artifact: a library in the sandbox folder; numpy: the problem's baseline(); none: calibration."
    )
    library: str | None = Field(default=None, description="File name of the library, for artifact.")
    problem_py: str | None = Field(default=None, description="File name of the problem module (inputs, baseline).")
    shim: str | None = Field(default=None, description="File name of the fatal-signal reporter library.")
    threads: int = Field(default=1, description="Thread budget; 1 forbids creating threads at all.")
    cpus: list[int] = Field(default_factory=list, description="CPUs to pin every thread to before loading.")
    drop_to: tuple[int, int] | None = Field(default=None, description="uid, gid to drop to before loading.")
    confine: bool = Field(default=True, description="Install the seccomp filter before loading (tests may not).")
    warm_up: WarmUp | None = Field(default=None, description="Run make_inputs and baseline once before the filter.")
    pool_fd: int | None = Field(default=None, description="Read-only descriptor of the shared input-pool file.")


class Trial(BaseModel):
    """Run the candidate once on the given inputs, in the shape's guarded regions; reply with them."""

    kind: Literal["trial"] = "trial"
    id: str = Field(description="Trial id, echoed.")
    shape: dict[str, int] = Field(description="Problem sizes.")
    scalars: dict[str, float | int] = Field(default_factory=dict, description="Scalar arguments.")
    inputs: list[ArraySpec] = Field(description="Input arrays in the payload, in order.")
    guard: int = Field(description="Bytes of guard before and after each region (the pattern is in the payload).")
    shifts: dict[str, int] = Field(
        default_factory=dict,
        description="Bytes each array's data lies past a 64-byte boundary (absent: 0); applied when the shape's "
        "regions are made.",
    )
    poison: int = Field(default=0, description="Which output pre-fill: 0 NaN, 1 another NaN payload.")
    reuse_regions: bool = Field(
        default=True, description="Keep the shape's regions from the previous trial (exposes caching)."
    )
    payload_bytes: int = Field(description="Guard pattern, then the inputs, concatenated.")


class PreparePools(BaseModel):
    """Take a benchmark shape's input pool (generated once by the parent, for every contender alike) and
    build the output pool. The pool's bytes are in the shared pool file (Plan.pool_fd, read-only to the
    worker: a contender cannot change what another reads), or in the payload when there is none."""

    kind: Literal["prepare"] = "prepare"
    shape: dict[str, int] = Field(description="Problem sizes.")
    seeds: list[int] = Field(description="The seed of each input slot (Problem.make_inputs), for the evidence.")
    arrays: list[list[ArraySpec]] = Field(description="Each slot's input arrays in the payload, in order.")
    scalars: list[dict[str, float | int]] = Field(description="Each slot's scalar inputs.")
    out_slots: int = Field(description="Output slots; coprime with the input slots.")
    pool_bytes: int = Field(description="Every slot's arrays, concatenated, from the start of the pool file.")
    payload_bytes: int = Field(default=0, description="The same bytes, when there is no pool file.")
    drift_key: int = Field(default=0, ge=0, description="Key of the drift's elements (drift_position).")


class Go(BaseModel):
    """Run a batch of ``calls`` consecutive calls on the prepared pools; reply Done at once."""

    kind: Literal["go"] = "go"
    nonce: int = Field(description="Random number the reply must echo.")
    calls: int = Field(description="Calls in the batch; 0 measures the handshake alone.")
    keep: int = Field(
        default=-1,
        description="The call of the batch (from 0) whose output is copied aside at once, for Fetch(kept=True); "
        "-1: none.",
    )


class Refresh(BaseModel):
    """Put back every slot's drifted element, then change every element of the prepared pools' float inputs
    (refresh_array), so the next calls read inputs no call has read (the fresh-input probe, benchmarking.py);
    reply Prepared."""

    kind: Literal["refresh"] = "refresh"
    seed: int = Field(ge=0, description="Seed of the factors.")


class Fetch(BaseModel):
    """Send the output of the call ``back`` calls before the last one (0: the last)."""

    kind: Literal["fetch"] = "fetch"
    back: int = Field(description="How far back; below the number of output slots.")
    kept: bool = Field(default=False, description="Send the output the last batch kept (Go.keep) instead.")


class Calibrate(BaseModel):
    """Measure the machine's bandwidth and peak with numpy (no candidate code); with ``entry_shape``, instead
    time the loaded library's entry point (the judge's own copy kernel, engine/harness/stream_copy.py)."""

    kind: Literal["calibrate"] = "calibrate"
    dram_bytes: int = Field(default=256 << 20, description="Working set of the DRAM copy.")
    cache_bytes: int = Field(default=256 << 10, description="Working set of the cache copy.")
    gemm_n: int = Field(default=1024, description="Size of the sgemm.")
    entry_shape: dict[str, int] | None = Field(
        default=None, description="Time the entry point at this shape (best of a few calls) instead of numpy."
    )


class Finish(BaseModel):
    """Reply Bye and exit at once (os._exit: no exit handlers)."""

    kind: Literal["finish"] = "finish"


Command = Annotated[
    Plan | Trial | PreparePools | Go | Refresh | Fetch | Calibrate | Finish, Field(discriminator="kind")
]

# -------------------------------------------------------------------------------------- child -> parent


class Ready(BaseModel):
    """The plan is loaded (library included) and the filter installed."""

    kind: Literal["ready"] = "ready"
    confined: bool = Field(description="True when the seccomp filter is in force.")
    uid: int = Field(description="The worker's uid after any drop.")


class TrialDone(BaseModel):
    """The regions after the call: guard, data, guard for each array parameter, in ABI order."""

    kind: Literal["trial_done"] = "trial_done"
    id: str = Field(description="The trial's id.")
    regions: list[ArraySpec] = Field(description="Regions in the payload (nbytes include both guards).")
    call_ns: int = Field(description="The child's own timing of the call: a diagnostic, never the measurement.")
    payload_bytes: int = Field(description="Sum of the regions' nbytes.")


class Prepared(BaseModel):
    """The pools are built."""

    kind: Literal["prepared"] = "prepared"
    in_slots: int = Field(description="Input slots.")
    out_slots: int = Field(description="Output slots.")


class Done(BaseModel):
    """A batch finished."""

    kind: Literal["done"] = "done"
    nonce: int = Field(description="The Go's nonce.")
    child_ns: int = Field(description="The child's own clock over the batch: a diagnostic only.")


class Outputs(BaseModel):
    """The outputs of one earlier timed call, and which inputs it read."""

    kind: Literal["outputs"] = "outputs"
    seed: int = Field(description="Seed of the input slot the call read.")
    bump: int = Field(description="Drift step of that use of the slot (-1: none).")
    position: int = Field(default=0, description="Flat index of the element the drift changed in that use.")
    call: int = Field(default=-1, description="Which call of the shape it was, from 0 (-1: not counted).")
    arrays: list[ArraySpec] = Field(description="The output arrays in the payload.")
    payload_bytes: int = Field(description="Sum of the arrays' nbytes.")


class Calibration(BaseModel):
    """The machine's measured limits, bytes or flops per second."""

    kind: Literal["calibration"] = "calibration"
    dram_bps: float = Field(description="Streaming bandwidth far above the LLC (0 when the entry was timed).")
    cache_bps: float = Field(description="Bandwidth on a working set in L2 (0 when the entry was timed).")
    peak_flops: float = Field(description="float32 sgemm rate (0 when the entry was timed).")
    entry_ns: float | None = Field(default=None, description="The entry point's best time at entry_shape.")


class Failure(BaseModel):
    """The harness in the child failed on a command (not a candidate call)."""

    kind: Literal["failure"] = "failure"
    what: Literal["load", "memory", "harness"] = Field(description="What failed.")
    message: str = Field(description="The error, readable.")


class Bye(BaseModel):
    """The worker is about to exit."""

    kind: Literal["bye"] = "bye"


Reply = Annotated[
    Ready | TrialDone | Prepared | Done | Outputs | Calibration | Failure | Bye, Field(discriminator="kind")
]
_COMMANDS: TypeAdapter[Command] = TypeAdapter(Command)
_REPLIES: TypeAdapter[Reply] = TypeAdapter(Reply)


class ProtocolError(Exception):
    """Bytes on a channel that are not a well-formed message of the protocol."""


class ChannelClosed(Exception):
    """The other end closed the pipe (it exited or died)."""


class ChannelTimeout(Exception):
    """No complete message within the deadline."""


def write_message(fd: int, message: BaseModel, *payloads: bytes | memoryview) -> None:
    """Write one framed message and its payload pieces, completely (blocking)."""
    header = message.model_dump_json().encode()
    for piece in (_LENGTH.pack(len(header)) + header, *payloads):
        view = memoryview(piece).cast("B")
        while view:
            written = os.write(fd, view)
            view = view[written:]


def readable(fd: int, deadline: float) -> bool:
    """Wait until bytes (or the writer's end) can be read from ``fd``, or ``deadline`` (monotonic) passes;
    nothing is read, so a caller may wait again."""
    return bool(select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0])


def _read_exactly(fd: int, count: int, deadline: float | None, into: bytearray | None = None) -> bytearray:
    buffer = into if into is not None else bytearray(count)
    view = memoryview(buffer)
    got = 0
    while got < count:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise ChannelTimeout(f"no complete message within the deadline ({got} of {count} bytes)")
        n = os.readv(fd, [view[got:count]])
        if n == 0:
            raise ChannelClosed(f"the pipe closed after {got} of {count} bytes")
        got += n
    return buffer


def _read_header(fd: int, deadline: float | None) -> bytearray:
    (length,) = _LENGTH.unpack(_read_exactly(fd, _LENGTH.size, deadline))
    if not 0 < length <= MAX_HEADER_BYTES:
        raise ProtocolError(f"a frame announced a {length}-byte header: not a message of the protocol")
    return _read_exactly(fd, length, deadline)


def read_command(fd: int) -> tuple[Command, bytearray]:
    """The next command and its payload (the child side: blocks).

    The header's text is wiped once parsed: a candidate shares the worker's memory, and a Go's text left in a
    freed buffer would tell one that scans the heap which call of the batch is kept (``Go.keep``), so that it
    could compute that call and the last one and skip the rest."""
    buffer = _read_header(fd, None)
    # Parsed from bytes: pydantic copies a bytearray into memory of its own first, and frees that copy unwiped.
    header = bytes(buffer)
    _wipe(buffer)
    try:
        command = _COMMANDS.validate_json(header)
    except ValidationError as error:
        raise ProtocolError(f"not a command: {error.errors()[0]['msg']}") from None
    finally:
        _wipe(header)
    size = getattr(command, "payload_bytes", 0)
    return command, _read_exactly(fd, size, None) if size else bytearray()


def _wipe(data: bytes | bytearray) -> None:
    """Zero ``data`` in place, a ``bytes`` object too: it must be one nothing else refers to (never the cached
    one-byte objects, which are shared)."""
    if isinstance(data, bytearray):
        data[:] = bytes(len(data))
    elif len(data) > 1:
        # Not id(): it raises an audit event, which the worker's tripwire (engine/harness/tripwire.py) does not
        # expect; a cast of bytes to a pointer is the address of its contents.
        address = ctypes.cast(data, ctypes.c_void_p).value  # type: ignore[arg-type]  # bytes pass as char *
        assert address is not None
        ctypes.memset(address, 0, len(data))


def read_reply(fd: int, deadline: float | None, payload_limit: int = 1 << 34) -> tuple[Reply, bytearray]:
    """The next reply and its payload (the parent side), or ProtocolError / ChannelClosed / ChannelTimeout.

    ``payload_limit``: the most payload bytes the command asked for can bring back. A reply that announces more
    is refused before a byte of its payload is read: the parent would otherwise hold whatever a candidate that
    forged a reply announced (gigabytes) in its own memory before it could tell the reply was wrong."""
    header = _read_header(fd, deadline)
    try:
        reply = _REPLIES.validate_json(header)
    except ValidationError as error:
        preview = json.dumps(header[:80].decode(errors="replace"))
        raise ProtocolError(f"not a reply of the harness: {preview} ({error.errors()[0]['msg']})") from None
    size = getattr(reply, "payload_bytes", 0)
    if size < 0 or size > min(payload_limit, 1 << 34):
        raise ProtocolError(
            f"a {reply.kind} reply announced {size} payload bytes, more than the {payload_limit} expected"
        )
    return reply, _read_exactly(fd, size, deadline) if size else bytearray()


def read_message(
    fd: int, adapter: TypeAdapter[MessageT], deadline: float | None, *, what: str = "message"
) -> tuple[MessageT, bytearray]:
    """The next message of the union ``adapter`` validates, and its payload: the framing of
    :func:`read_command` and :func:`read_reply` for another set of messages (engine/harness/cuda/messages.py).
    ProtocolError / ChannelClosed / ChannelTimeout as they raise."""
    header = _read_header(fd, deadline)
    try:
        message = adapter.validate_json(header)
    except ValidationError as error:
        preview = json.dumps(header[:80].decode(errors="replace"))
        raise ProtocolError(f"not a {what} of the harness: {preview} ({error.errors()[0]['msg']})") from None
    size = getattr(message, "payload_bytes", 0)
    if size < 0 or size > (1 << 34):
        raise ProtocolError(f"a {what} announced {size} payload bytes")
    return message, _read_exactly(fd, size, deadline) if size else bytearray()


def pending(fd: int) -> bool:
    """True when bytes wait on ``fd`` (a reply nobody asked for)."""
    # Not select(): a pipe whose writer has closed is "readable" too, and a child that ends right after its
    # last reply (the CUDA child after a fault) would then look like one that wrote a second reply. FIONREAD
    # counts the bytes actually waiting, which is 0 at end of file.
    waiting = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, waiting, True)
    return waiting[0] > 0
