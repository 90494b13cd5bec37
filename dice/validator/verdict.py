"""The validation verdict: one JSON object (docs/CONTRACTS.md), the same for the CLI, the LSP and RL."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from dice.safeio import non_finite_value, strict_json

Status = Literal["correct", "incorrect", "compile_error", "runtime_error", "timeout", "rejected", "compiled"]
STATUSES: tuple[str, ...] = (
    "correct",
    "incorrect",
    "compile_error",
    "runtime_error",
    "timeout",
    "rejected",
    "compiled",
)

# Flags name things a reviewer should look at; they never change the status on their own.
FLAG_SPEEDUP_OVER_10X = "speedup_over_10x"
FLAG_CUSTOM_KERNELS_MINOR = "custom_kernels_minor"
FLAG_LAUNCH_NOT_VERIFIED = "kernel_launch_not_verified"
FLAG_NOT_RUN = "not_run"
FLAG_CACHED = "cached_verdict"
# Timing ended after the pilot rounds: the speedup so far was below the cut-off a dataset build asked for
# (``stop_below``); the speedup is the pilot's mean, the outputs were checked in the rounds that ran.
FLAG_TIMING_STOPPED = "timing_stopped_early"
# A GPU run's log line of the time it waited for and held the GPU's lock (batch.gpu_lock_seconds reads it).
GPU_LOCK_LINE = "gpu lock:"
# The workspace is not trusted: nothing from it (dice-spec, KernelBench reference or candidate) was run.
FLAG_NOT_TRUSTED = "workspace_not_trusted"
# The candidate's build was stopped by the validator's sandbox (it reached outside its task folder, e.g. a
# load_inline build_directory in /tmp): status compile_error, but nothing says the code itself is wrong.
FLAG_SANDBOX_DENIED = "sandbox_denied"
# Set by the assistant (mark_unchecked) on a fill that lies in code no compiler type-checked.
FLAG_FILL_NOT_CHECKED = "fill_not_checked"
_WORDED_FLAGS = (FLAG_NOT_RUN, FLAG_FILL_NOT_CHECKED, FLAG_NOT_TRUSTED)  # flags the label says in words
NOT_CHECKED_PREFIX = "fill not checked: "


def speedup_flags(speedup: float | None) -> tuple[list[str], str]:
    """Flags and a message suffix for a measured speedup (over 10x is flagged for review)."""
    if speedup is not None and speedup > 10:
        return [FLAG_SPEEDUP_OVER_10X], "; speedup over 10x: flagged for review"
    return [], ""


MAX_LOG_CHARS = 20_000
_NUMBERS = ("speedup", "ref_ms", "new_ms", "max_abs_err")  # the float fields (NaN/inf: "non_finite" in JSON)


@dataclass
class Verdict:
    """Outcome of validating one candidate.

    ``diagnostics`` holds compiler messages already mapped to the validated file's own lines
    (0-based ``line``), so editors can show them without knowing how the device code was extracted.
    ``unchecked`` lists the code no compiler type-checked (``{"line", "end_line", "function", "reason"}``,
    0-based lines of the validated file): host code when only NVRTC ran, templates nothing instantiated.
    """

    status: Status
    compiled: bool
    correct: bool | None = None
    speedup: float | None = None
    ref_ms: float | None = None
    new_ms: float | None = None
    max_abs_err: float | None = None
    message: str = ""
    log: str = ""
    flags: list[str] = field(default_factory=list)
    diagnostics: list[dict[str, Any]] = field(default_factory=list)
    unchecked: list[dict[str, Any]] = field(default_factory=list)
    # not part of the JSON: (path, mtime_ns, size) of the project files this verdict rests on (headers nvcc
    # read, the compile database, a dice-spec's modules), so a caller's cache can tell when it is stale
    # (spec_files.stamps_current)
    depends: list[list[object]] = field(default_factory=list, compare=False, repr=False)

    @property
    def current(self) -> bool:
        """Whether every file this verdict rests on is unchanged since it was computed."""
        from dice.validator.spec_files import stamps_current

        return stamps_current(self.depends)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown verdict status {self.status!r}; expected one of {', '.join(STATUSES)}")
        if len(self.log) > MAX_LOG_CHARS:
            # Keep the head (first errors) and the tail (the final exception), drop the middle.
            half = MAX_LOG_CHARS // 2
            self.log = self.log[:half] + "\n... [log truncated] ...\n" + self.log[-half:]

    @property
    def ok(self) -> bool:
        """Compiled and, when it was run, correct (``compiled`` verdicts were not run)."""
        return self.status in ("correct", "compiled")

    def to_json(self) -> dict[str, Any]:
        """The verdict object of docs/CONTRACTS.md plus ``flags``, ``diagnostics`` and ``unchecked``.

        Strict JSON (``dice.safeio.strict_json``): a NaN or infinite number (``max_abs_err`` of a NaN
        output, ``speedup`` over a zero time) is null, named with its spelling in ``"non_finite"``
        (``{"max_abs_err": "Infinity"}``; the key is there only then); :meth:`from_json` restores it."""
        return strict_json(
            {
                "status": self.status,
                "compiled": self.compiled,
                "correct": self.correct,
                "speedup": self.speedup,
                "ref_ms": self.ref_ms,
                "new_ms": self.new_ms,
                "max_abs_err": self.max_abs_err,
                "message": self.message,
                "log": self.log,
                "flags": list(self.flags),
                "diagnostics": [dict(d) for d in self.diagnostics],
                "unchecked": [dict(u) for u in self.unchecked],
            }
        )

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Verdict:
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in obj.items() if k in names}
        for key in _NUMBERS:
            if kwargs.get(key) is not None:
                kwargs[key] = float(kwargs[key])
            else:
                kwargs[key] = non_finite_value(obj, key)
        return cls(**kwargs)

    def summary(self) -> str:
        """One human line, e.g. ``compiled ✓ · correct ✓ · 2.30× vs PyTorch`` (:func:`verdict_label`)."""
        return verdict_label(self)


def first_line(message: str | None, limit: int = 100) -> str:
    """The first non-blank line of ``message``, cut to ``limit`` characters."""
    text = (message or "").strip()
    line = text.splitlines()[0].strip() if text else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def verdict_label(verdict: Verdict | Mapping[str, Any] | None) -> str:
    """The one-line label every front end shows for a verdict (CLI, editor lens and hover, generated-file
    header, messages): "compiled ✓ · correct ✓ · 2.30× vs PyTorch", "compiled ✗", "rejected: <guard>: ..."

    It says what was checked and nothing more: "compiled ✓" only for a verdict whose code compiled, "not run"
    when it was not run. Flags a reviewer should see follow (``not_run`` is already in the words). Accepts a
    :class:`Verdict`, its JSON object, or None ("not validated").
    """
    if verdict is None:
        return "not validated"
    v = verdict.to_json() if isinstance(verdict, Verdict) else dict(verdict)
    if not v:
        return "not validated"
    status = v.get("status")
    # a run or build that failed before the compiler finished says nothing about compiling
    compiled = "compiled ✓ · " if v.get("compiled") else ""
    speedup, err = _number(v, "speedup"), _number(v, "max_abs_err")
    if status == "correct":
        text = "compiled ✓ · correct ✓"
        if isinstance(speedup, (int, float)):
            text += f" · {speedup:.2f}× vs PyTorch"
    elif status == "incorrect":
        text = "compiled ✓ · correct ✗" + (
            f" (max abs err {err:.3g})" if isinstance(err, (int, float)) else ""
        )
    elif status == "compiled" and FLAG_FILL_NOT_CHECKED in (v.get("flags") or []):
        text = f"not checked ({_not_checked_reason(v)}) · not run"
    elif status == "compiled" and FLAG_NOT_TRUSTED in (v.get("flags") or []):
        text = "compiled ✓ · not run: workspace not trusted"
    elif status == "compiled":
        text = "compiled ✓ · not run"
    elif status == "compile_error" and FLAG_SANDBOX_DENIED in (v.get("flags") or []):
        text = "not built: denied by the validator's sandbox"
    elif status == "compile_error":
        text = "compiled ✗"
    elif status == "runtime_error":
        text = f"{compiled}runtime error"
    elif status == "timeout":
        text = f"{compiled}timed out"
    elif status == "rejected":
        reason = first_line(v.get("message")).removeprefix("rejected by guard ").strip()
        text = f"rejected: {reason}" if reason else "rejected"
    else:
        text = str(status or "not validated")
    flags = [f for f in v.get("flags") or [] if not _flag_in_words(f, status)]
    if flags:
        text += " · flags: " + ", ".join(flags)
    return text


def _flag_in_words(flag: str, status: Any) -> bool:
    """Whether the label's words already say ``flag`` (then it is not listed again after them)."""
    if flag == FLAG_NOT_RUN:
        return True
    if flag in _WORDED_FLAGS:
        return status == "compiled"
    return flag == FLAG_SANDBOX_DENIED and status == "compile_error"


def _number(v: Mapping[str, Any], key: str) -> Any:
    """A number of the verdict object; one the JSON had to write as null comes back from ``non_finite``."""
    value = v.get(key)
    return non_finite_value(v, key) if value is None else value


def _not_checked_reason(v: Mapping[str, Any]) -> str:
    line = first_line(v.get("message"), limit=200)
    if line.startswith(NOT_CHECKED_PREFIX):
        return line[len(NOT_CHECKED_PREFIX) :]
    reasons = [
        u.get("reason") for u in v.get("unchecked") or [] if isinstance(u, Mapping) and u.get("reason")
    ]
    return _short_reason(str(reasons[0])) if reasons else "no compiler type-checked it"


def _short_reason(reason: str) -> str:
    """The part of an unchecked reason before its first colon: what a label has room for."""
    return reason.split(":", 1)[0].strip() or reason


def mark_unchecked(verdict: Verdict, line: int) -> Verdict:
    """A copy of ``verdict`` flagged :data:`FLAG_FILL_NOT_CHECKED` when 0-based ``line`` lies in one of its
    ``unchecked`` ranges (the first line of its message then says why); the verdict itself otherwise."""
    hit = next(
        (
            u
            for u in verdict.unchecked
            if isinstance(u.get("line"), int) and u["line"] <= line <= int(u.get("end_line", u["line"]))
        ),
        None,
    )
    if hit is None or FLAG_FILL_NOT_CHECKED in verdict.flags:
        return verdict
    copy = Verdict.from_json(verdict.to_json())
    copy.flags.append(FLAG_FILL_NOT_CHECKED)
    where = f" ({hit.get('function')}, lines {hit['line'] + 1}-{int(hit.get('end_line', hit['line'])) + 1})"
    reason = _short_reason(str(hit.get("reason") or "no compiler type-checked it"))
    copy.message = f"{NOT_CHECKED_PREFIX}{reason}\n{str(hit.get('reason'))}{where}. {verdict.message}".strip()
    return copy


def error_verdict(status: Status, message: str, log: str = "", *, compiled: bool = False) -> Verdict:
    return Verdict(status=status, compiled=compiled, correct=None, message=message, log=log)
