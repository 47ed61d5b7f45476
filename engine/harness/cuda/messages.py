"""What the judge (parent) and the CUDA worker (engine/harness/cuda/worker.py) say to each other.

The framing, the rules and the shared models are engine/harness/protocol.py's: ``<u32 length><JSON>`` then
raw payload bytes, one reply per command, a reply nobody asked for is a protocol violation. Validation
trials reuse its :class:`~engine.harness.protocol.Trial` and :class:`~engine.harness.protocol.TrialDone`
unchanged (the CUDA child returns every guarded region, guards included, exactly as the CPU worker does), so
engine/harness/validation.py judges both backends with the same code. The messages here are what only a GPU
needs: modules to load, a launch configuration, event-timed rounds, a bandwidth measurement, and a CUDA
fault (the driver's error code, which is a verdict rather than a dead process).

The child imports this module, so it imports only the standard library, pydantic and the shared models.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter

from engine.hardware import GpuFingerprint
from engine.harness import protocol as p


class LaunchDims(BaseModel):
    """One launch configuration (engine/harness/cuda/launch.py resolves it per shape, in the parent)."""

    grid: tuple[int, int, int] = Field(description="Blocks in x, y, z.")
    block: tuple[int, int, int] = Field(description="Threads per block in x, y, z.")
    shared_bytes: int = Field(default=0, description="Dynamic shared memory per block, bytes.")


class ContenderSpec(BaseModel):
    """One contender the child serves: a kernel in a cubin of its own (its own cuModule), or the library
    baseline (the problem's ``cuda_baseline`` through CuPy)."""

    label: str = Field(description="Name in reports: candidate, seed, incumbent, library.")
    kind: Literal["module", "library"] = Field(description="module: a cubin; library: the problem's baseline.")
    entry: str = Field(default="", description="The kernel's entry point in the cubin, for a module.")
    cubin_bytes: int = Field(default=0, description="Bytes of its cubin in the plan's payload, for a module.")


# -------------------------------------------------------------------------------------- parent -> child


class CudaPlan(BaseModel):
    """The first command: the kernel ABI and the contenders; the cubins follow in the payload, in order."""

    kind: Literal["cuda_plan"] = "cuda_plan"
    params: list[p.ParamSpec] = Field(description="The kernel's parameters, in ABI order.")
    contenders: list[ContenderSpec] = Field(description="What the child runs, by index.")
    problem_folder: str | None = Field(
        default=None, description="The problem folder, loaded in the child for the library baseline only."
    )
    driver_module: str = Field(
        default="cuda.bindings.driver", description="The CUDA driver API's module (tests name a CPU double)."
    )
    library_module: str = Field(
        default="cupy", description="The module the library baseline runs with: CuPy (tests name a CPU double)."
    )
    payload_bytes: int = Field(description="The modules' cubins, concatenated.")


class CudaTrial(BaseModel):
    """One validation call of contender ``contender`` with ``launch``: the shared Trial, on the GPU."""

    kind: Literal["cuda_trial"] = "cuda_trial"
    contender: int = Field(description="Which contender runs it (a module).")
    launch: LaunchDims = Field(description="Launch configuration for the trial's shape.")
    trial: p.Trial = Field(description="The trial: shape, scalars, inputs, guard size, pre-fill.")
    payload_bytes: int = Field(description="The trial's payload: guard pattern, then the inputs.")


class CudaPrepare(BaseModel):
    """A benchmark shape: the rotating input sets (in the payload), output slots for every contender, the
    launch of each module contender, and the size of the L2 flush."""

    kind: Literal["cuda_prepare"] = "cuda_prepare"
    shape: dict[str, int] = Field(description="Problem sizes.")
    seeds: list[int] = Field(description="The seed of each input set (Problem.make_inputs), in slot order.")
    arrays: list[list[p.ArraySpec]] = Field(description="Each input set's arrays in the payload, in order.")
    scalars: list[dict[str, float | int]] = Field(description="Each input set's scalar inputs.")
    out_slots: int = Field(description="Output slots per contender; coprime with the input sets.")
    launches: list[LaunchDims | None] = Field(description="Per contender: its launch (None for the library).")
    flush_bytes: int = Field(description="Bytes the L2 flush writes before every timed call.")
    payload_bytes: int = Field(description="Every input set's arrays, concatenated.")


class CudaWarm(BaseModel):
    """Run ``calls`` calls of one contender, each flushed and event-timed like a timed call, and synchronize:
    a fault or a hang here is that contender's alone. Reply CudaTimes."""

    kind: Literal["cuda_warm"] = "cuda_warm"
    contender: int = Field(description="Which contender.")
    calls: int = Field(description="How many calls.")


class CudaRounds(BaseModel):
    """Timed rounds: in each, one call of every listed contender, in an order rotated by one each round,
    each call preceded by the L2 flush and bracketed by CUDA events. Reply CudaTimings."""

    kind: Literal["cuda_rounds"] = "cuda_rounds"
    contenders: list[int] = Field(description="The contenders, in the order of round 0.")
    rounds: int = Field(description="Rounds in this batch.")
    first_round: int = Field(description="Index of the batch's first round (sets the rotation).")


class CudaFetch(BaseModel):
    """Send the outputs of contender ``contender``'s last call. Reply Outputs (with the drift of its input)."""

    kind: Literal["cuda_fetch"] = "cuda_fetch"
    contender: int = Field(description="Which contender.")


class MeasureBandwidth(BaseModel):
    """Time device-to-device copies of ``nbytes`` (no candidate code). Reply BandwidthMeasured."""

    kind: Literal["measure_bandwidth"] = "measure_bandwidth"
    nbytes: int = Field(description="Bytes per copy (each is read once and written once).")
    repeats: int = Field(description="Copies timed; the fastest counts.")


Command = Annotated[
    CudaPlan | CudaTrial | CudaPrepare | CudaWarm | CudaRounds | CudaFetch | MeasureBandwidth | p.Finish,
    Field(discriminator="kind"),
]

# -------------------------------------------------------------------------------------- child -> parent


class CudaReady(BaseModel):
    """The context is up and every module loaded."""

    kind: Literal["cuda_ready"] = "cuda_ready"
    gpu: GpuFingerprint = Field(description="The device, as the driver describes it.")
    free_bytes: int = Field(description="Free device memory after loading, bytes.")
    library: str = Field(
        default="", description="Why the library baseline cannot run here (CuPy missing…); '' when it can."
    )
    notes: list[str] = Field(default_factory=list, description="Things the child could not set up as wished.")


class CudaTimes(BaseModel):
    """Per-call device times of a warm-up, nanoseconds by CUDA events."""

    kind: Literal["cuda_times"] = "cuda_times"
    ns: list[float] = Field(description="One per call.")


class CudaTimings(BaseModel):
    """Per-call device times of timed rounds, nanoseconds by CUDA events: ``ns[round][i]`` is the call of the
    command's ``contenders[i]`` in that round."""

    kind: Literal["cuda_timings"] = "cuda_timings"
    ns: list[list[float]] = Field(description="By round, then by contender in the command's order.")


class LibraryUnusable(BaseModel):
    """The library baseline failed in its warm-up with an error of CuPy's own (not a CUDA fault): it is left
    out of the timing, and its reports say why."""

    kind: Literal["library_unusable"] = "library_unusable"
    reason: str = Field(description="What CuPy or the problem's cuda_baseline raised.")


class BandwidthMeasured(BaseModel):
    """The device's copy bandwidth."""

    kind: Literal["bandwidth"] = "bandwidth"
    nbytes: int = Field(description="Bytes per copy.")
    best_ns: float = Field(description="The fastest copy, nanoseconds by CUDA events.")
    bytes_per_s: float = Field(description="2 * nbytes / best time: every byte is read once and written once.")


class Fault(BaseModel):
    """A CUDA call failed. After a fault in a kernel (an illegal address, a trap) the context is unusable;
    the child exits right after this reply."""

    kind: Literal["fault"] = "fault"
    during: str = Field(description="What the child was doing: load, launch, sync, copy, baseline.")
    contender: int | None = Field(default=None, description="The contender concerned, when one is.")
    call: str = Field(description="The driver call that reported it, e.g. cuStreamSynchronize.")
    code: int = Field(description="The CUresult code, e.g. 700.")
    name: str = Field(description="Its name, e.g. CUDA_ERROR_ILLEGAL_ADDRESS.")
    message: str = Field(description="The driver's description, readable.")


Reply = Annotated[
    CudaReady
    | p.TrialDone
    | p.Prepared
    | CudaTimes
    | LibraryUnusable
    | CudaTimings
    | p.Outputs
    | BandwidthMeasured
    | Fault
    | p.Failure
    | p.Bye,
    Field(discriminator="kind"),
]
COMMANDS: TypeAdapter[Command] = TypeAdapter(Command)
REPLIES: TypeAdapter[Reply] = TypeAdapter(Reply)
