"""An LLM reply, taken apart and checked before anything compiles it.

The code is the fenced block tagged ``c`` (or ``cuda``/``cpp``); failing that, the largest fenced block. It
must define the problem's entry point with the ABI's number of parameters, include only headers from an
allow-list and call nothing that reaches outside a kernel (processes, files, sockets, the environment,
dynamic loading). These checks are a cheap first filter that turns an obviously unusable reply into a
recorded outcome with a reason; the sandbox that runs candidates is the security boundary, not this.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from engine.proposers.outcomes import RejectReason

ALLOWED_INCLUDES = frozenset(
    {
        "stdint.h",
        "stddef.h",
        "stdbool.h",
        "stdalign.h",
        "math.h",
        "float.h",
        "limits.h",
        "string.h",
        "immintrin.h",
        "x86intrin.h",
        "arm_neon.h",
        "arm_sve.h",
        "omp.h",
        "cuda_fp16.h",
        "cuda_bf16.h",
        "mma.h",
        "cooperative_groups.h",
    }
)
"""Headers a kernel may include: fixed-width types, math, memcpy/memset, SIMD intrinsics, CUDA half types."""
_INTRINSICS_HEADER = re.compile(r"^[a-z0-9_]*intrin\.h$")
FORBIDDEN_CALLS = frozenset(
    {
        "system",
        "popen",
        "fork",
        "vfork",
        "clone",
        "execl",
        "execle",
        "execlp",
        "execv",
        "execve",
        "execvp",
        "execvpe",
        "posix_spawn",
        "posix_spawnp",
        "socket",
        "connect",
        "bind",
        "listen",
        "accept",
        "getenv",
        "secure_getenv",
        "setenv",
        "putenv",
        "dlopen",
        "dlsym",
        "syscall",
        "ptrace",
        "kill",
        "fopen",
        "open",
        "openat",
        "creat",
        "unlink",
        "remove",
        "rename",
        "mmap",
        "mprotect",
        "pthread_create",
        "sched_setaffinity",
        "exit",
        "abort",
    }
)
"""Calls no kernel needs: they reach processes, files, sockets, the environment or other code."""
REPLY_EXCERPT_LIMIT = 1500
"""Characters of a rejected reply kept as evidence."""

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+#-]*)[^\n]*\n(.*?)```", re.DOTALL)
_C_LANGS = {"c", "h", "cuda", "cu", "cpp", "c++", "cxx", "cc"}
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"]+)[>"]', re.MULTILINE)
_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.DOTALL)
_RATIONALE = re.compile(r"^[ \t*_#>-]*RATIONALE[ \t*_]*:[ \t*_]*(.+)$", re.IGNORECASE | re.MULTILINE)
_TAGS = re.compile(r"^[ \t*_#>-]*TAGS[ \t*_]*:[ \t*_]*(.+)$", re.IGNORECASE | re.MULTILINE)
_TAG_CHARS = re.compile(r"[^a-z0-9=_.+-]+")
MAX_TAGS = 8


class ReplyRejected(Exception):
    """A reply that cannot become a candidate; ``reason`` is a ProposalFailure reason."""

    def __init__(self, reason: RejectReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class ParsedReply:
    """The usable parts of a reply."""

    source: str
    rationale: str = ""
    tags: list[str] = field(default_factory=list)


def extract_code(reply: str) -> str | None:
    """The reply's kernel source: the largest C-tagged fenced block, else the largest fenced block."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(reply)]
    if not blocks:
        return None
    tagged = [body for lang, body in blocks if lang in _C_LANGS]
    chosen = max(tagged or [body for _, body in blocks], key=len)
    return chosen.strip("\n") + "\n"


def strip_comments_and_strings(source: str) -> str:
    """The source with comments and string/char literals blanked, so checks ignore `// never call system()`."""
    return _COMMENT_OR_STRING.sub(lambda m: " " if m.group(0).startswith(("/", '"', "'")) else m.group(0), source)


def count_parameters(parameter_list: str) -> int:
    """Parameters in a C parameter list (`void` is none); commas inside parentheses do not split."""
    text = parameter_list.strip()
    if text in ("", "void"):
        return 0
    depth, count = 0, 1
    for char in text:
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        elif char == "," and depth == 0:
            count += 1
    return count


def check_source(source: str, entry: str, arity: int) -> None:
    """Raise ReplyRejected if the source lacks the entry point, has the wrong arity, or includes or calls
    something a kernel must not."""
    if not source.strip():
        raise ReplyRejected("empty_code", "the reply's code block is empty")
    for header in _INCLUDE.findall(source):
        name = header.strip()
        if name not in ALLOWED_INCLUDES and not _INTRINSICS_HEADER.match(name):
            raise ReplyRejected(
                "forbidden_include",
                f"#include <{name}> is not allowed; a kernel may include only {sorted(ALLOWED_INCLUDES)}",
            )
    code = strip_comments_and_strings(source)
    definitions = list(re.finditer(rf"\b{re.escape(entry)}\s*\(([^)]*)\)\s*\{{", code))
    if not definitions:
        raise ReplyRejected(
            "missing_entry", f"the code defines no function `{entry}(...)`; it must define the entry point {entry!r}"
        )
    counts = sorted({count_parameters(d.group(1)) for d in definitions})
    if arity not in counts:
        raise ReplyRejected(
            "wrong_arity",
            f"`{entry}` takes {counts[0]} parameter(s) but the ABI has {arity}; keep the signature exactly",
        )
    for match in re.finditer(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(", code):
        name = match.group(1)
        if name in FORBIDDEN_CALLS:
            raise ReplyRejected(
                "forbidden_call", f"the code calls {name}(), which no kernel may call (processes, files, environment)"
            )


def parse_reply(reply: str, entry: str, arity: int) -> ParsedReply:
    """The checked source, rationale and tags of a reply, or ReplyRejected saying why it is unusable."""
    source = extract_code(reply)
    if source is None:
        raise ReplyRejected("no_code", "the reply holds no fenced code block (```c ... ```)")
    check_source(source, entry, arity)
    rationale_match = _RATIONALE.search(reply)
    tags_match = _TAGS.search(reply)
    tags: list[str] = []
    if tags_match:
        for raw in tags_match.group(1).split(","):
            tag = _TAG_CHARS.sub("-", raw.strip().strip("`*_").lower()).strip("-")
            if tag and tag not in tags:
                tags.append(tag[:40])
    rationale = rationale_match.group(1).strip().strip("*_ ")[:500] if rationale_match else ""
    return ParsedReply(source=source, rationale=rationale, tags=tags[:MAX_TAGS])


def excerpt(reply: str) -> str:
    """The start of a reply, bounded, for evidence."""
    return reply if len(reply) <= REPLY_EXCERPT_LIMIT else reply[:REPLY_EXCERPT_LIMIT] + " …"
