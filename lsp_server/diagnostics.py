"""Diagnostics: masks as information, and compile errors of the last validation mapped back to file lines."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from lsprotocol import types

from lsp_server.verdicts import verdict_json

SOURCE = "dice"
FILL_HINT = "“DICE: Fill this mask”"

# NVRTC / nvcc report "<name>(<1-based line>): error: <text>" (CuPy keeps the lines in its log).
_COMPILER_LINE = re.compile(
    r"^(?P<file>[^\n()]*)\((?P<line>\d+)\):\s*(?P<severity>catastrophic error|error|warning|remark)\s*:?\s*"
    r"(?P<message>.*)$",
    re.MULTILINE,
)


def lsp_range(rng: Any) -> types.Range:
    """An lsprotocol Range from a ``dice.cuda_source.Range`` (same fields, its own frozen dataclass)."""
    if isinstance(rng, types.Range):
        return rng
    return types.Range(
        start=types.Position(line=rng.start.line, character=rng.start.character),
        end=types.Position(line=rng.end.line, character=rng.end.character),
    )


def mask_diagnostics(masks: Sequence[Any]) -> list[types.Diagnostic]:
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


def compile_error_diagnostics(
    text: str, verdict: Any, line_map: Sequence[int] | None = None, *, first_source_line: int = 1
) -> list[types.Diagnostic]:
    """Diagnostics for the compiler lines of a verdict's log.

    ``line_map[i]`` is the file line of line ``i`` of the compiled source (``extract_device_code``);
    ``first_source_line`` is the 1-based compiler line that holds that source's line 0 (a preamble shifts it).
    Lines that map nowhere land on line 0 so the error is still visible.
    """
    v = verdict_json(verdict)
    log = "\n".join(str(part) for part in (v.get("log"), v.get("message")) if part)
    if not log:
        return []
    lines = text.splitlines() or [""]
    seen: set[tuple[int, str]] = set()
    out: list[types.Diagnostic] = []
    for match in _COMPILER_LINE.finditer(log):
        compiled_line = int(match.group("line")) - first_source_line
        if line_map is None:
            file_line = compiled_line
        elif 0 <= compiled_line < len(line_map):
            file_line = line_map[compiled_line]
        else:
            file_line = -1
        if not 0 <= file_line < len(lines):
            file_line = 0
        message = match.group("message").strip()
        if (file_line, message) in seen:
            continue
        seen.add((file_line, message))
        severity = (
            types.DiagnosticSeverity.Warning
            if match.group("severity") in ("warning", "remark")
            else types.DiagnosticSeverity.Error
        )
        line_text = lines[file_line]
        indent = len(line_text) - len(line_text.lstrip())
        out.append(
            types.Diagnostic(
                range=types.Range(
                    start=types.Position(line=file_line, character=_utf16_len(line_text[:indent])),
                    end=types.Position(line=file_line, character=_utf16_len(line_text)),
                ),
                message=message,
                severity=severity,
                source=f"{SOURCE} (nvrtc)",
                code="compile",
            )
        )
    if not out and v.get("status") == "compile_error":
        out.append(
            types.Diagnostic(
                range=types.Range(
                    start=types.Position(line=0, character=0), end=types.Position(line=0, character=0)
                ),
                message=str(v.get("message") or "compilation failed"),
                severity=types.DiagnosticSeverity.Error,
                source=f"{SOURCE} (nvrtc)",
                code="compile",
            )
        )
    return out


def _utf16_len(s: str) -> int:
    return len(s.encode("utf-16-le")) // 2
