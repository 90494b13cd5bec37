"""One-line labels for verdicts ("compiled ✓ · correct ✓ · 2.3×"), shared by lens, hover and messages.

Verdicts arrive as ``dice.validator.Verdict`` objects or as their DESIGN.md JSON dicts; both are accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def verdict_json(verdict: Any) -> dict[str, Any]:
    """The DESIGN.md verdict object of a ``Verdict`` (or a dict that already is one)."""
    if verdict is None:
        return {}
    if isinstance(verdict, Mapping):
        return dict(verdict)
    to_json = getattr(verdict, "to_json", None)
    if callable(to_json):
        return dict(to_json())
    raise TypeError(f"not a verdict: {type(verdict).__name__}")


def verdict_label(verdict: Any) -> str:
    """A short human label; the exact wording clients show next to a filled region."""
    v = verdict_json(verdict)
    if not v:
        return "not validated"
    status = v.get("status")
    speedup = v.get("speedup")
    if status == "correct":
        parts = ["compiled ✓", "correct ✓"]
        if isinstance(speedup, (int, float)):
            parts.append(f"{speedup:.1f}×")
        return " · ".join(parts)
    if status == "incorrect":
        err = v.get("max_abs_err")
        detail = f" (max err {err:.2g})" if isinstance(err, (int, float)) else ""
        return f"compiled ✓ · correct ✗{detail}"
    if status == "compiled":
        return "compiled ✓ · not run"
    if status == "compile_error":
        return "compiled ✗"
    if status == "runtime_error":
        return "compiled ✓ · runtime error"
    if status == "timeout":
        return "timed out"
    if status == "rejected":
        message = v.get("message") or "static guard"
        return f"rejected: {message}"
    if status in (None, "skipped", "not_validated"):
        return "not validated"
    return str(status)


def is_usable(verdict: Any, validation_level: str) -> bool:
    """Whether a candidate may be written into the user's file: it compiled, or validation is off."""
    if validation_level == "none":
        return True
    v = verdict_json(verdict)
    return bool(v.get("compiled")) and v.get("status") not in ("rejected", "incorrect")
