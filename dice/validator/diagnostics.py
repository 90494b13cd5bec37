"""Compiler output -> diagnostics on the user's file.

Reads the three dialects a CUDA compile prints:

- EDG (nvcc's front end and NVRTC): ``file(12): error: text`` (also ``catastrophic error``,
  ``warning #177-D``), then continuation lines, the source line, a caret line (the column), and
  ``detected during instantiation of "..." at line N of file`` (one line, or a ``detected during:`` list);
- gcc/clang (the host compiler, nvcc's preprocessing): ``file:12:5: error: text`` (``fatal error``,
  ``warning``, ``note``), ``In file included from a.cu:3,`` / ``from b.h:2:`` chains, ``file: In
  instantiation of '...':`` and ``file:7:9:   required from here``;
- ptxas: ``ptxas /tmp/x.ptx, line 28; error   : text``, mapped back through the PTX ``.loc`` lines when the
  PTX file is at hand.

A diagnostic in the user's file keeps its line; one in a header keeps the header's place (``header``) and is
put on the user's file at the instantiation or include site that leads to it. Each diagnostic is
``{"line", "severity", "message", "column", "source", "notes"}`` (+ ``"header"``); lines and columns 0-based.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EDG_LINE = re.compile(
    r"^(?P<file>[^\n()]*)\((?P<line>\d+)\):\s*(?P<severity>catastrophic error|error|warning|remark)"
    r"(?P<code>\s*#[\w-]+)?\s*:?\s*(?P<message>.*)$"
)
GCC_LINE = re.compile(
    r"^(?P<file>[^\s:][^:\n]*?):(?P<line>\d+):(?:(?P<column>\d+):)?\s*"
    r"(?P<severity>fatal error|error|warning|note):\s*(?P<message>.*)$"
)
GCC_INCLUDED = re.compile(r"^(?:In file included|\s+) from (?P<file>[^:\n]+):(?P<line>\d+)(?::\d+)?[:,]?\s*$")
GCC_CONTEXT = re.compile(
    r"^(?P<file>[^:\n]+): (?P<text>In (?:instantiation|substitution|function|member).*):$"
)
GCC_REQUIRED = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+):(?:\d+:)?\s+(?P<text>required (?:from|by).*)$")
EDG_DURING = re.compile(
    r"^\s*(?:detected during(?::|\s+))?\s*(?P<text>(?:instantiation|implicit generation) of .*?)"
    r"(?: at line (?P<line>\d+)(?: of (?P<file>.+?))?)?\s*$"
)
PTXAS_LINE = re.compile(
    r"^ptxas\s+(?P<ptx>\S+?), line (?P<line>\d+); (?P<severity>error|warning)\s*:\s*(?P<message>.*)$"
)
UNLOCATED = re.compile(
    r"^(?P<tool>nvcc|ptxas|nvlink|fatbinary|cicc)\s+(?P<severity>fatal|error)\s*:\s*(?P<message>.*)$"
)
_CARET = re.compile(r"^\s*\^\s*$")


@dataclass
class RawDiagnostic:
    """One compiler message as printed: 1-based ``line``, 0-based ``column`` (None when unknown), the
    instantiation/include ``sites`` that lead to it (outermost last), ``notes`` as printed."""

    file: str | None
    line: int | None
    severity: str
    message: str
    source: str
    column: int | None = None
    notes: list[str] = field(default_factory=list)
    sites: list[tuple[str | None, int, str]] = field(default_factory=list)  # (file, 1-based line, kind)


def _severity(word: str) -> str:
    return "warning" if word in ("warning", "remark") else ("note" if word == "note" else "error")


def parse_compiler_output(log: str, *, edg_source: str = "nvcc") -> list[RawDiagnostic]:
    """Every diagnostic of a compiler log, in order (notes attached to the one before them)."""
    out: list[RawDiagnostic] = []
    lines = log.splitlines()
    pending_includes: list[tuple[str, int]] = []
    pending_context: list[str] = []
    i = 0
    while i < len(lines):
        text = lines[i]
        m = EDG_LINE.match(text)
        if m:
            diag = RawDiagnostic(
                m.group("file") or None,
                int(m.group("line")),
                _severity(m.group("severity")),
                m.group("message").strip(),
                edg_source,
            )
            i = _edg_tail(lines, i + 1, diag)
            out.append(diag)
            continue
        i += 1
        if _gcc_line(text, out, pending_includes, pending_context):
            continue
        m = PTXAS_LINE.match(text)
        if m:
            diag = RawDiagnostic(None, None, m.group("severity"), m.group("message").strip(), "nvcc")
            diag.notes.append(f"ptxas: {m.group('ptx')}, line {m.group('line')}")
            diag.sites.append((m.group("ptx"), int(m.group("line")), "ptx"))
            out.append(diag)
            continue
        m = UNLOCATED.match(text)
        if m and not text.startswith("ptxas fatal   : Ptx assembly aborted"):
            tool = m.group("tool")
            out.append(RawDiagnostic(None, None, "error", f"{tool}: {m.group('message').strip()}", "nvcc"))
    return out


def _gcc_line(
    text: str, out: list[RawDiagnostic], includes: list[tuple[str, int]], context: list[str]
) -> bool:
    """One gcc-style line: a diagnostic, a note, or a chain line kept for the next diagnostic."""
    m = GCC_INCLUDED.match(text)
    if m and (text.startswith("In file included") or includes):
        includes.append((m.group("file").strip(), int(m.group("line"))))
        return True
    m = GCC_CONTEXT.match(text)
    if m:
        context.append(f"{m.group('file')}: {m.group('text')}")
        return True
    m = GCC_REQUIRED.match(text)
    if m:
        context.append(f"{m.group('file')}:{m.group('line')}: {m.group('text')}")
        context.append(f"\x00{m.group('file')}\x00{m.group('line')}")
        return True
    m = GCC_LINE.match(text)
    if not m:
        return False
    severity = _severity(m.group("severity"))
    column = int(m.group("column")) - 1 if m.group("column") else None
    if severity == "note" and out:
        out[-1].notes.append(f"{m.group('file')}:{m.group('line')}: note: {m.group('message').strip()}")
        return True
    message = m.group("message").strip()
    if m.group("severity") == "fatal error":
        message = "fatal error: " + message
    diag = RawDiagnostic(m.group("file"), int(m.group("line")), severity, message, "host compiler", column)
    for item in context:
        if item.startswith("\x00"):
            _, file, line = item.split("\x00")
            diag.sites.append((file, int(line), "instantiation"))
        else:
            diag.notes.append(item)
    diag.sites += [(file, line, "include") for file, line in includes]
    includes.clear()
    context.clear()
    out.append(diag)
    return True


def _edg_tail(lines: Sequence[str], i: int, diag: RawDiagnostic) -> int:
    """Read what follows an EDG header line (continuations, source and caret, instantiation chain) up to
    the blank line that ends it; returns the index of the next unread line."""
    block: list[str] = []
    while i < len(lines) and lines[i].strip() and not EDG_LINE.match(lines[i]):
        block.append(lines[i])
        i += 1
    caret = next((k for k, line in enumerate(block) if _CARET.match(line)), None)
    if caret is not None and caret >= 1:
        diag.column = max(0, block[caret].index("^") - 2)
        before, after = block[: caret - 1], block[caret + 1 :]
    else:
        before, after = [], block
    diag.notes += [line.strip() for line in before if line.strip()]
    for line in after:
        m = EDG_DURING.match(line)
        if m and m.group("line"):
            diag.sites.append((m.group("file") or diag.file, int(m.group("line")), "instantiation"))
        if line.strip() and line.strip() != "detected during:":
            diag.notes.append(line.strip())
    return i


@dataclass(frozen=True)
class FileMapping:
    """How to recognise the user's file in a log and where its lines go.

    ``is_user(path)``: whether a path printed by the compiler is the user's file (the temporary copy, or
    the name a ``#line`` gave it); ``line_map[i]``: 0-based user line of 0-based compiled line ``i`` (None:
    the same); ``include_site(header)``: the 0-based user line of the ``#include`` that leads to a header,
    or None; ``ptx_line(ptx, line)``: the 1-based user line a PTX line came from, or None."""

    is_user: Callable[[str | None], bool]
    display_name: str
    line_map: Sequence[int] | None = None
    include_site: Callable[[str], int | None] | None = None
    ptx_line: Callable[[str, int], int | None] | None = None

    def user_line(self, line1: int) -> int | None:
        line0 = line1 - 1
        if self.line_map is None:
            return line0
        return self.line_map[line0] if 0 <= line0 < len(self.line_map) else None


def to_diagnostics(raw: Sequence[RawDiagnostic], mapping: FileMapping) -> list[dict[str, Any]]:
    """The verdict's diagnostics: one per error or warning, on the user's file, each (line, message) once."""
    out: list[dict[str, Any]] = []
    seen: set[tuple[int, str]] = set()
    for diag in raw:
        entry = _on_user_file(diag, mapping)
        if entry is None:
            continue
        key = (entry["line"], entry["message"])
        if key not in seen:
            seen.add(key)
            out.append(entry)
    return out


def _on_user_file(diag: RawDiagnostic, mapping: FileMapping) -> dict[str, Any] | None:
    base = {"severity": diag.severity, "source": diag.source, "notes": list(diag.notes)}
    if diag.file is not None and diag.line is not None and mapping.is_user(diag.file):
        line = mapping.user_line(diag.line)
        # a line outside the map was added by the extraction (a preamble): nothing of the user's to show
        return (
            None if line is None else {"line": line, "message": diag.message, "column": diag.column, **base}
        )
    for file, line1, kind in diag.sites:
        if kind == "ptx" and mapping.ptx_line is not None and file is not None:
            user = mapping.ptx_line(file, line1)
            if user is not None:
                return {"line": user - 1, "message": diag.message, "column": None, **base}
    if diag.file is None or diag.line is None or diag.severity != "error":
        return None  # nowhere to put it (the message and the log carry it), or a header's warning
    header = {"path": diag.file, "line": diag.line - 1, "column": diag.column}
    where = f"{os.path.basename(diag.file)}:{diag.line}"
    # the innermost site in the user's file: the instantiation or include nearest to the error
    for file, line1, kind in diag.sites:
        if kind in ("instantiation", "include") and mapping.is_user(file):
            line = mapping.user_line(line1)
            if line is None:
                continue
            how = (
                f"instantiated at line {line + 1}"
                if kind == "instantiation"
                else f"included at line {line + 1}"
            )
            return {
                "line": line,
                "message": f"{diag.message} (in {where}, {how})",
                "column": None,
                "header": header,
                **base,
            }
    site = mapping.include_site(diag.file) if mapping.include_site is not None else None
    if site is None:
        return {
            "line": 0,
            "message": f"{diag.message} (in {where})",
            "column": None,
            "header": header,
            **base,
        }
    message = f"{diag.message} (in header {where}, included at line {site + 1})"
    return {"line": site, "message": message, "column": None, "header": header, **base}


def rewrite_paths(log: str, names: dict[str, str]) -> str:
    """``log`` with each path of ``names`` replaced by its display name (whole paths only)."""
    for path, name in sorted(names.items(), key=lambda kv: -len(kv[0])):
        if path:
            log = re.sub(re.escape(path) + r'(?=[(:"\s,]|$)', name.replace("\\", "\\\\"), log, flags=re.M)
    return log


def format_diagnostic(display_name: str, diag: dict[str, Any]) -> str:
    """``name(12): error: text``: the one-line form messages use (1-based line)."""
    return f"{display_name}({diag['line'] + 1}): {diag['severity']}: {diag['message']}"


_INCLUDE_LINE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"\r\n]+)[>"]')


def include_site_finder(
    text: str, user_folder: str | None, include_dirs: Sequence[str]
) -> Callable[[str], int | None]:
    """A function giving, for a header path, the 0-based line of the user's ``#include`` through which the
    header is read (directly, or through the headers it includes, resolved against the user's folder and
    the command's include folders; system headers are not followed)."""
    from dice.validator.compdb import quoted_and_angled_includes

    tops: list[tuple[int, str]] = []
    for n, line in enumerate(text.splitlines()):
        m = _INCLUDE_LINE.match(line)
        if m:
            tops.append((n, m.group(1).strip()))
    dirs = [d for d in include_dirs if d]

    def resolve(name: str, here: str | None) -> str | None:
        for folder in ([here] if here else []) + dirs:
            candidate = os.path.join(folder, name)
            if os.path.isfile(candidate):
                return os.path.realpath(candidate)
        return None

    def find(header: str) -> int | None:
        target = os.path.realpath(header) if os.path.isabs(header) else None
        for line, name in tops:
            start = resolve(name, user_folder)
            if start is None:
                continue
            seen: set[str] = set()
            stack = [start]
            while stack and len(seen) < 400:
                path = stack.pop()
                if path in seen:
                    continue
                seen.add(path)
                if (target and path == target) or (not target and Path(path).name == Path(header).name):
                    return line
                here = os.path.dirname(path)
                stack += [p for p in (resolve(n, here) for n in quoted_and_angled_includes(path)) if p]
        return None

    return find


_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)")
_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]+)"')


def ptx_line_finder(is_user: Callable[[str | None], bool], keep_dir: str) -> Callable[[str, int], int | None]:
    """A function mapping (PTX path printed by ptxas, 1-based PTX line) to the 1-based user line of the
    last ``.loc`` before it, using the PTX file nvcc kept in ``keep_dir`` (None when it cannot tell)."""

    def find(ptx: str, line1: int) -> int | None:
        path = ptx if os.path.isfile(ptx) else os.path.join(keep_dir, os.path.basename(ptx))
        try:
            lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return None
        files = {m.group(1): m.group(2) for m in map(_FILE.match, lines) if m}
        for text in reversed(lines[: max(0, line1 - 1)]):
            m = _LOC.match(text)
            if m:
                return int(m.group(2)) if is_user(files.get(m.group(1))) else None
        return None

    return find


# --------------------------------------------------------------------------------------------- redaction
# Compilers echo the source line of each diagnostic, so `#include "/any/local/file"` in a candidate would
# quote that file into the verdict's log. Lines of files outside the allowed roots (the user's folder, the
# include path, the system's CUDA/C++/torch/Python headers) are replaced; the message and location stay.
REDACTED = "[source line not shown: {name} is outside the project and its include path]"
SYSTEM_HEADER_ROOTS = ("/usr/include", "/usr/local/include", "/usr/lib/gcc", "/usr/local/cuda", "/opt/cuda")
_GCC_GUTTER = re.compile(r"^(?P<gutter>\s*\d*\s*\|)(?P<text>.*)$")  # gcc >= 9: "   12 | text", "      |  ^~"
_MARKS_ONLY = re.compile(r"^[\s^~|+-]*$")  # caret and range marks: positions, no text of the file
_QUOTED = re.compile(r"\"([^\"\n]+)\"|'([^'\n]+)'|\u2018([^\u2019\n]+)\u2019")


@functools.lru_cache(maxsize=1)
def system_header_roots() -> tuple[str, ...]:
    """The folders of the CUDA, C++, torch and Python headers a compile may read and quote."""
    import importlib.util
    import sysconfig

    from dice.validator.paths import cuda_include_dirs, pip_cuda_include_dir, toolkit_include_dir

    roots = [*SYSTEM_HEADER_ROOTS, *cuda_include_dirs()]
    roots += [d for d in (toolkit_include_dir(), pip_cuda_include_dir()) if d]
    roots.append(sysconfig.get_paths().get("include", ""))
    spec = importlib.util.find_spec("torch")  # finds the package without importing it
    if spec is not None and spec.origin:
        roots.append(os.path.join(os.path.dirname(spec.origin), "include"))
    return tuple(dict.fromkeys(os.path.realpath(r) for r in roots if r))


def outside_source_checker(
    roots: Sequence[str], *, cwd: str, own: Sequence[str] = ()
) -> Callable[[str], bool]:
    """A function telling whether a file name printed by a compiler is outside ``roots`` (plus the system
    header roots). ``own``: names of the compiler's own inputs (the temporary source, the user's file, an
    in-memory program), never outside. A relative name is tried against ``cwd`` and each root; a name that
    is no file there (nothing shows where it came from) counts as outside, as does one that resolves
    outside any root (through ``..`` or symlinks too)."""
    real_roots = [os.path.realpath(r) for r in roots if r] + list(system_header_roots())
    own_names = {n for n in own if n}
    seen: dict[str, bool] = {}

    def inside(real: str) -> bool:
        return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in real_roots)

    def outside(name: str) -> bool:
        if name in own_names:
            return False
        if name not in seen:
            tries = [name] if os.path.isabs(name) else [os.path.join(d, name) for d in (cwd, *roots) if d]
            found = [os.path.realpath(t) for t in tries if os.path.exists(t)]
            seen[name] = not found or not all(inside(real) for real in found)
        return seen[name]

    return outside


def redact_outside_sources(log: str, outside: Callable[[str], bool]) -> str:
    """``log`` with the source lines compilers echo under diagnostics in files where ``outside(file)``
    holds replaced, and fragments of those lines quoted in the diagnostics' messages replaced by ``…``
    (``identifier "hunter2" is undefined``), as are the declarations gcc's context lines quote (``x.h: In
    function '…':``). Locations, messages and caret lines stay. Reads EDG (NVRTC, cudafe++) and gcc
    output (with or without line-number gutters)."""
    lines = log.splitlines()
    i = 0
    while i < len(lines):
        context = GCC_CONTEXT.match(lines[i])
        if context and outside(context.group("file").strip()):
            # "x.h: In function 'int secret()':" names a declaration of the file: hidden whole
            lines[i] = _QUOTED.sub(functools.partial(_hide_quoted, texts=None), lines[i])
            i += 1
            continue
        m = EDG_LINE.match(lines[i]) or GCC_LINE.match(lines[i])
        name = m.group("file") if m else None
        if not name or not outside(name):
            i += 1
            continue
        end = _diagnostic_end(lines, i, gcc=not EDG_LINE.match(lines[i]))
        echoed = _echoed_lines(lines, i, end)
        texts = [lines[k] for k in echoed]
        for k in echoed:
            g = _GCC_GUTTER.match(lines[k])
            indent = g.group("gutter") + " " if g else lines[k][: len(lines[k]) - len(lines[k].lstrip())]
            lines[k] = indent + REDACTED.format(name=name)
        for k in range(i, end):
            if k not in echoed:
                lines[k] = _QUOTED.sub(functools.partial(_hide_quoted, texts=texts), lines[k])
        i = end
    return "\n".join(lines)


def _diagnostic_end(lines: Sequence[str], i: int, *, gcc: bool) -> int:
    """The index after diagnostic ``i``'s own lines: up to a blank line or the next diagnostic (EDG), or
    over the gutter / source-and-caret lines that follow it (gcc)."""
    j = i + 1
    if not gcc:
        while j < len(lines) and lines[j].strip() and not EDG_LINE.match(lines[j]):
            j += 1
        return j
    while j < len(lines) and _GCC_GUTTER.match(lines[j]):
        j += 1
    if j == i + 1 and j + 1 < len(lines) and _MARKS_ONLY.match(lines[j + 1]) and "^" in lines[j + 1]:
        j += 2  # gcc without gutters: the source line, then the caret line
    return j


def _echoed_lines(lines: Sequence[str], i: int, end: int) -> set[int]:
    """Which of lines ``i+1 .. end-1`` quote the file: the line above each caret line (EDG and gcc without
    gutters), every gutter line that is not marks only (gcc)."""
    echoed: set[int] = set()
    for k in range(i + 1, end):
        g = _GCC_GUTTER.match(lines[k])
        if g:
            if not _MARKS_ONLY.match(g.group("text")):
                echoed.add(k)
        elif _MARKS_ONLY.match(lines[k]) and "^" in lines[k] and k - 1 > i:
            echoed.add(k - 1)
    return echoed


def _hide_quoted(match: re.Match[str], texts: Sequence[str] | None) -> str:
    """The quoted fragment with its text replaced by ``…`` when it occurs in one of ``texts`` (always
    when ``texts`` is None)."""
    inner = next(g for g in match.groups() if g is not None)
    if texts is not None and not any(inner in text for text in texts):
        return match.group(0)
    return match.group(0).replace(inner, "…")
