"""Diagnostics: masks as information, and compile errors of the last validation mapped back to file lines."""

from __future__ import annotations

import re
from collections.abc import Sequence

from lsprotocol import types

from dice.cuda_source import MalformedMask, Mask
from dice.validator import Verdict
from lsp_server.convert import lsp_range
from lsp_server.verdicts import verdict_json

SOURCE = "dice"
FILL_HINT = "“DICE: Fill this mask”"

# NVRTC / nvcc report "<name>(<1-based line>): error: <text>" (CuPy keeps the lines in its log).
_COMPILER_LINE = re.compile(
    r"^(?P<file>[^\n()]*)\((?P<line>\d+)\):\s*(?P<severity>catastrophic error|error|warning|remark)\s*:?\s*"
    r"(?P<message>.*)$",
    re.MULTILINE,
)


def mask_diagnostics(masks: Sequence[Mask]) -> list[types.Diagnostic]:
    """One information diagnostic per ``dice.cuda_source.Mask``, in file order."""
    out: list[types.Diagnostic] = []
    for mask in masks:
        where = f" in {mask.kind} function `{mask.function}`" if mask.function else ""
        budget = f", up to {mask.budget} tokens" if mask.budget else ""
        out.append(
            types.Diagnostic(
                range=lsp_range(mask.range),
                message=f"DICE mask #{mask.index}{where}{budget}: accept a suggestion or run {FILL_HINT}",
                severity=types.DiagnosticSeverity.Information,
                source=SOURCE,
                code="mask",
            )
        )
    return out


def malformed_mask_diagnostics(malformed: Sequence[MalformedMask]) -> list[types.Diagnostic]:
    """A warning per comment that looks like a mask but is not one (it is never filled)."""
    return [
        types.Diagnostic(
            range=lsp_range(m.range),
            message=f"not a DICE mask: {m.reason} (write <MASK> or <MASK:N> with N >= 1)",
            severity=types.DiagnosticSeverity.Warning,
            source=SOURCE,
            code="malformed-mask",
        )
        for m in malformed
    ]


def compile_error_diagnostics(text: str, verdict: Verdict | None) -> list[types.Diagnostic]:
    """Diagnostics for the compiler messages of a verdict, on the validated file's lines.

    The validator maps every compiler message to the file (``verdict.diagnostics``: 0-based ``line`` and
    optional ``column``, ``severity``, ``message``, ``source`` ("nvcc", "nvrtc", "host compiler"), ``notes``
    and, for an error inside a header, ``header`` {path, line, column}: the diagnostic then sits on the
    ``#include`` or instantiation line of this file). Older verdicts without them fall back to the
    ``file(line): error`` lines of the log. Lines outside the text land on line 0 so the error stays visible.
    """
    v = verdict_json(verdict)
    entries = [
        d for d in v.get("diagnostics") or [] if isinstance(d, dict) and isinstance(d.get("line"), int)
    ]
    if not entries:
        log = "\n".join(str(part) for part in (v.get("log"), v.get("message")) if part)
        entries = [
            {"line": int(m.group("line")) - 1, "severity": m.group("severity"), "message": m.group("message")}
            for m in _COMPILER_LINE.finditer(log)
        ]
    lines = text.splitlines() or [""]
    seen: set[tuple[int, str]] = set()
    out: list[types.Diagnostic] = []
    for d in entries:
        message = _message(d)
        file_line = d["line"] if 0 <= d["line"] < len(lines) else 0
        if (file_line, message) in seen:
            continue
        seen.add((file_line, message))
        out.append(
            types.Diagnostic(
                range=_line_range(lines[file_line], file_line, d.get("column")),
                message=message,
                severity=types.DiagnosticSeverity.Warning
                if d.get("severity") in ("warning", "remark")
                else types.DiagnosticSeverity.Error,
                source=f"{SOURCE} ({d.get('source') or 'nvrtc'})",
                code="compile",
            )
        )
    if not out and v.get("status") == "compile_error":
        origin = types.Position(line=0, character=0)
        out.append(
            types.Diagnostic(
                range=types.Range(start=origin, end=origin),
                message=str(v.get("message") or "compilation failed"),
                severity=types.DiagnosticSeverity.Error,
                source=SOURCE,
                code="compile",
            )
        )
    return out


def _message(d: dict) -> str:
    """The message, where it really is when that is a header, and the compiler's notes (instantiation
    chains, "declared here") on the lines after it."""
    message = str(d.get("message", "")).strip()
    header = d.get("header")
    if isinstance(header, dict) and header.get("path"):
        where = f"{header['path']}:{int(header.get('line', 0)) + 1}"
        message = f"{message} (in {where})"
    notes = [str(n).strip() for n in d.get("notes") or [] if str(n).strip()]
    return "\n".join([message, *notes])


def _line_range(line_text: str, line: int, column: object) -> types.Range:
    """From the column the compiler gave (else the first non-blank character) to the end of the line."""
    if isinstance(column, int) and 0 <= column <= len(line_text):
        start = column
    else:
        start = len(line_text) - len(line_text.lstrip())
    return types.Range(
        start=types.Position(line=line, character=_utf16_len(line_text[:start])),
        end=types.Position(line=line, character=_utf16_len(line_text)),
    )


def _utf16_len(s: str) -> int:
    return len(s.encode("utf-16-le")) // 2
