"""What a sandboxed process may still do as root, and its last step down to an unprivileged user.

When the sandbox's supervisor is root, the command must not run as root: a process with uid 0 passes the
owner's permission check on every file root owns (``/etc/shadow``, root's keys), capabilities or not. The
plain way is for the sandbox's init to become ``nobody`` before it starts the command. That fails for the
harness worker where ``nobody`` cannot read the interpreter (a pyenv Python in ``/root``), so the worker
drops itself, late, in two steps:

1. the init (engine/harness/init.py, still root) calls :func:`keep_only_setid_capabilities`: it stays uid 0
   and the command it starts holds CAP_SETUID and CAP_SETGID and nothing else, the bounding set empty;
2. the worker starts its interpreter, imports numpy and everything else it will need (after the drop the
   interpreter's own files may be unreadable), then calls :func:`drop_privileges` -- before any candidate
   code is loaded. From then on it is an ordinary unprivileged user with no capability, no way back to uid 0
   and ``no_new_privs``.

Commands that need no late drop get :func:`drop_all_capabilities` from the init instead (uid 0, no
capability at all), or run as ``nobody`` from the start.

Standard library only: the init loads this file by path under ``python -I -S``; the worker imports it as
``engine.harness.privileges``.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
from typing import Any

CAP_KILL = 5
CAP_SETGID = 6
CAP_SETUID = 7
CAP_SETPCAP = 8
LAST_CAPABILITY_BOUND = 64  # PR_CAPBSET_* answers EINVAL past the kernel's last capability

PR_SET_PDEATHSIG = 1
PR_GET_PDEATHSIG = 2
PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_IS_SET = 1

SECBIT_NOROOT, SECBIT_NOROOT_LOCKED = 0x01, 0x02
SECBIT_NO_SETUID_FIXUP_LOCKED = 0x08
SECBIT_KEEP_CAPS_LOCKED = 0x20
SECBIT_NO_CAP_AMBIENT_RAISE, SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED = 0x40, 0x80

_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class PrivilegeDropError(RuntimeError):
    """The process could not become the unprivileged user, or still holds a privilege afterwards."""


@functools.lru_cache(maxsize=1)
def libc() -> Any:
    """The C library, with ``prctl``'s argument types declared (a bare Python int is passed as a 32-bit
    int, and prctl reads unsigned longs)."""
    library = ctypes.CDLL(None, use_errno=True)
    library.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    library.prctl.restype = ctypes.c_int
    return library


def prctl(option: int, value: int = 0) -> int:
    """``prctl(option, value, 0, 0, 0)``; raises OSError on failure."""
    result: int = libc().prctl(option, value, 0, 0, 0)
    if result < 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl({option}, {value}): {os.strerror(error)}")
    return result


def _bits(*capabilities: int) -> int:
    mask = 0
    for capability in capabilities:
        mask |= 1 << capability
    return mask


def _capset(effective: int, permitted: int, inheritable: int) -> None:
    """Set this thread's three capability sets (64-bit masks)."""
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)(
        effective & 0xFFFFFFFF,
        permitted & 0xFFFFFFFF,
        inheritable & 0xFFFFFFFF,
        effective >> 32,
        permitted >> 32,
        inheritable >> 32,
    )
    if libc().capset(header, data) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"capset: {os.strerror(error)}")


def _capget() -> tuple[int, int, int]:
    """This thread's effective, permitted and inheritable capability sets."""
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc().capget(header, data) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"capget: {os.strerror(error)}")
    return data[0] | data[3] << 32, data[1] | data[4] << 32, data[2] | data[5] << 32


def _empty_bounding_set() -> None:
    """Drop every capability from the bounding set (needs CAP_SETPCAP; without it, nothing changes)."""
    for capability in range(LAST_CAPABILITY_BOUND):
        libc().prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)  # EINVAL past the last capability: ignored


def _bounding_set() -> int:
    return sum(1 << cap for cap in range(LAST_CAPABILITY_BOUND) if libc().prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1)


def _ambient_set() -> int:
    return sum(
        1 << cap
        for cap in range(LAST_CAPABILITY_BOUND)
        if libc().prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, cap, 0, 0) == 1
    )


def drop_all_capabilities() -> None:
    """Stay uid 0 but without any capability, now or after exec (no module loading, raw devices, ptrace of
    other users, mounting, or bypassing file permissions). Files root owns stay readable: the owner's check."""
    secure_bits = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_CAP_AMBIENT_RAISE
    secure_bits |= SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED
    libc().prctl(PR_SET_SECUREBITS, secure_bits, 0, 0, 0)  # best effort: the empty sets below are what count
    _empty_bounding_set()
    _capset(0, 0, 0)


def keep_only_setid_capabilities() -> None:
    """Stay uid 0 so that a command started next keeps CAP_SETUID and CAP_SETGID and nothing else: the first
    step of the late drop (see the module docstring). Called by the init while it still has every capability.

    How the command gets exactly those two: for uid 0 without ``SECBIT_NOROOT``, exec grants permitted =
    bounding set | inheritable set; the bounding set is emptied and the inheritable set is those two. The
    init itself also keeps CAP_KILL, only in its own sets (never inheritable), so that it can still kill the
    command once the command has become another user. ``KEEP_CAPS`` and ``NO_SETUID_FIXUP`` are locked off:
    the command's later change of uid clears its capabilities, and nothing it runs can undo that."""
    kept = _bits(CAP_SETUID, CAP_SETGID)
    own = kept | _bits(CAP_KILL)
    prctl(
        PR_SET_SECUREBITS,
        SECBIT_KEEP_CAPS_LOCKED
        | SECBIT_NO_SETUID_FIXUP_LOCKED
        | SECBIT_NO_CAP_AMBIENT_RAISE
        | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED,
    )
    # The inheritable set may only grow within the bounding set, and the bounding set only shrinks with
    # CAP_SETPCAP: inheritable first, then the bounding set, then let CAP_SETPCAP go.
    _capset(own | _bits(CAP_SETPCAP), own | _bits(CAP_SETPCAP), kept)
    _empty_bounding_set()
    _capset(own, own, kept)


def drop_privileges(uid: int, gid: int) -> None:
    """Become ``uid``/``gid`` for good: no supplementary groups, no capability in any set, no saved uid 0,
    ``no_new_privs``; then check all of it and raise :class:`PrivilegeDropError` if anything is left.

    The harness worker calls this after its imports and before it loads any candidate code, with the ids of
    ``Sandbox.late_drop``. It needs CAP_SETUID and CAP_SETGID, which a command started with the init's
    ``--late-drop`` holds. A parent-death signal survives the change (the kernel clears it on a change of
    credentials; it is set again). Call it before the process starts threads of its own: the uids change in
    every thread (glibc), but the capability sets are cleared and checked in the calling thread."""
    if uid == 0 or gid == 0:
        raise PrivilegeDropError(f"drop_privileges({uid}, {gid}): uid and gid must not be 0 (root)")
    parent = os.getppid()
    death_signal = ctypes.c_int(0)
    libc().prctl(PR_GET_PDEATHSIG, ctypes.addressof(death_signal), 0, 0, 0)
    _empty_bounding_set()  # already empty under the init's --late-drop; a no-op without CAP_SETPCAP
    try:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    except PermissionError as error:
        raise PrivilegeDropError(
            f"cannot become uid {uid} gid {gid}: {error}; start the command with the sandbox's late drop "
            "(it needs CAP_SETUID and CAP_SETGID)"
        ) from error
    try:
        _capset(0, 0, 0)  # a change of uid clears the effective and permitted sets, not the inheritable one
        prctl(PR_SET_NO_NEW_PRIVS, 1)
    except OSError as error:
        raise PrivilegeDropError(f"after becoming uid {uid}: {error}") from error
    if death_signal.value:
        prctl(PR_SET_PDEATHSIG, death_signal.value)
        if os.getppid() != parent:  # the parent died before the signal was armed again
            os.kill(os.getpid(), signal.SIGKILL)
    _verify(uid, gid)


def _verify(uid: int, gid: int) -> None:
    """Raise :class:`PrivilegeDropError` unless the process is ``uid``/``gid`` with no privilege left."""
    left = []
    if os.getresuid() != (uid, uid, uid):
        left.append(f"uids (real, effective, saved) are {os.getresuid()}, expected {uid}")
    if os.getresgid() != (gid, gid, gid):
        left.append(f"gids (real, effective, saved) are {os.getresgid()}, expected {gid}")
    if os.getgroups():
        left.append(f"supplementary groups {os.getgroups()}")
    effective, permitted, inheritable = _capget()
    for name, mask in (
        ("effective", effective),
        ("permitted", permitted),
        ("inheritable", inheritable),
        ("bounding", _bounding_set()),
        ("ambient", _ambient_set()),
    ):
        if mask:
            left.append(f"{name} capabilities {mask:#x}")
    if prctl(PR_GET_NO_NEW_PRIVS) != 1:
        left.append("no_new_privs is not set")
    if left:
        raise PrivilegeDropError(f"privileges left after dropping to uid {uid}: " + "; ".join(left))
