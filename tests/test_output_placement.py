"""Where the benchmark worker puts a kernel's outputs is its own choice, the same for every shape, contender and
position: left to malloc, the first shape's outputs lay 64 bytes into their pages (4K-aliasing the page-aligned
inputs) and later shapes' elsewhere, and a streaming-store kernel read 30-40% slower on whichever shape was
timed first."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from engine.harness import protocol as p
from engine.harness.worker import LINE, PAGE, _Bench, output_offsets


@pytest.mark.parametrize("count", [1, 2, 3, 5, 9, 64, 65])
def test_output_offsets_are_whole_lines_spread_over_the_page(count: int) -> None:
    offsets = output_offsets(count)
    assert len(offsets) == count and offsets[0] == 0
    assert all(0 <= o < PAGE and o % LINE == 0 for o in offsets)
    assert offsets == sorted(offsets)
    # Spread: consecutive offsets about PAGE / count apart (at most one line off), distinct while lines last.
    gaps = np.diff([*offsets, PAGE])
    assert gaps.max() - gaps.min() <= LINE
    assert len(set(offsets)) == min(count, PAGE // LINE)


def _bench(rows: int, cols: int, out_slots: int) -> _Bench:
    params = [
        p.ParamSpec(name="x", role="in", dtype="float32", shape=["rows", "cols"]),
        p.ParamSpec(name="y", role="out", dtype="float32", shape=["rows", "cols"]),
        p.ParamSpec(name="z", role="out", dtype="float32", shape=["rows"]),
        p.ParamSpec(name="rows", role="size", dtype="int64"),
        p.ParamSpec(name="cols", role="size", dtype="int64"),
    ]
    worker = SimpleNamespace(
        np=np,
        plan=SimpleNamespace(params=params, pool_fd=None, contender="candidate"),
        module=None,
        function=None,
    )
    x = np.ones((rows, cols), np.float32)
    spec = p.ArraySpec(name="x", dtype="float32", dims=[rows, cols], nbytes=x.nbytes)
    command = p.PreparePools(
        shape={"rows": rows, "cols": cols},
        seeds=[0],
        arrays=[[spec]],
        scalars=[{}],
        out_slots=out_slots,
        pool_bytes=x.nbytes,
        payload_bytes=x.nbytes,
    )
    return _Bench(worker, command, bytearray(x.tobytes()))  # type: ignore[arg-type]


def test_every_shape_gets_the_same_output_placement_whatever_was_allocated_before() -> None:
    # Allocating and freeing a large array first moves glibc's mmap threshold: malloc then serves the next
    # shape's outputs from the heap, at another page offset than the first shape's mmapped ones.
    placements = []
    for rows, cols in [(512, 4096), (2048, 1024), (64, 16384)]:
        scratch = np.empty(rows * cols * 3, np.float32)
        del scratch
        bench = _bench(rows, cols, out_slots=3)
        arrays = [a for slot in bench.outputs for a in slot.values()]
        placements.append([a.ctypes.data % PAGE for a in arrays])
        for a in arrays:
            assert a.flags.writeable and a.flags.c_contiguous
            assert np.isnan(a).all()  # poisoned as before
        # The arrays do not overlap one another.
        spans = sorted((a.ctypes.data, a.ctypes.data + a.nbytes) for a in arrays)
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    assert placements[0] == output_offsets(6)
    assert placements == [placements[0]] * len(placements)
