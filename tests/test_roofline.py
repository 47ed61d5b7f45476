"""The roofline's denominators: which measured bandwidth a shape's bound divides by, and limits measured
another way (an older estimator, a torn file) measured again rather than trusted, and measured once when two
processes ask at the same time."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from engine.hardware import MachineLimits
from engine.harness import machine
from engine.harness.benchmarking import roofline_bandwidth_gbs, roofline_ns
from engine.harness.machine import LIMITS_ESTIMATOR, MAX_POOL_BYTES, _cached
from engine.problems import load_problem

MIB = 1 << 20


def _limits(llc: int, **fields: object) -> MachineLimits:
    base: dict[str, object] = {
        "key": "k",
        "threads": 1,
        "dram_bandwidth_gbs": 20.0,
        "cache_bandwidth_gbs": 90.0,
        "peak_gflops": 100.0,
        "llc_bytes": llc,
        "stream_bytes": MAX_POOL_BYTES,
        "estimator": LIMITS_ESTIMATOR,
    }
    return MachineLimits.model_validate(base | fields)


def test_a_pool_as_large_as_the_streaming_measurement_streams_whatever_llc_the_machine_reports() -> None:
    # A VM reporting a 480 MiB LLC, which the 256 MiB pool cap can never exceed: the pool streams from memory
    # all the same (the cache is shared with tenants the VM cannot see), so the bound uses the streaming
    # bandwidth. It once used the L2 copy's, which made every fraction read 4-16%.
    vm = _limits(llc=480 * MIB)
    assert roofline_bandwidth_gbs(vm, MAX_POOL_BYTES - 3 * MIB) == 20.0
    assert roofline_bandwidth_gbs(vm, MAX_POOL_BYTES // 2) == 20.0
    # A small pool (a tiny shape at the slot cap) may sit in some cache: the cache's bandwidth bounds it.
    assert roofline_bandwidth_gbs(vm, 16 * MIB) == 90.0
    # A pool above a small LLC streams.
    assert roofline_bandwidth_gbs(_limits(llc=8 * MIB), 16 * MIB) == 20.0


def test_the_bound_scales_with_threads_and_takes_the_slower_of_bytes_and_flops() -> None:
    problem = load_problem("softmax")
    shape = problem.benchmark_shapes[0][0]
    model = problem.roofline(shape)
    limits = _limits(llc=8 * MIB)
    one = roofline_ns(problem, shape, limits, MAX_POOL_BYTES, threads=1)
    assert one == max(model["bytes"] / 20.0, model.get("flops", 0) / 100.0)
    assert roofline_ns(problem, shape, limits, MAX_POOL_BYTES, threads=2) <= one


def test_limits_measured_another_way_or_torn_are_measured_again(tmp_path: Path) -> None:
    path = tmp_path / "limits.json"
    assert _cached(path) is None  # none yet
    current = _limits(llc=32 * MIB)
    path.write_text(current.model_dump_json())
    assert _cached(path) == current
    # A file from before the estimator was named (v1 counted a copy as three streams): measured again.
    old = current.model_dump(exclude={"estimator", "stream_bytes"})
    path.write_text(MachineLimits.model_validate(old).model_dump_json(exclude={"estimator", "stream_bytes"}))
    assert _cached(path) is None
    path.write_text(current.model_dump_json()[:40])
    assert _cached(path) is None


def test_two_processes_calibrating_one_machine_at_once_measure_it_once() -> None:
    # Two workers started together: the second waits for the first's measurement and reads it, so both hold
    # the same record (two measurements of a shared machine never agree to the last digit).
    machine_dir = tempfile.mkdtemp(prefix="kf-test-calibration-")
    env = os.environ | {"KF_MACHINE_DIR": machine_dir}
    script = "from engine.harness.machine import machine_limits; print(machine_limits(1).model_dump_json())"
    processes = [
        subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    records = [process.communicate(timeout=240)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0]
    first, second = (MachineLimits.model_validate_json(record) for record in records)
    assert first == second
    assert first.dram_bandwidth_gbs > 0


def test_the_judges_own_copies_are_timed_and_can_raise_the_dram_bandwidth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # numpy's copy (glibc's memcpy) is no ceiling: a copy that keeps four streams in flight moved a third more
    # bytes per second, and kernels then read above 100% of the roofline. Both copies run in a sandbox here.
    softmax = load_problem("softmax")
    cpu = min(os.sched_getaffinity(0))
    rates = [machine._copy_bps(softmax, streaming, 1, [cpu], tmp_path, "auto") for streaming in (True, False)]
    assert all(rate is not None and 0.5e9 < rate < 5e12 for rate in rates), rates
    # The estimate is the best of numpy's figures and the copies': a copy faster than anything numpy did is it.
    monkeypatch.setattr(machine, "_copy_bps", lambda problem, streaming, *rest: 9.0e12 if streaming else None)
    limits = machine._calibrate("k", 1, tmp_path, "auto")
    assert limits.dram_bandwidth_gbs == 9000.0
    assert limits.estimator == LIMITS_ESTIMATOR
