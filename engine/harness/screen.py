"""The static screen of a built kernel library: what it would run, import or load besides the kernel itself.

A candidate library is an adversary's binary that the judge loads into its own sandboxed process. Loading
alone runs code its author chose (constructors, IFUNC resolvers), and a kernel can call anything the C
library offers: open a file, fork, connect, sleep, change its CPU affinity. :func:`screen_library` reads
the ELF file with pyelftools -- nothing is loaded or run -- and lists what no kernel may have:

- code that runs at load or unload: ``.init_array``/``.fini_array``/``.preinit_array``/``.ctors``/
  ``.dtors`` with content, the ``DT_INIT*``/``DT_FINI*``/``DT_PREINIT_ARRAY`` tags, IFUNC symbols and
  ``IRELATIVE`` relocations (a resolver runs at load time);
- an undefined dynamic symbol outside :data:`CPU_KERNEL_IMPORTS` and this machine's libm exports;
- a dependency other than libc, libm, libmvec, libgomp and the dynamic loader (:data:`ALLOWED_NEEDED`), a
  library search path (``DT_RPATH``/``DT_RUNPATH``), an audit or filter library;
- a memory layout that makes code writable or data executable: an executable stack, a writable and
  executable segment, text relocations;
- anything that is not an ELF shared object for this machine (``not_elf``): a violation, never an
  exception, because a tampered cache must not crash the judge.

The loader, not the section table, decides what runs, so tags, symbols and relocations are read through the
dynamic segment (a file can drop or forge its section headers); sections are checked in addition, for
evidence the author recognises. The screen cannot see a system call made by inline assembly: the sandbox
stays the backstop for that.
"""

from __future__ import annotations

import ctypes.util
import functools
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field


class ViolationKind(StrEnum):
    """What a screened library did that no kernel may do; a compile result's category is ``forbidden_<kind>``."""

    constructor = "constructor"
    destructor = "destructor"
    ifunc = "ifunc"
    symbol = "symbol"
    needed = "needed"
    rpath = "rpath"
    audit = "audit"
    exec_stack = "exec_stack"
    wx_segment = "wx_segment"
    textrel = "textrel"
    not_elf = "not_elf"


class ScreenViolation(BaseModel):
    """One forbidden thing found in a library."""

    kind: ViolationKind = Field(description="What kind of thing is forbidden (constructor, symbol, needed, …).")
    name: str = Field(description="The symbol, section, dynamic tag, segment or library concerned.")
    message: str = Field(description="One readable line: what is forbidden, why, and what to do instead.")


class ScreenResult(BaseModel):
    """The screen's answer for one library: every violation found, in file order by check."""

    violations: list[ScreenViolation] = Field(
        default_factory=list, description="Everything forbidden that the screen found; empty when the library is clean."
    )

    @property
    def ok(self) -> bool:
        """True when the library may be loaded: no violation at all."""
        return not self.violations


@dataclass(frozen=True)
class ImportAllowList:
    """The undefined dynamic symbols a library may import. Names match exactly or by prefix; the weak ones
    only as weak references (the toolchain's own optional hooks, which a kernel never calls itself); the
    denied ones never, though a prefix would allow them."""

    names: frozenset[str]
    prefixes: tuple[str, ...] = ()
    weak_names: frozenset[str] = frozenset()
    weak_prefixes: tuple[str, ...] = ()
    denied_prefixes: tuple[str, ...] = ()

    def allows(self, name: str, weak: bool) -> bool:
        """Whether importing ``name`` (weakly or not) is allowed."""
        if name.startswith(self.denied_prefixes):
            return False
        if name in self.names or name.startswith(self.prefixes):
            return True
        return weak and (name in self.weak_names or name.startswith(self.weak_prefixes))


# What a CPU kernel may import besides this machine's libm (read at run time: :func:`libm_exports`). A backend
# with other needs (CUDA cubins, say) gets its own allow-list next to this one.
CPU_KERNEL_IMPORTS = ImportAllowList(
    names=frozenset(
        {
            # Memory: the compiler emits these for struct copies and zeroing, _FORTIFY_SOURCE the _chk ones.
            *("memcpy", "memset", "memmove", "memcmp", "__memcpy_chk", "__memset_chk", "__memmove_chk"),
            # Allocation: scratch space (the address-space limit bounds it).
            *("malloc", "calloc", "realloc", "free", "aligned_alloc", "posix_memalign"),
            # Giving up: the stack protector, assert() and abort() end in a crash verdict.
            *("__stack_chk_fail", "abort", "__assert_fail"),
            # Debug output to the already-open stdout/stderr: it goes to the log (printf may become puts or
            # putchar, fprintf may become fputs or fwrite).
            *("printf", "fprintf", "puts", "putchar", "putc", "fputc", "fputs", "fwrite", "fflush"),
            *("stdout", "stderr", "__printf_chk", "__fprintf_chk"),
            # OpenMP (-fopenmp), besides the GOMP_ and omp_get_ prefixes.
            *("omp_set_num_threads", "omp_in_parallel"),
            # _Thread_local variables: the compiler calls the loader's TLS accessor.
            "__tls_get_addr",
        }
    ),
    # _ZGV*: the vector math library (libmvec), which -ffast-math vectorised loops call; GOMP_*: the OpenMP
    # runtime that -fopenmp's pragmas compile into.
    prefixes=("_ZGV", "GOMP_", "omp_get_"),
    weak_names=frozenset({"__gmon_start__", "__cxa_finalize"}),
    weak_prefixes=("_ITM_",),
    # OpenMP's clock (omp_get_wtime, omp_get_wtick) games timing like clock_gettime; offloading (`omp target`)
    # and device queries make libgomp load its device plugins.
    denied_prefixes=("omp_get_wt", "GOMP_target", "omp_get_num_devices", "omp_get_initial_device"),
)
# The libraries a kernel may depend on, besides the dynamic loader (ALLOWED_LOADER; _Thread_local needs it).
ALLOWED_NEEDED = frozenset({"libc.so.6", "libm.so.6", "libmvec.so.1", "libgomp.so.1"})
ALLOWED_LOADER = re.compile(r"ld-linux[-\w]*\.so\.\d+|ld64\.so\.\d+")

# Why a well-known import is forbidden, for the message; anything else is "outside the allow-list".
_FORBIDDEN_BECAUSE = {
    reason: frozenset(names)
    for reason, names in {
        "touches files": (
            *("open", "open64", "openat", "creat", "fopen", "fopen64", "freopen", "fdopen", "opendir", "readdir"),
            *("read", "write", "pread", "pwrite", "fread", "fgets", "fscanf", "stat", "fstat", "lstat", "access"),
            *("unlink", "rename", "mkdir", "rmdir", "chmod", "chdir", "readlink", "truncate", "ftruncate"),
        ),
        "creates, replaces, ends or signals processes": (
            *("fork", "vfork", "clone", "clone3", "execve", "execv", "execvp", "execl", "execlp", "system"),
            *("posix_spawn", "posix_spawnp", "popen", "setsid", "kill", "killpg", "wait", "waitpid", "prctl"),
            *("exit", "_exit", "_Exit", "quick_exit", "ptrace"),
        ),
        "opens network connections": (
            *("socket", "connect", "bind", "listen", "accept", "accept4", "send", "sendto", "sendmsg", "recv"),
            *("recvfrom", "recvmsg", "getaddrinfo", "gethostbyname"),
        ),
        "starts threads the harness cannot account for (use OpenMP: -fopenmp and #pragma omp parallel)": (
            "pthread_create",
            "pthread_detach",
            "thrd_create",
        ),
        "reads or changes the environment": ("getenv", "secure_getenv", "environ", "__environ", "setenv", "putenv"),
        "changes CPU affinity or scheduling": (
            *("sched_setaffinity", "pthread_setaffinity_np", "sched_setscheduler", "setpriority", "nice"),
        ),
        "sleeps or reads the clock (a way to game the timing)": (
            *("sleep", "usleep", "nanosleep", "clock_nanosleep", "clock_gettime", "gettimeofday", "time", "clock"),
            *("omp_get_wtime", "omp_get_wtick"),
        ),
        "registers code to run at exit or fork, after the harness has judged the kernel": (
            *("atexit", "__cxa_atexit", "on_exit", "at_quick_exit", "__cxa_at_quick_exit", "__register_atfork"),
        ),
        "maps memory or changes its protection": ("mmap", "mmap64", "munmap", "mprotect", "mremap", "brk", "sbrk"),
        "handles or sends signals": ("signal", "sigaction", "raise", "alarm", "setitimer", "sigprocmask"),
        "loads other code": ("dlopen", "dlsym", "dlmopen"),
        "makes raw system calls": ("syscall",),
    }.items()
}
# Values of R_<arch>_IRELATIVE in each psABI (pyelftools does not name all of them).
_IRELATIVE = {"EM_X86_64": 37, "EM_386": 42, "EM_AARCH64": 1032, "EM_RISCV": 58, "EM_PPC64": 248, "EM_S390": 61}
_PF_X, _PF_W = 0x1, 0x2
_DF_TEXTREL = 0x4
# pyelftools names symbol type 10 (STT_GNU_IFUNC on GNU systems) after the range it opens, STT_LOOS.
_IFUNC_TYPES = frozenset({"STT_LOOS", "STT_GNU_IFUNC"})
_LOAD_TIME_SECTIONS = {
    ".preinit_array": ViolationKind.constructor,
    ".init_array": ViolationKind.constructor,
    ".ctors": ViolationKind.constructor,
    ".fini_array": ViolationKind.destructor,
    ".dtors": ViolationKind.destructor,
}
_LOAD_TIME_TAGS = {
    "DT_PREINIT_ARRAY": ViolationKind.constructor,
    "DT_INIT": ViolationKind.constructor,
    "DT_INIT_ARRAY": ViolationKind.constructor,
    "DT_FINI": ViolationKind.destructor,
    "DT_FINI_ARRAY": ViolationKind.destructor,
}
# When load-time code runs, and what to do instead.
_RUNS = {
    ViolationKind.constructor: (
        "as soon as the library is loaded, before the harness calls anything",
        "remove __attribute__((constructor)) (and __builtin_cpu_supports or target_clones, which add one) and do "
        "one-time setup inside the kernel behind a static flag",
    ),
    ViolationKind.destructor: (
        "at exit or unload, after the harness has judged the kernel",
        "remove __attribute__((destructor)) and atexit(), and release what the kernel holds before it returns",
    ),
}
_TAG_HINTS = {"DT_INIT": " (a function named _init sets it)", "DT_FINI": " (a function named _fini sets it)"}


def screen_library(path: Path) -> ScreenResult:
    """Every forbidden thing in the shared library at ``path`` (see the module docstring); never raises for a bad
    file (only when this machine's own libm or architecture cannot be read)."""
    # Outside the `try`: a judge that cannot read its own libm is broken, and must not blame the candidate.
    machine, libm = host_machine(), libm_exports()
    try:
        with path.open("rb") as stream:
            elf = _elf_file(stream)
            wrong = _not_a_library_here(elf, machine)
            if wrong:
                return ScreenResult(violations=[_not_elf(path, wrong)])
            dynamic = next((s for s in elf.iter_segments() if s["p_type"] == "PT_DYNAMIC"), None)
            if dynamic is None:
                return ScreenResult(violations=[_not_elf(path, "it has no dynamic segment")])
            violations = [
                *_load_time_code(elf, dynamic),
                *_imports(dynamic, libm),
                *_dependencies(dynamic),
                *_memory_layout(elf, dynamic),
            ]
    # A corrupt or hostile file can make pyelftools fail anywhere (struct errors, bad offsets, recursion): whatever
    # it raises, the file is not a library the judge may load.
    except Exception as error:
        return ScreenResult(violations=[_not_elf(path, f"{type(error).__name__}: {error}")])
    return ScreenResult(violations=violations)


def libm_exports() -> frozenset[str]:
    """The functions and objects this machine's libm exports, read from its dynamic symbol table (cached)."""
    return _exports_of(_find_libm())


@functools.cache
def host_machine() -> str:
    """This machine's ELF ``e_machine`` (``EM_X86_64``…), read from the running interpreter's own binary."""
    for executable in ("/proc/self/exe", sys.executable):
        try:
            with open(executable, "rb") as stream:
                return str(_elf_file(stream)["e_machine"])
        except Exception:  # not Linux, or an interpreter that is a script: try the next one
            continue
    raise RuntimeError("cannot tell this machine's ELF architecture: neither /proc/self/exe nor sys.executable is ELF")


@functools.cache
def _find_libm() -> Path:
    name = ctypes.util.find_library("m") or "libm.so.6"
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    folders = [f"/lib/{multiarch}", f"/usr/lib/{multiarch}", "/lib64", "/usr/lib64", "/lib", "/usr/lib"]
    for candidate in [*_ldconfig_paths(name), *(Path(folder) / name for folder in folders)]:
        if candidate.is_file() and _machine_of(candidate) == host_machine():
            return candidate
    raise FileNotFoundError(
        f"cannot find this machine's {name} to read the math functions a kernel may call (looked in ldconfig's "
        f"cache and {folders}); install the C library's development files (libc6-dev)"
    )


def _ldconfig_paths(name: str) -> list[Path]:
    ldconfig = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if Path(p).is_file()), None
    )
    if ldconfig is None:
        return []
    try:
        run = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    # Lines look like "\tlibm.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libm.so.6".
    return [
        Path(line.split("=>")[-1].strip()) for line in run.stdout.splitlines() if line.strip().startswith(name + " ")
    ]


def _machine_of(path: Path) -> str | None:
    try:
        with path.open("rb") as stream:
            return str(_elf_file(stream)["e_machine"])
    except Exception:
        return None


def _elf_file(stream: Any) -> Any:
    """pyelftools' reader of the ELF file open in ``stream``."""
    # Imported on first use: verdicts.py imports this module (ScreenViolation), and the CUDA judge, which screens
    # no ELF library, runs on GPU machines where pyelftools is not installed.
    from elftools.elf.elffile import ELFFile

    return ELFFile(stream)


@functools.cache
def _exports_of(library: Path) -> frozenset[str]:
    from elftools.elf.sections import SymbolTableSection

    with library.open("rb") as stream:
        dynsym = _elf_file(stream).get_section_by_name(".dynsym")
        if not isinstance(dynsym, SymbolTableSection):
            raise RuntimeError(f"{library} has no .dynsym: it cannot be this machine's libm")
        return frozenset(
            symbol.name
            for symbol in dynsym.iter_symbols()
            if symbol["st_shndx"] != "SHN_UNDEF"
            and symbol["st_info"]["type"] in ("STT_FUNC", "STT_OBJECT", *_IFUNC_TYPES)
        )


def _not_a_library_here(elf: Any, machine: str) -> str | None:
    if elf["e_type"] != "ET_DYN":
        return f"its ELF type is {elf['e_type']}, not ET_DYN (a shared object)"
    if elf["e_machine"] != machine:
        return f"it is built for {elf['e_machine']}, and this machine is {machine}"
    return None


def _not_elf(path: Path, why: str) -> ScreenViolation:
    return ScreenViolation(
        kind=ViolationKind.not_elf,
        name=path.name,
        message=(
            f"{path} is not an ELF shared object for this machine ({why}); the judge loads only libraries that "
            "engine.harness.cpu.compile_source built: compile the kernel again"
        ),
    )


def _tags(dynamic: Any) -> Iterator[tuple[str, Any]]:
    for tag in dynamic.iter_tags():
        yield str(tag.entry.d_tag), tag


def _load_time_code(elf: Any, dynamic: Any) -> Iterator[ScreenViolation]:
    for section in elf.iter_sections():
        kind = _LOAD_TIME_SECTIONS.get(section.name)
        if kind is not None and section["sh_size"] > 0:
            when, fix = _RUNS[kind]
            yield ScreenViolation(
                kind=kind, name=section.name, message=f"section {section.name} holds code that runs {when}; {fix}"
            )
    for name, _ in _tags(dynamic):
        kind = _LOAD_TIME_TAGS.get(name)
        if kind is not None:
            when, fix = _RUNS[kind]
            yield ScreenViolation(
                kind=kind,
                name=name,
                message=f"dynamic tag {name}{_TAG_HINTS.get(name, '')} names code that runs {when}; {fix}",
            )
    for symbol in dynamic.iter_symbols():
        if symbol["st_info"]["type"] in _IFUNC_TYPES:
            yield _ifunc(symbol.name, f"{symbol.name!r} is an IFUNC")
    irelative = _IRELATIVE.get(str(elf["e_machine"]))
    for table in dynamic.get_relocation_tables().values():
        for relocation in table.iter_relocations():
            if irelative is not None and relocation["r_info_type"] == irelative:
                yield _ifunc(
                    "IRELATIVE", f"an IRELATIVE relocation at {relocation['r_offset']:#x} calls an IFUNC resolver"
                )


def _ifunc(name: str, what: str) -> ScreenViolation:
    return ScreenViolation(
        kind=ViolationKind.ifunc,
        name=name,
        message=(
            f"{what}, whose resolver runs at load time, before the harness calls anything; remove "
            "__attribute__((ifunc)) and target_clones and choose the code path with -march flags or a plain branch"
        ),
    )


def _imports(dynamic: Any, libm: frozenset[str]) -> Iterator[ScreenViolation]:
    for symbol in dynamic.iter_symbols():
        name = symbol.name
        if not name or symbol["st_shndx"] != "SHN_UNDEF" or name in libm:
            continue
        if CPU_KERNEL_IMPORTS.allows(name, weak=symbol["st_info"]["bind"] == "STB_WEAK"):
            continue
        because = next((why for why, names in _FORBIDDEN_BECAUSE.items() if name in names), None)
        yield ScreenViolation(
            kind=ViolationKind.symbol,
            name=name,
            message=(
                f"the library imports {name!r}, which {because or 'is outside the allow-list'}: a kernel may call "
                "only math (libm), memory, allocation, stdio output, abort/assert and OpenMP functions "
                "(engine.harness.screen.CPU_KERNEL_IMPORTS); compute with plain C instead"
            ),
        )


def _dependencies(dynamic: Any) -> Iterator[ScreenViolation]:
    for name, tag in _tags(dynamic):
        if name == "DT_NEEDED" and tag.needed not in ALLOWED_NEEDED and not ALLOWED_LOADER.fullmatch(tag.needed):
            yield ScreenViolation(
                kind=ViolationKind.needed,
                name=tag.needed,
                message=(
                    f"the library depends on {tag.needed!r}, which the loader would load too; a kernel may link only "
                    f"{sorted(ALLOWED_NEEDED)}: drop what pulls it in"
                ),
            )
        elif name in ("DT_FILTER", "DT_AUXILIARY"):
            yield ScreenViolation(
                kind=ViolationKind.needed,
                name=name,
                message=f"dynamic tag {name} makes the loader load another library; build the kernel without it",
            )
        elif name in ("DT_RPATH", "DT_RUNPATH"):
            path = tag.rpath if name == "DT_RPATH" else tag.runpath
            yield ScreenViolation(
                kind=ViolationKind.rpath,
                name=name,
                message=(
                    f"dynamic tag {name} ({path!r}) makes the loader look for libraries in other folders; build "
                    "the kernel without -Wl,-rpath"
                ),
            )
        elif name in ("DT_AUDIT", "DT_DEPAUDIT"):
            yield ScreenViolation(
                kind=ViolationKind.audit,
                name=name,
                message=f"dynamic tag {name} names an audit library the loader would run; build the kernel without it",
            )


def _memory_layout(elf: Any, dynamic: Any) -> Iterator[ScreenViolation]:
    stack = None
    for index, segment in enumerate(elf.iter_segments()):
        flags = segment["p_flags"]
        if segment["p_type"] == "PT_GNU_STACK":
            stack = flags
        elif segment["p_type"] == "PT_LOAD" and flags & _PF_W and flags & _PF_X:
            yield ScreenViolation(
                kind=ViolationKind.wx_segment,
                name=f"PT_LOAD[{index}]",
                message=(
                    f"segment {index} is both writable and executable, so code could be rewritten at run time; "
                    "remove the section attributes or inline assembly that mark data executable"
                ),
            )
    if stack is None or stack & _PF_X:
        why = "has no PT_GNU_STACK, so the loader would" if stack is None else "asks (PT_GNU_STACK with PF_X) to"
        yield ScreenViolation(
            kind=ViolationKind.exec_stack,
            name="PT_GNU_STACK",
            message=(
                f"the library {why} make the stack executable; nested functions whose address is taken cause "
                "this: use a plain static function instead"
            ),
        )
    for name, tag in _tags(dynamic):
        if name == "DT_TEXTREL" or (name == "DT_FLAGS" and tag.entry.d_val & _DF_TEXTREL):
            yield ScreenViolation(
                kind=ViolationKind.textrel,
                name="DT_TEXTREL",
                message=(
                    "the library has text relocations, so the loader would write into its code; build "
                    "position-independent code (no absolute addresses in inline assembly)"
                ),
            )
            break
