"""CUDA architectures: which one a target names, and what a kernel launch may ask of it.

A target ``cuda-sm90`` names the architecture ``sm_90`` (``cuda-sm90a``: ``sm_90a``, the arch-specific
variant whose cubins use wgmma and the like and run on sm_90 devices only). The limits are those of the CUDA
programming guide's table of compute capabilities; a launch beyond them fails on the device with
``CUDA_ERROR_INVALID_VALUE`` or ``CUDA_ERROR_OUT_OF_RESOURCES``, which the compile step refuses to leave for
the GPU to find (engine/harness/cuda/launch.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.errors import UserError

_TARGET = re.compile(r"^cuda-sm(?P<number>\d{2,3})(?P<variant>[af]?)$")


@dataclass(frozen=True)
class ArchLimits:
    """What one launch may use on an architecture, per block and per grid."""

    max_shared_bytes: int
    """Shared memory one block may use, static plus dynamic, once the kernel opts in to more than 48 KiB."""
    max_threads_per_block: int = 1024
    max_block: tuple[int, int, int] = (1024, 1024, 64)
    max_grid: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    registers_per_block: int = 65536
    """The register file one block may take (registers are handed out per warp, see launch.py)."""
    max_registers_per_thread: int = 255


# Keyed by the architecture number; the `a` and `f` variants share their base's limits.
LIMITS: dict[str, ArchLimits] = {
    "80": ArchLimits(max_shared_bytes=166912),  # A100: 163 KiB
    "86": ArchLimits(max_shared_bytes=101376),  # RTX 30xx, A10, A40: 99 KiB
    "87": ArchLimits(max_shared_bytes=166912),  # Jetson Orin: 163 KiB
    "89": ArchLimits(max_shared_bytes=101376),  # RTX 40xx, L4, L40: 99 KiB
    "90": ArchLimits(max_shared_bytes=232448),  # H100, H200: 227 KiB
    "100": ArchLimits(max_shared_bytes=232448),  # B200: 227 KiB
    "103": ArchLimits(max_shared_bytes=232448),  # B300: 227 KiB
    "120": ArchLimits(max_shared_bytes=101376),  # RTX 50xx, RTX PRO: 99 KiB
}


def arch_of(target: str) -> str:
    """The NVRTC architecture (``sm_90``, ``sm_90a``) a CUDA target (``cuda-sm90``, ``cuda-sm90a``) names."""
    match = _TARGET.match(target)
    if match is None or match.group("number") not in LIMITS:
        known = ", ".join(f"cuda-sm{n}" for n in LIMITS)
        raise UserError(f"target {target!r} is not a known CUDA target; use one of {known} (optionally with a)")
    return f"sm_{match.group('number')}{match.group('variant')}"


def limits_of(arch: str) -> ArchLimits:
    """The launch limits of ``arch`` (``sm_90``, ``sm_90a``…)."""
    match = re.fullmatch(r"sm_(\d{2,3})[af]?", arch)
    if match is None or match.group(1) not in LIMITS:
        raise UserError(f"unknown CUDA architecture {arch!r}; known: {', '.join(f'sm_{n}' for n in LIMITS)}")
    return LIMITS[match.group(1)]
