"""Which sources may reach the compiler: refusing directives that would make it read outside its folder.

The compiler runs in the sandbox, but a directive such as ``#include "/dev/zero"`` still makes it read
until its memory limit (10-30 s of a worker's time), and ``#include "../../secret"`` or an absolute path
reads whatever file the sandbox's user may read. :func:`include_refusal` rejects, before any compiler runs:

- ``#include``, ``#include_next``, ``#import``, ``#embed``, ``#pragma GCC dependency``, and the
  ``__has_include``/``__has_include_next``/``__has_embed`` operators, naming an absolute path or a path
  with a ``..`` component (``<math.h>`` and ``"local.h"`` stay allowed: they resolve only in the
  system's include folders and the source's own folder);
- a computed include (``#include MACRO``, ``__has_include(MACRO)``), whose target cannot be checked;
- the assembler's ``.incbin``, which reads a file into the object just the same.

With ``headers=False`` (the CUDA backend: NVRTC has no header folders here, and a CUDA kernel needs none)
every file directive and operator is refused, whatever it names.

The C preprocessor sees a directive after undoing trigraphs (``??=`` is ``#``; only in strict ``-std=c*``
modes, so the check is run both with and without them) and line splices (backslash-newline, which GCC also
accepts with blanks before the newline), with comments counting as blanks: ``#inc\\<newline>lude``,
``#/**/include`` and ``??=include`` are all ``#include``. The check errs on the side of refusing: every line
that starts with ``#`` (or follows a ``*/``) is read as a directive, even inside a comment or a raw string, and
an include keyword followed by a quoted path is checked wherever it appears -- a comment that quotes
``include "/etc/passwd"`` is refused too. That keeps it simple enough to trust without a real preprocessor.

What it does not see: a ``_Pragma`` whose string is assembled by macros, and an assembler directive assembled
from pieces -- C joins adjacent string literals (``".inc" "bin"``), and an ``asm`` operand (``%c0``) or an
assembler macro can paste a name together. So the compiler stops at assembly (``-S``) and
:func:`assembly_refusal` reads what the assembler would: every ``asm`` statement's text as it reached the file,
joined and substituted. The sandbox (an unprivileged user, a read-only file system, memory and time limits)
stays the backstop.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

# Directives that read a file, and the one pragma that opens one.
_FILE_DIRECTIVES = frozenset({"include", "include_next", "import", "embed"})
# Checked wherever they appear: every keyword that can be followed by a file name (directives, the pragma's
# `dependency`, the assembler's `.include`), and the operators, which also accept a macro argument.
_ANYWHERE = re.compile(
    r"(?<![A-Za-z0-9_])(include_next|include|import|embed|dependency|"
    r"__has_include_next|__has_include|__has_embed|incbin)(?![A-Za-z0-9_])"
)
_OPERATORS = frozenset({"__has_include_next", "__has_include", "__has_embed"})
_TRIGRAPHS = {"=": "#", "/": "\\", "'": "^", "(": "[", ")": "]", "!": "|", "<": "{", ">": "}", "-": "~"}
_BLANK = " \t\f\v"
# Longer than any path the kernel accepts (PATH_MAX): a name not closed by then is not a file name.
_NAME_LIMIT = 4096
_FIX = "include only system headers by name, such as #include <math.h>, or a header beside the source by plain name"
_FIX_NO_HEADERS = (
    "CUDA sources include no headers: write what you need in the source (bfloat16 conversions with shifts and "
    "__uint_as_float; intrinsics such as __shfl_xor_sync, __ldg and __expf are built in)"
)


@dataclass(frozen=True)
class _Refusal:
    start: int  # where the directive (its `#`) or the keyword starts: the line reported
    target: int  # where the file name or macro is: the excerpt runs to the end of its line
    why: str


@dataclass
class _Text:
    """A source after translation phases 1 and 2, with the physical line each character came from and the
    positions of every newline and comment end (looked up by bisection, so that no pathological source --
    thousands of unclosed ``/*``, say -- makes the check quadratic)."""

    text: str
    lines: list[int]
    newlines: list[int] = field(init=False)
    closes: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.newlines = [m.start() for m in re.finditer("\n", self.text)]
        self.closes = [m.start() for m in re.finditer(r"\*/", self.text)]

    def line_end(self, i: int) -> int:
        """The newline at or after ``i``, or the end of the text."""
        k = bisect.bisect_left(self.newlines, i)
        return self.newlines[k] if k < len(self.newlines) else len(self.text)

    def comment_end(self, i: int) -> int:
        """Just past the ``*/`` that closes a block comment opened at ``i``, or the end of the text."""
        k = bisect.bisect_left(self.closes, i + 2)
        return self.closes[k] + 2 if k < len(self.closes) else len(self.text)


def include_refusal(source: str, *, headers: bool = True) -> str | None:
    """Why ``source`` may not be compiled -- the offending directive, its line and the fix -- or None when
    every directive names a header the rule allows (see the module docstring); ``headers=False`` allows none."""
    for trigraphs in (False, True):
        logical = _logical_text(source, trigraphs)
        found = [*_directive_refusals(logical, headers), *_keyword_refusals(logical, headers)]
        refusals = sorted(found, key=lambda r: r.start)
        if refusals:
            first, text = refusals[0], logical.text
            start, end = text.rfind("\n", 0, first.start) + 1, logical.line_end(first.target)
            excerpt = " ".join(text[start:end].split())
            excerpt = excerpt if len(excerpt) <= 160 else excerpt[:157] + "..."
            return f"line {logical.lines[first.start]}: `{excerpt}` {first.why}; {_FIX if headers else _FIX_NO_HEADERS}"
    return None


# Assembler directives that read a file (.incbin, .include), or that paste names together and could build one
# (.macro and .irp/.irpc substitute arguments into the text; .altmacro changes how). GNU as does not care about
# the case of a directive's name.
_ASSEMBLER_READS = re.compile(r"\.[ \t]*(incbin|include|macro|irpc|irp|altmacro)(?![A-Za-z0-9_$.])", re.IGNORECASE)


def assembly_refusal(assembly: str) -> str | None:
    """Why the compiler's assembly output may not be assembled -- a directive that reads a file or builds
    directives from pieces, with its line and the fix -- or None. Errs on the side of refusing: a string literal
    of the kernel that reads ``.include`` is refused too."""
    match = _ASSEMBLER_READS.search(assembly)
    if match is None:
        return None
    start, end = assembly.rfind("\n", 0, match.start()) + 1, assembly.find("\n", match.end())
    excerpt = " ".join(assembly[start : end if end >= 0 else len(assembly)].split())
    excerpt = excerpt if len(excerpt) <= 160 else excerpt[:157] + "..."
    return (
        f"the assembly the compiler made of the source has `{excerpt}`: the assembler's .{match.group(1).lower()} "
        "reads a file (or builds a directive that can); asm statements may not use .incbin, .include, .macro, "
        ".irp, .irpc or .altmacro, however their text is put together"
    )


def _logical_text(source: str, trigraphs: bool) -> _Text:
    """``source`` after translation phases 1 and 2: trigraphs replaced if asked, line splices undone."""
    text = source.replace("\r\n", "\n").replace("\r", "\n")
    chars: list[str] = []
    origin: list[int] = []
    line, i, n = 1, 0, len(text)
    while i < n:
        char, width = text[i], 1
        if trigraphs and text.startswith("??", i) and i + 2 < n and text[i + 2] in _TRIGRAPHS:
            char, width = _TRIGRAPHS[text[i + 2]], 3
        if char == "\\":
            after = i + width
            while after < n and text[after] in _BLANK:
                after += 1
            if after < n and text[after] == "\n":
                line, i = line + 1, after + 1
                continue
        chars.append(char)
        origin.append(line)
        line += char == "\n"
        i += width
    origin.append(line)  # the end of the text, for a refusal at its very end
    return _Text("".join(chars), origin)


def _skip_blanks(logical: _Text, i: int, newlines: bool) -> int:
    """The first position at or after ``i`` that is neither a blank nor a comment. Without ``newlines`` it stops
    at the end of the line, as a directive does (a block comment inside a directive may still span lines)."""
    text = logical.text
    while i < len(text):
        if text[i] in _BLANK or (newlines and text[i] == "\n"):
            i += 1
        elif text.startswith("/*", i):
            i = logical.comment_end(i)
        elif text.startswith("//", i):
            end = logical.line_end(i)
            if not newlines:
                return end
            i = end + 1
        else:
            return i
    return len(text)


def _target(logical: _Text, i: int) -> tuple[str, str] | None:
    """The file name quoted at ``i`` (``"…"``, ``<…>``, or ``\\"…\\"`` inside a string) and how it was quoted
    (``unterminated`` when it is not closed on its line), or None when no quoted name starts there."""
    text = logical.text
    escaped = text.startswith('\\"', i)
    if escaped or text.startswith('"', i):
        start = i + (2 if escaped else 1)
        closing = '\\"' if escaped else '"'
    elif text.startswith("<", i):
        start, closing = i + 1, ">"
    else:
        return None
    stop = min(logical.line_end(start), start + _NAME_LIMIT)
    end = text.find(closing, start, stop)
    if end < 0:
        return text[start:stop], "unterminated"
    return text[start:end], closing


def _unsafe(path: str, headers: bool) -> str | None:
    if not headers:
        return "includes a file, which a CUDA source may not"
    if path.startswith("/"):
        return "names an absolute path"
    if ".." in path.split("/"):
        return "climbs out of the source's folder with `..`"
    return None


def _directive_starts(logical: _Text) -> Iterator[int]:
    """Where a ``#`` could open a directive: after blanks and comments at the start of a line, or after a
    ``*/`` (a block comment spanning lines counts as a blank that holds a newline)."""
    text = logical.text
    for start in [0, *(n + 1 for n in logical.newlines), *(c + 2 for c in logical.closes)]:
        i = _skip_blanks(logical, start, newlines=False)
        if text.startswith("#", i):
            yield i + 1
        elif text.startswith("%:", i):  # the digraph of #
            yield i + 2


def _directive_refusals(logical: _Text, headers: bool) -> Iterator[_Refusal]:
    text = logical.text
    for hash_end in _directive_starts(logical):
        start, i = hash_end - 1, _skip_blanks(logical, hash_end, newlines=False)
        word = re.match(r"[A-Za-z_]\w*", text[i : i + 40])
        if word is None:
            continue
        name, i = word.group(), _skip_blanks(logical, i + word.end(), newlines=False)
        if name == "pragma":
            pragma = re.match(r"GCC[ \t\f\v]+dependency(?![A-Za-z0-9_])", text[i : i + 60])
            if pragma is None:
                continue
            name, i = "pragma GCC dependency", _skip_blanks(logical, i + pragma.end(), newlines=False)
        elif name not in _FILE_DIRECTIVES:
            continue
        if i >= len(text) or text[i] == "\n":
            continue  # `#include` with nothing after it: the compiler's own error says so
        target = _target(logical, i)
        if target is None:
            yield _Refusal(start, i, f"is a computed #{name} (a macro), whose target cannot be checked")
        elif target[1] == "unterminated":
            yield _Refusal(start, i, f"is an #{name} whose file name is not closed on its line")
        elif why := _unsafe(target[0], headers):
            yield _Refusal(start, i, why)


def _keyword_refusals(logical: _Text, headers: bool) -> Iterator[_Refusal]:
    for match in _ANYWHERE.finditer(logical.text):
        keyword, i = match.group(1), _skip_blanks(logical, match.end(), newlines=True)
        if keyword == "incbin":
            yield _Refusal(match.start(), i, "uses the assembler's .incbin, which reads a file into the library")
            continue
        if keyword in _OPERATORS:
            if not logical.text.startswith("(", i):
                continue  # `#ifdef __has_include` and the like: the operator is not applied
            i = _skip_blanks(logical, i + 1, newlines=True)
            target = _target(logical, i)
            if target is None or target[1] == "unterminated":
                yield _Refusal(match.start(), i, f"applies {keyword} to a computed name, which cannot be checked")
                continue
        else:
            target = _target(logical, i)
            if target is None:
                continue  # prose or code: only a quoted name after the keyword is a file name
        if why := _unsafe(target[0], headers):
            yield _Refusal(match.start(), i, why)
