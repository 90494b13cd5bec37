"""Ranking of candidates: compiled > correct > faster > model confidence."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from dice.validator.verdict import FLAG_FILL_NOT_CHECKED

if TYPE_CHECKING:
    from dice.validator import Verdict

T = TypeVar("T")


def rank_key(verdict: Verdict | None, confidence: float) -> tuple[int, int, float, float]:
    """Sort key, larger is better. A rejected candidate (a guard fired) never counts as correct; a missing
    speedup sorts below any measured one; an unvalidated candidate ranks below a compiled one."""
    # a fill in code no compiler type-checked does not count as compiled (dice.validator.verdict)
    compiled = bool(verdict is not None and verdict.compiled and FLAG_FILL_NOT_CHECKED not in verdict.flags)
    correct = bool(verdict is not None and verdict.correct is True and verdict.status == "correct")
    speedup = verdict.speedup if verdict is not None and verdict.speedup is not None else -math.inf
    if not correct:
        speedup = -math.inf  # speed of a wrong kernel is no merit
    conf = confidence if math.isfinite(confidence) else -math.inf
    return (int(compiled), int(correct), speedup, conf)


def rank(items: Sequence[T], verdicts: Sequence[Verdict | None], confidences: Sequence[float]) -> list[int]:
    """Indices of ``items`` best first; ties keep the original order (greedy candidate first)."""
    order = sorted(range(len(items)), key=lambda i: rank_key(verdicts[i], confidences[i]), reverse=True)
    return order
