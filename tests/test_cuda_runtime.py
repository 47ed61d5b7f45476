"""The CUDA judge on the CPU: every rule that needs no GPU, and the whole judge -- sandboxed child, guarded
regions, launches, event-timed rounds, verdicts -- against a CPU double of the driver API
(tests/cuda_driver_double.py). What only a real GPU can show is in tests/test_cuda_gpu.py.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import json
import logging
import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import TypeAdapter

from activities.worker import serveable_targets
from engine.hardware import GpuFingerprint
from engine.harness import protocol as p
from engine.harness.benchmarking import Reference
from engine.harness.cuda import messages as m
from engine.harness.cuda.arguments import KernelArguments, argument_ctype
from engine.harness.cuda.bandwidth import cached_bandwidth, copy_bytes, hbm_roofline_ns, remember
from engine.harness.cuda.child import fault_verdict
from engine.harness.cuda.fingerprint import (
    cuda_version_text,
    device_name,
    driver_release,
    gpu_key,
    theoretical_bandwidth_gbs,
    uuid_text,
)
from engine.harness.cuda.inputs import InputCache, input_sets, refreshed_sets
from engine.harness.cuda.judge import benchmark_cuda, validate_cuda
from engine.harness.cuda.layout import (
    ALIGNMENT,
    GPU_GUARD_BYTES,
    RegionLayout,
    guarded_image,
    poison_fill,
    region_layout,
)
from engine.harness.cuda.lease import GpuBusy, GpuLease, lock_path
from engine.harness.cuda.timing import (
    MAX_INPUT_SETS,
    MAX_ROUNDS_PER_BATCH,
    MIN_FLUSH_BYTES,
    UNKNOWN_L2_FLUSH_BYTES,
    RotationError,
    l2_flush_bytes,
    rotation_plan,
    round_order,
    rounds_per_batch,
)
from engine.harness.verdicts import BenchmarkReport, ValidationReport, Verdict
from engine.problems import bf16_to_float32, load_problem
from engine.search.spec import build_queue, compile_queue
from engine.targets import Gpu, GpuScan, scan_gpus

ROOT = Path(__file__).resolve().parent.parent
DOUBLE = "cuda_driver_double"  # tests/ is on the import path of the tests and of the child they start
MIB = 1 << 20


def params(*specs: tuple[str, str, str, list[str]]) -> list[p.ParamSpec]:
    return [p.ParamSpec.model_validate({"name": n, "role": r, "dtype": d, "shape": s}) for n, r, d, s in specs]


# -- guarded regions and poison ------------------------------------------------------------------------------


def test_a_region_is_guard_data_guard_with_the_data_aligned() -> None:
    layout = region_layout([3, 5], "float32")
    assert (layout.nbytes, layout.guard) == (60, GPU_GUARD_BYTES)
    assert layout.data_offset == GPU_GUARD_BYTES and layout.data_offset % ALIGNMENT == 0
    assert layout.after_offset == GPU_GUARD_BYTES + 60  # the first byte past the end is guarded
    assert layout.total == 2 * GPU_GUARD_BYTES + 60
    assert region_layout([7], "bfloat16", 256).nbytes == 14
    with pytest.raises(ValueError, match="multiple of 256"):
        RegionLayout(nbytes=4, guard=100)


def test_the_guarded_image_puts_the_pattern_on_both_sides() -> None:
    layout = region_layout([4], "float32", 256)
    guard = np.random.default_rng(1).integers(0, 256, 256, dtype=np.uint8).tobytes()
    data = np.arange(4, dtype=np.float32)
    image = guarded_image(layout, guard, data)
    assert image.size == layout.total
    assert image[:256].tobytes() == guard and image[256 + 16 :].tobytes() == guard
    assert np.array_equal(image[256:272].view(np.float32), data)
    with pytest.raises(ValueError, match="the data has 12 bytes"):
        guarded_image(layout, guard, data[:3])


def test_output_poison_is_nan_with_two_payloads_per_float_type() -> None:
    for dtype, width in (("float32", 4), ("float64", 8)):
        first, second = poison_fill(dtype, 3, 0), poison_fill(dtype, 3, 1)
        assert first.itemsize == width and first.size == 3
        assert np.isnan(first.view(f"f{width}")).all() and np.isnan(second.view(f"f{width}")).all()
        assert first.tobytes() != second.tobytes()
    bf16 = [poison_fill("bfloat16", 5, v) for v in (0, 1)]
    assert all(b.dtype == np.uint16 for b in bf16)
    assert bf16[0][0] == 0x7FC0 and bf16[1][0] == 0x7FDE
    assert all(np.isnan(bf16_to_float32(b)).all() for b in bf16)  # NaN in bfloat16, not just some bits
    ints = poison_fill("int32", 2, 0)
    assert ints.nbytes == 8 and set(ints.tolist()) == {0xA5}


# -- the launch's parameter block ----------------------------------------------------------------------------


def test_arguments_are_packed_with_the_kernels_c_types() -> None:
    abi = params(
        ("x", "in", "bfloat16", ["n"]),
        ("y", "out", "float32", ["n"]),
        ("eps", "scalar", "float32", []),
        ("scale", "scalar", "float64", []),
        ("steps", "scalar", "int32", []),
        ("bias", "scalar", "bfloat16", []),
        ("n", "size", "int32", []),  # a size is `long long` whatever PARAMS says
    )
    args = KernelArguments(
        abi,
        {"x": 0x7000_0000_0000, "y": 0x7000_0010_0000},
        {"n": 3},
        {"eps": 0.5, "scale": 2.0, "steps": 7, "bias": 0x3F80},
    )
    assert args.sizes() == [8, 8, 4, 8, 4, 2, 8]
    block = [int(address or 0) for address in (ctypes.c_void_p * 7).from_address(args.address)]
    assert ctypes.c_uint64.from_address(block[0]).value == 0x7000_0000_0000
    assert ctypes.c_uint64.from_address(block[1]).value == 0x7000_0010_0000
    assert ctypes.c_float.from_address(block[2]).value == 0.5
    assert ctypes.c_double.from_address(block[3]).value == 2.0
    assert ctypes.c_int32.from_address(block[4]).value == 7
    assert ctypes.c_uint16.from_address(block[5]).value == 0x3F80
    assert ctypes.c_longlong.from_address(block[6]).value == 3
    args.set_pointer(1, 0x7000_0020_0000)  # the next output slot, in place
    assert ctypes.c_uint64.from_address(block[1]).value == 0x7000_0020_0000
    with pytest.raises(TypeError):
        args.set_pointer(2, 1)


def test_missing_or_unpassable_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="no device pointer for array parameter 'x'"):
        KernelArguments(params(("x", "in", "float32", ["n"])), {}, {"n": 1}, {})
    with pytest.raises(ValueError, match="no value for size parameter 'n'"):
        KernelArguments(params(("n", "size", "int64", [])), {}, {}, {})
    bad = p.ParamSpec(name="flag", role="scalar", dtype="bool")
    with pytest.raises(ValueError, match="cannot take"):
        argument_ctype(bad)


# -- timing rules --------------------------------------------------------------------------------------------


def test_the_l2_flush_writes_at_least_twice_the_l2() -> None:
    assert l2_flush_bytes(50 * MIB) == 100 * MIB  # H100
    assert l2_flush_bytes(60 * MIB + 1) == 121 * MIB  # rounded up to a MiB, never under twice
    assert l2_flush_bytes(256 << 10) == MIN_FLUSH_BYTES
    assert l2_flush_bytes(0) == UNKNOWN_L2_FLUSH_BYTES
    for l2 in (1, 40 * MIB, 126 * MIB):
        assert l2_flush_bytes(l2) >= 2 * l2


def test_rotating_buffers_are_coprime_and_fit_in_memory() -> None:
    roomy = rotation_plan(MIB, MIB, contenders=3, free_bytes=80 << 30, flush_bytes=100 * MIB)
    assert roomy.in_slots == MAX_INPUT_SETS and roomy.out_slots == MAX_INPUT_SETS + 1 and roomy.coprime
    tight = rotation_plan(1 << 30, 1 << 30, contenders=2, free_bytes=16 << 30, flush_bytes=100 * MIB)
    used = tight.in_slots * (1 << 30) + 2 * tight.out_slots * (1 << 30) + 100 * MIB
    assert tight.in_slots < MAX_INPUT_SETS and used <= 8 << 30 and tight.coprime
    with pytest.raises(RotationError, match="GPU has"):
        rotation_plan(4 << 30, 4 << 30, contenders=2, free_bytes=8 << 30, flush_bytes=100 * MIB)


def test_large_input_sets_are_fewer_but_never_under_two() -> None:
    big = rotation_plan(256 * MIB, 256 * MIB, contenders=3, free_bytes=140 << 30, flush_bytes=120 * MIB)
    assert (big.in_slots, big.out_slots) == (2, 3)
    huge = rotation_plan(1 << 30, 1 << 30, contenders=2, free_bytes=140 << 30, flush_bytes=120 * MIB)
    assert huge.in_slots == 2


def test_drawn_inputs_are_kept_least_recently_used_first_out(tmp_path: Path) -> None:
    folder = problem_folder(tmp_path, "kept", "float32")
    problem = load_problem(folder)
    shape = {"n": 1000}  # 4000 bytes of x per draw
    cache = InputCache(capacity_bytes=10_000)
    first = cache.inputs(problem, shape, "normal", 1)
    assert cache.inputs(problem, shape, "normal", 1) is first  # kept
    cache.inputs(problem, shape, "normal", 2)
    cache.inputs(problem, shape, "normal", 1)  # 1 is now the most recent
    cache.inputs(problem, shape, "normal", 3)  # over capacity: 2 goes
    assert cache.inputs(problem, shape, "normal", 1) is first
    again = cache.inputs(problem, shape, "normal", 2)
    assert np.array_equal(again["x"], problem.make_inputs(shape, "normal", 2)["x"])
    sets = input_sets(problem, shape, "uniform", [7, 8], cache)
    assert [s[0].name for s in sets.arrays] == ["x", "x"] and sets.scalars == [{"alpha": 1.5}, {"alpha": 1.5}]
    assert sum(len(piece) for piece in sets.pieces) == 8000 and set(sets.kept) == {7, 8}


def test_the_fresh_probes_sets_change_every_varied_element_and_leave_the_kept_ones_alone(tmp_path: Path) -> None:
    problem = load_problem(problem_folder(tmp_path, "fresh", "float32"))
    sets = input_sets(problem, {"n": 1000}, "normal", [7, 8], InputCache(0))
    before = {seed: inputs["x"].copy() for seed, inputs in sets.kept.items()}
    fresh = refreshed_sets(problem, sets, [101, 102, 103], refresh=5)
    assert list(fresh.kept) == [101, 102, 103] and sum(len(piece) for piece in fresh.pieces) == 3 * 4000
    for label, base in zip([101, 102, 103], [7, 8, 7], strict=True):
        x = fresh.kept[label]["x"]
        # Every element is another value than any call read (x has no zeros), and what the kernel reads is what
        # the output check computes the reference of.
        assert x.dtype == np.float32 and np.all(x != before[base]) and np.allclose(x, before[base], rtol=2e-3)
        assert fresh.kept[label]["alpha"] == sets.kept[base]["alpha"]
    assert all(np.array_equal(sets.kept[seed]["x"], before[seed]) for seed in before)
    again = refreshed_sets(problem, sets, [101], refresh=6)
    assert not np.array_equal(again.kept[101]["x"], fresh.kept[101]["x"])  # each probe's refresh its own


def test_rounds_rotate_every_contender_through_every_position() -> None:
    orders = [round_order([0, 1, 2], r) for r in range(3)]
    assert orders == [[0, 1, 2], [1, 2, 0], [2, 0, 1]]
    for position in range(3):
        assert sorted(order[position] for order in orders) == [0, 1, 2]
    assert round_order([], 5) == []


def test_a_batch_of_rounds_lasts_tens_of_milliseconds() -> None:
    assert rounds_per_batch(1e6) == 50
    assert rounds_per_batch(1.0) == MAX_ROUNDS_PER_BATCH
    assert rounds_per_batch(1e9) == 1


# -- fingerprint, bandwidth, lease ---------------------------------------------------------------------------


def test_fingerprint_parsing() -> None:
    assert cuda_version_text(12080) == "12.8" and cuda_version_text(13000) == "13.0"
    assert cuda_version_text(0) == "unknown"
    proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Thu Jan  9 2025\nGCC version: gcc"
    open_module = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.51.03  Release Build  (dvs-builder@U16)"
    assert driver_release(proprietary) == "570.86.15"
    assert driver_release(open_module) == "575.51.03"
    assert driver_release("no driver here") == ""
    assert device_name(b"NVIDIA H200\0\0garbage") == "NVIDIA H200"
    assert uuid_text(bytes(range(16))) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert uuid_text(b"short") == ""
    h200 = GpuFingerprint(
        name="NVIDIA H200",
        compute_capability="9.0",
        sm_count=132,
        cuda_version="13.0",
        driver_version="580.65.06",
        memory_bytes=141 << 30,
        l2_bytes=60 * MIB,
        memory_clock_khz=3_201_000,
        memory_bus_bits=6144,
    )
    assert gpu_key(h200) == gpu_key(h200.model_copy(update={"uuid": "GPU-another-one-of-the-same-kind"}))
    assert gpu_key(h200) != gpu_key(h200.model_copy(update={"driver_version": "580.82.07"}))
    peak = theoretical_bandwidth_gbs(h200)
    assert peak is not None and 4900 < peak < 4930  # 4.9 TB/s on the spec sheet
    assert theoretical_bandwidth_gbs(h200.model_copy(update={"memory_bus_bits": None})) is None


def test_the_bandwidth_copy_and_roofline_rules(tmp_path: Path) -> None:
    assert copy_bytes(50 * MIB, 80 << 30) == 1 << 30
    assert copy_bytes(200 * MIB, 80 << 30) == 1600 * MIB  # at least 8 L2s
    assert copy_bytes(50 * MIB, 2 << 30) == 256 * MIB  # a quarter of free memory, split in two
    assert hbm_roofline_ns({"bytes": 4_000_000}, 4000.0) == 1000.0
    with pytest.raises(ValueError):
        hbm_roofline_ns({"bytes": 1}, 0.0)
    gpu = GpuFingerprint(
        name="x", compute_capability="9.0", sm_count=1, cuda_version="13.0", memory_bytes=1, l2_bytes=1
    )
    cache = tmp_path / "cache"
    measured = m.BandwidthMeasured(nbytes=1 << 30, best_ns=500_000.0, bytes_per_s=2 * (1 << 30) / 500e-6)
    remembered = remember(gpu, measured, cache)
    again = cached_bandwidth(gpu, cache)
    assert again is not None and again.bandwidth_gbs == remembered.bandwidth_gbs == pytest.approx(4294.97, rel=1e-3)


def test_the_gpu_lease_is_exclusive_for_timing_and_shared_for_validation(tmp_path: Path) -> None:
    first = GpuLease(exclusive=False, cache_dir=tmp_path, device="7").acquire()
    second = GpuLease(exclusive=False, cache_dir=tmp_path, device="7").acquire()  # validations side by side
    with pytest.raises(GpuBusy, match="GPU 7 stayed busy"):
        GpuLease(exclusive=True, cache_dir=tmp_path, device="7", wait_s=0.2).acquire()
    first.release()
    second.release()
    with GpuLease(exclusive=True, cache_dir=tmp_path, device="7", wait_s=0.2):
        with pytest.raises(GpuBusy):
            GpuLease(exclusive=False, cache_dir=tmp_path, device="7", wait_s=0.2).acquire()
    assert lock_path("GPU-ab/cd", tmp_path).name == "gpu-GPU-ab_cd.lock"


# -- verdicts of CUDA faults ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "call", "verdict"),
    [
        ("CUDA_ERROR_ILLEGAL_ADDRESS", "cuStreamSynchronize", Verdict.crash),
        ("CUDA_ERROR_LAUNCH_FAILED", "cuStreamSynchronize", Verdict.crash),
        ("CUDA_ERROR_MISALIGNED_ADDRESS", "cuStreamSynchronize", Verdict.crash),
        ("CUDA_ERROR_LAUNCH_TIMEOUT", "cuStreamSynchronize", Verdict.timeout),
        ("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "cuLaunchKernel", Verdict.resource_limit),
        (
            "CUDA_ERROR_INVALID_VALUE",
            "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES=300000)",
            Verdict.resource_limit,
        ),
        ("CUDA_ERROR_INVALID_VALUE", "cuMemcpyHtoDAsync", Verdict.harness_error),
        ("CUDA_ERROR_OUT_OF_MEMORY", "cuMemAlloc(1 bytes)", Verdict.harness_error),
        ("CUDA_ERROR_NO_BINARY_FOR_GPU", "cuModuleLoadData", Verdict.harness_error),
    ],
)
def test_a_cuda_fault_is_the_kernels_verdict_only_when_the_kernel_caused_it(
    name: str, call: str, verdict: Verdict
) -> None:
    fault = m.Fault(during="sync", call=call, code=1, name=name, message="...")
    assert fault_verdict(fault) == verdict


def test_messages_round_trip() -> None:
    trial = p.Trial(id="v0", shape={"n": 4}, inputs=[], guard=256, payload_bytes=256)
    wrapped = m.CudaTrial(
        contender=0, launch=m.LaunchDims(grid=(1, 1, 1), block=(32, 1, 1)), trial=trial, payload_bytes=256
    )
    assert m.COMMANDS.validate_json(wrapped.model_dump_json()) == wrapped
    fault = m.Fault(during="sync", call="cuStreamSynchronize", code=700, name="CUDA_ERROR_ILLEGAL_ADDRESS", message="x")
    assert m.REPLIES.validate_json(fault.model_dump_json()) == fault
    done = p.TrialDone(id="v0", regions=[], call_ns=1, payload_bytes=0)
    assert TypeAdapter(m.Reply).validate_json(done.model_dump_json()) == done


# -- the worker: GPUs, queues --------------------------------------------------------------------------------


def test_without_a_gpu_the_worker_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="activities.worker")
    targets = serveable_targets(GpuScan(reason="no NVIDIA driver library on this machine"))
    assert len(targets) == 1 and targets[0].startswith("cpu-")
    lines = [r.getMessage() for r in caplog.records if r.name == "activities.worker"]
    assert len(lines) == 1 and lines[0].startswith("no GPU: no NVIDIA driver library")


def test_a_gpu_worker_serves_its_gpus_target(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="activities.worker")
    h200 = Gpu(ordinal=0, name="NVIDIA H200", compute_capability=(9, 0))
    assert serveable_targets(GpuScan(gpus=[h200]))[1:] == ["cuda-sm90"]
    assert not caplog.records
    serveable_targets(GpuScan(gpus=[h200, Gpu(ordinal=1, name="NVIDIA H200", compute_capability=(9, 0))]))
    assert "kf worker --gpu N" in caplog.records[-1].getMessage()


def test_gpu_detection_never_raises() -> None:
    scan = scan_gpus()
    assert scan.gpus or scan.reason  # here: a reason (no driver); on a GPU machine: the devices


def test_cuda_sources_compile_on_the_build_queue() -> None:
    assert compile_queue("kf", "cuda-sm90") == build_queue("kf") == "kf-build"
    assert compile_queue("kf", "cpu-x86_64-avx2") == "kf-cpu-x86_64-avx2"


# -- bench/cuda.py without a GPU -----------------------------------------------------------------------------


@pytest.mark.skipif(bool(scan_gpus().gpus), reason="this machine has a GPU: the benchmark would run")
def test_the_cuda_benchmark_skips_without_a_gpu() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cuda.py"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)
    # The reason is this machine's, not an import accident (run as a script, bench/cuda.py is itself `cuda`).
    assert document == {"skipped": f"no GPU: {scan_gpus().reason}"}
    plain = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cuda.py")], capture_output=True, text=True, timeout=120, check=False
    )
    assert plain.returncode == 0 and "skipped" in plain.stdout


def test_the_cuda_benchmark_refuses_an_unknown_problem_before_it_looks_for_a_gpu() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cuda.py"), "--problems", "softmax,matmul"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    # matmul has no CUDA kernel: named, not skipped as a machine without a GPU would be.
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert "no CUDA problem named 'matmul'" in run.stderr and "softmax" in run.stderr, run.stderr


# -- the whole judge against the CPU double of the driver ---------------------------------------------------

PROBLEM = """
    import numpy as np

    NAME = "{name}"
    CUDA_ENTRY = "scale"
    PARAMS = [
        {{"name": "x", "role": "in", "dtype": "float32", "shape": ["n"]}},
        {{"name": "y", "role": "out", "dtype": "{out}", "shape": ["n"]}},
        {{"name": "alpha", "role": "scalar", "dtype": "float32"}},
        {{"name": "n", "role": "size", "dtype": "int64"}},
    ]
    VALIDATION_SHAPES = [{{"n": 1000}}, {{"n": 4099}}]
    BENCHMARK_SHAPES = [({{"n": 1 << 15}}, 1.0), ({{"n": 1 << 12}}, 0.5)]
    TOLERANCES = {{"float32": {{"atol": 1e-6, "rtol": 1e-6}}, "bfloat16": {{"atol": 1e-2, "rtol": 1e-2}}}}
    DISTRIBUTIONS = ["normal", "uniform"]

    def make_inputs(shape, distribution, rng):
        n = shape["n"]
        x = rng.standard_normal(n) if distribution == "normal" else rng.uniform(-1, 1, n)
        return {{"x": np.ascontiguousarray(x, dtype=np.float32), "alpha": 1.5}}

    def reference(inputs, shape):
        return {{"y": inputs["x"].astype(np.float64) * inputs["alpha"]}}

    def baseline(inputs, shape):
        return {{"y": inputs["x"] * np.float32(inputs["alpha"])}}

    def cuda_baseline(cp, inputs, shape):
        {library}

    def roofline(shape):
        return {{"bytes": 4 * shape["n"] + {width} * shape["n"], "flops": shape["n"]}}
"""


LIBRARY = 'return {"y": inputs["x"] * cp.float32(inputs["alpha"])}'


def problem_folder(root: Path, name: str, out: str, library: str = LIBRARY) -> Path:
    folder = root / name
    folder.mkdir()
    width = 2 if out == "bfloat16" else 4
    text = PROBLEM.format(name=name, out=out, width=width, library=library)
    (folder / "problem.py").write_text(textwrap.dedent(text))
    (folder / "seed.cu").write_text("// kf-launch: grid=(cdiv(n, 256), 1, 1) block=(256, 1, 1)\n")
    return folder


def install_double_artifact(problem_dir: Path, behaviour: str, cache: Path, block: int = 256) -> str:
    """A CUDA artifact whose "cubin" is the double's document, written where load_cuda_artifact reads it."""
    from cuda_driver_double import double_cubin

    from engine.harness.cuda.compile import ARTIFACT_FILE, FORMAT_VERSION
    from engine.harness.cuda.ptxas import PtxasReport

    problem = load_problem(problem_dir).for_backend("cuda")
    cubin = double_cubin(problem, behaviour)
    document = {
        "format_version": FORMAT_VERSION,
        "entry": problem.entry,
        "arch": "sm_90",
        "launch": f"grid=(cdiv(n, {block}), 1, 1) block=({block}, 1, 1) shared=0",
        "ptxas": PtxasReport(arch="sm_90", registers=16).model_dump(),
        "cubin": base64.b64encode(cubin).decode(),
        "cubin_sha256": hashlib.sha256(cubin).hexdigest(),
    }
    artifact_id = hashlib.sha256(f"{problem_dir}/{behaviour}/{block}".encode()).hexdigest()
    path = cache / "artifacts" / artifact_id / ARTIFACT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    return artifact_id


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cuda-problems")
    broken = 'raise RuntimeError("CUDA headers not found for the JIT")'
    return {
        "scale": problem_folder(root, "scale", "float32"),
        "scale_bf16": problem_folder(root, "scale_bf16", "bfloat16"),
        "broken_library": problem_folder(root, "broken_library", "float32", library=broken),
    }


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cuda-cache")


def validate(folder: Path, behaviour: str, cache: Path, call_timeout_s: float = 10.0) -> ValidationReport:
    artifact = install_double_artifact(folder, behaviour, cache)
    problem = load_problem(folder)
    return validate_cuda(
        problem, artifact, seeds=1, cache_dir=cache, driver_module=DOUBLE, call_timeout_s=call_timeout_s
    )


@pytest.mark.parametrize("name", ["scale", "scale_bf16"])
def test_a_correct_kernel_validates_ok(folders: dict[str, Path], cache: Path, name: str) -> None:
    report = validate(folders[name], "correct", cache)
    assert report.verdict == Verdict.ok, report.message
    # 2 shapes × 2 distributions, and each shape's first trial twice more (repeated, perturbed).
    assert report.trials == 8


def test_a_wrong_kernel_is_incorrect(folders: dict[str, Path], cache: Path) -> None:
    report = validate(folders["scale"], "wrong", cache)
    assert report.verdict == Verdict.incorrect and report.cases[0].check == "output"
    assert "differs from the reference" in report.message


def test_a_write_past_the_end_changes_the_guard(folders: dict[str, Path], cache: Path) -> None:
    report = validate(folders["scale"], "out_of_bounds", cache)
    assert report.verdict == Verdict.incorrect
    case = report.cases[0]
    # The double writes 0x42 into the 4 bytes past the end; the guard is random, so its first byte is 0x42 one time
    # in 256 and the first changed byte is then the next one (CI once read [1]).
    assert (case.check, case.output) == ("guard_after", "y") and case.worst_index is not None
    assert 0 <= case.worst_index[0] < 4, case.worst_index


def test_a_fault_is_a_crash_and_a_hang_a_timeout_and_the_judge_goes_on(folders: dict[str, Path], cache: Path) -> None:
    crashed = validate(folders["scale"], "fault", cache)
    assert crashed.verdict == Verdict.crash, crashed.message
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in crashed.message and crashed.cases[0].check == "cuda_fault"
    hung = validate(folders["scale"], "hang", cache, call_timeout_s=2.0)
    assert hung.verdict == Verdict.timeout and "longer than 2s" in hung.message, hung.message
    refused = validate(folders["scale"], "refused", cache)
    assert refused.verdict == Verdict.resource_limit, refused.message
    again = validate(folders["scale"], "correct", cache)
    assert again.verdict == Verdict.ok, again.message


def test_a_to_a_benchmark_pairs_rounds_and_reports_the_roofline(folders: dict[str, Path], cache: Path) -> None:
    artifact = install_double_artifact(folders["scale"], "correct", cache)
    copy = install_double_artifact(folders["scale"], "correct", cache, block=128)  # another module, same work
    reports = benchmark_cuda(
        load_problem(folders["scale"]),
        artifact,
        [Reference(kind="artifact", artifact_id=copy, label="seed"), Reference(kind="numpy", label="cupy")],
        budget_s=1.0,
        cache_dir=cache,
        driver_module=DOUBLE,
    )
    seed, library = reports
    assert seed.verdict == Verdict.ok, seed.message
    assert seed.revalidated and len(seed.shapes) == 2 and all(s.samples >= 10 for s in seed.shapes)
    assert seed.ci_low <= seed.speedup <= seed.ci_high and seed.ci_low > 0
    assert seed.roofline_fraction is not None and 0 < seed.roofline_fraction < 1
    assert all(s.roofline_ns and s.roofline_ns > 0 for s in seed.shapes)
    gpu = seed.hardware.gpu
    assert gpu is not None and gpu.name == "Kernel Factory CPU double" and gpu.hbm_bandwidth_gbs
    try:
        import cupy  # noqa: F401
    except ImportError:
        # No CuPy here: the library baseline is skipped, and its report says why (never a timing of nothing).
        assert library.verdict == Verdict.harness_error and "cupy is not importable" in library.message


def timed_against_the_seed(folders: dict[str, Path], cache: Path, behaviour: str) -> BenchmarkReport:
    """The benchmark of a double kernel of ``behaviour`` on the scale problem, against its correct one."""
    kernel = install_double_artifact(folders["scale"], behaviour, cache)
    seed = install_double_artifact(folders["scale"], "correct", cache)
    (report,) = benchmark_cuda(
        load_problem(folders["scale"]),
        kernel,
        [Reference(kind="artifact", artifact_id=seed, label="seed")],
        budget_s=0.3,
        cache_dir=cache,
        driver_module=DOUBLE,
    )
    return report


def test_a_kernel_wrong_only_when_timed_is_caught(folders: dict[str, Path], cache: Path) -> None:
    report = timed_against_the_seed(folders, cache, "wrong")
    assert report.verdict == Verdict.incorrect and report.cases[0].check == "timed_output"
    assert math.isclose(report.speedup, 0.0)


def test_a_kernel_that_memoizes_by_buffer_finds_no_cheap_drift(folders: dict[str, Path], cache: Path) -> None:
    # Each use of an input set drifts an element drawn at random, so recomputing only element 0 of a
    # remembered answer is wrong on the fetched output (it was right while the drift only moved element 0).
    report = timed_against_the_seed(folders, cache, "memoizes_by_buffer")
    assert report.verdict == Verdict.incorrect and report.cases[0].check == "timed_output", report.message


def test_a_kernel_that_reuses_its_work_on_inputs_it_has_seen_is_timed_on_fresh_ones(
    folders: dict[str, Path], cache: Path
) -> None:
    # Right on every fetched output, and fast in the rounds, where each input set comes back drifted by an
    # element or two: only input sets no call has read show the work it skips.
    report = timed_against_the_seed(folders, cache, "reuses_work")
    assert report.verdict == Verdict.impossible and report.cases[0].check == "fresh_inputs", report.message
    assert "slower on input sets no call had read" in report.message, report.message
    assert "the reference, timed on the same fresh sets, ran at" in report.message, report.message
    honest = timed_against_the_seed(folders, cache, "correct")
    assert honest.verdict == Verdict.ok, honest.message


def test_the_judge_checks_a_secret_mid_run_output_and_draws_each_batchs_length(
    folders: dict[str, Path], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the shape's last call was fetched, after batches of a fixed number of rounds: a kernel counting its
    launches knew which call the judge would check, and one watching the clock could work only near the end.
    Now a batch's rounds are drawn in secret and the output of the batch that crosses a secret point of the
    budget is fetched and checked too (here the point is the start, so every shape of several batches has one)."""
    import engine.harness.cuda.judge as judge
    from engine.harness.cuda.child import CudaChild

    monkeypatch.setattr(judge, "MID_CHECK_SPAN", (0.0, 0.0))
    sent: list[Any] = []
    probes: list[Any] = []
    checked: list[int] = []
    request, check = CudaChild.request, judge.check_timed_output

    def recorded(self: CudaChild, command: Any, *args: Any, **kwargs: Any) -> Any:
        if "fresh-input probe" in kwargs.get("what", ""):  # the probe's sets, rounds and fetch, after the rounds
            probes.append(command)
        else:
            sent.append(command)
        return request(self, command, *args, **kwargs)

    def counted(*args: Any, **kwargs: Any) -> Any:
        checked.append(1)
        return check(*args, **kwargs)

    monkeypatch.setattr(CudaChild, "request", recorded)
    monkeypatch.setattr(judge, "check_timed_output", counted)
    problem = load_problem(folders["scale"])
    kernel = install_double_artifact(folders["scale"], "correct", cache)
    # How many batches a budget buys depends on the machine's load: grow it until a shape runs several.
    for budget_s in (0.5, 2.0, 6.0):
        sent.clear()
        probes.clear()
        checked.clear()
        (report,) = benchmark_cuda(
            problem,
            kernel,
            [Reference(kind="artifact", artifact_id=kernel, label="itself")],
            budget_s=budget_s,
            cache_dir=cache,
            driver_module=DOUBLE,
            revalidate=False,
        )
        assert report.verdict == Verdict.ok, report.message
        per_shape: list[list[Any]] = []
        for command in sent:
            if isinstance(command, m.CudaPrepare):
                per_shape.append([])
            elif per_shape and isinstance(command, m.CudaRounds | m.CudaFetch):
                per_shape[-1].append(command)
        assert len(per_shape) == len(problem.benchmark_shapes)
        for commands in per_shape:
            batches = sum(isinstance(c, m.CudaRounds) for c in commands)
            fetches = sum(isinstance(c, m.CudaFetch) for c in commands)
            # The last call always; one more after the first batch when the shape ran more than one.
            assert fetches == (2 if batches > 1 else 1), commands
            assert isinstance(commands[-1], m.CudaFetch)
        # Every fetched output is checked: the rounds' and each fresh-input probe's.
        all_fetches = [c for c in sent + probes if isinstance(c, m.CudaFetch)]
        assert len(checked) == len(all_fetches) and sum(isinstance(c, m.CudaFetch) for c in probes) >= 2
        lengths = {c.rounds for c in sent if isinstance(c, m.CudaRounds)}
        if any(sum(isinstance(c, m.CudaRounds) for c in commands) > 3 for commands in per_shape) and len(lengths) > 1:
            break
    else:
        pytest.fail(f"no shape ran more than 3 batches of varied lengths even at {budget_s} s: {lengths}")


def test_a_failing_reference_is_never_the_candidates_verdict(folders: dict[str, Path], cache: Path) -> None:
    good = install_double_artifact(folders["scale"], "correct", cache)
    broken = install_double_artifact(folders["scale"], "fault", cache)
    (report,) = benchmark_cuda(
        load_problem(folders["scale"]),
        good,
        [Reference(kind="artifact", artifact_id=broken, label="incumbent")],
        budget_s=0.3,
        cache_dir=cache,
        driver_module=DOUBLE,
    )
    assert report.verdict == Verdict.harness_error and "reference point 'incumbent' failed" in report.message


# -- every driver call, against cuda-python's own argument checks -------------------------------------------


@pytest.mark.skipif(bool(scan_gpus().gpus), reason="this machine has a driver: the GPU tests make these calls")
def test_every_driver_call_passes_cuda_pythons_argument_checks() -> None:
    import cuda_argument_probe as probe

    from engine.harness.cuda.bandwidth import measure_copy_bandwidth
    from engine.harness.cuda.device import DEFAULT_DRIVER, Gpu, use_driver
    from engine.harness.cuda.fingerprint import read_gpu_fingerprint
    from engine.harness.cuda.timing import EventClock

    class Call:
        def __init__(self, gpu: Gpu, function: object, launch: m.LaunchDims, arguments: KernelArguments) -> None:
            self.gpu, self.function, self.launch_dims, self.arguments = gpu, function, launch, arguments

        def prepare(self) -> None:
            self.gpu.copy(0x7000_0000, 0x7100_0000, 64)

        def launch(self) -> None:
            self.gpu.launch(self.function, self.launch_dims, self.arguments)

    use_driver("cuda_argument_probe")
    try:
        gpu = Gpu(0)
        assert read_gpu_fingerprint(gpu).compute_capability == "9.9"
        assert gpu.free_memory() == 70 << 30
        address = gpu.alloc(4096)
        host = np.zeros(256, dtype=np.float32)
        gpu.upload(address, host)
        gpu.download(host, address)
        gpu.copy(address + 1024, address, 1024)
        gpu.fill_bytes(address, 300, 4096)
        function = gpu.function(gpu.load_module(b"\x7fELF not a real cubin"), "softmax")
        launch = m.LaunchDims(grid=(4, 1, 1), block=(256, 1, 1), shared_bytes=100 << 10)
        gpu.prepare_launch(function, launch)  # above 48 KiB: the function opts in first
        abi = params(("x", "in", "float32", ["n"]), ("y", "out", "float32", ["n"]), ("n", "size", "int64", []))
        arguments = KernelArguments(abi, {"x": address, "y": address + 1024}, {"n": 256}, {})
        gpu.launch(function, launch, arguments)
        gpu.synchronize()
        clock = EventClock(gpu, 4 * MIB)
        call = Call(gpu, function, launch, arguments)
        assert clock.time([call, call]) == [250_000.0, 250_000.0]
        clock.close()
        assert measure_copy_bandwidth(gpu, MIB, 2).best_ns == 250_000.0
        assert isinstance(gpu.stream_handle(), int)
        gpu.free(address)
    finally:
        use_driver(DEFAULT_DRIVER)
    every = set(probe.ANSWERS) - {"cuGetErrorString"}  # only on an error path
    assert every <= set(probe.calls), sorted(every - set(probe.calls))


def test_the_library_baseline_is_timed_with_the_kernels(folders: dict[str, Path], cache: Path) -> None:
    artifact = install_double_artifact(folders["scale"], "correct", cache)
    seed, library = benchmark_cuda(
        load_problem(folders["scale"]),
        artifact,
        [Reference(kind="artifact", artifact_id=artifact, label="seed"), Reference(kind="numpy", label="cupy")],
        budget_s=0.6,
        cache_dir=cache,
        driver_module=DOUBLE,
        library_module="cupy_double",
        revalidate=False,
    )
    assert seed.verdict == library.verdict == Verdict.ok, (seed.message, library.message)
    assert library.reference == "cupy" and library.speedup > 0 and library.ci_low <= library.speedup <= library.ci_high
    assert [s.samples for s in library.shapes] == [s.samples for s in seed.shapes]  # the same rounds


def test_a_library_baseline_that_fails_is_left_out_with_its_reason(folders: dict[str, Path], cache: Path) -> None:
    artifact = install_double_artifact(folders["broken_library"], "correct", cache)
    seed, library = benchmark_cuda(
        load_problem(folders["broken_library"]),
        artifact,
        [Reference(kind="artifact", artifact_id=artifact, label="seed"), Reference(kind="numpy", label="cupy")],
        budget_s=0.3,
        cache_dir=cache,
        driver_module=DOUBLE,
        library_module="cupy_double",
        revalidate=False,
    )
    assert seed.verdict == Verdict.ok, seed.message
    assert library.verdict == Verdict.harness_error and "CUDA headers not found for the JIT" in library.message


def test_the_shared_memory_allowance_only_grows_across_shapes() -> None:
    """A kernel whose shapes need 97 KiB, then 56, then 97 again of dynamic shared memory: the function's
    allowance (the last value set wins) must still cover the third launch. Setting it once per size, as the
    first GPU run did, left 56 KiB set and the device refused the launch (CUDA_ERROR_INVALID_VALUE)."""
    import cuda_driver_double as double

    from engine.harness.cuda.device import Gpu
    from engine.harness.cuda.worker import Module

    gpu = Gpu.__new__(Gpu)
    gpu.d = double
    module = Module.__new__(Module)
    module.function = double._Kernel({"behaviour": "refused-never", "params": [], "problem_folder": ""})
    module.shared_allowed = 0
    for shared in (98944, 57728, 98944, 40000):
        launch = m.LaunchDims(grid=(4, 16, 1), block=(256, 1, 1), shared_bytes=shared)
        module.prepare(gpu, launch)  # type: ignore[arg-type]
        assert shared <= module.function.max_shared, (shared, module.function.max_shared)
    assert double.cuLaunchKernel(module.function, 1, 1, 1, 256, 1, 1, 200_000, None, 0, 0) == (
        double.CUresult.CUDA_ERROR_INVALID_VALUE,
    )
