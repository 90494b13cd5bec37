"""BiC-RL's data schedule: which tasks each step takes.

- ``sequential`` (DICE): the tasks in file order, which CuKe sorted by level (single op -> fused ops -> whole
  model). The order is stable-sorted by level here too, so several task files, or a file sorted otherwise,
  still run easy before hard; within a level the file order is kept. Step ``s`` (1-based) takes the next
  ``tasks_per_step`` tasks, wrapping round to the start after the last one.
- ``mixed``: a curriculum. Every slot of a step draws a level with a probability that peaks at a target
  level moving from the easiest to the hardest over the steps (``p(level i) ~ exp(-sharpness * |i - c|)``,
  ``c`` the target's index, from 0 at the first step to the last index at the last step), then takes that
  level's next task in file order (each level wraps round on its own).

The plan depends only on the task levels, the config and the seed, so a resumed run recomputes it and
continues at its step: the schedule position is the step. ``schedule.jsonl`` logs it.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# A task with no level (a .cu infill hole: one kernel) is scheduled as a single op.
DEFAULT_LEVEL = 1


@dataclass(frozen=True)
class StepPlan:
    step: int  # 1-based
    indices: tuple[int, ...]  # into the task list, in the order the step takes them

    def share(self, rank: int, world: int) -> tuple[int, ...]:
        """This process's tasks of the step (every ``world``-th from ``rank``)."""
        return self.indices[rank::world]


def level_of(level: int | None) -> int:
    return DEFAULT_LEVEL if level is None else int(level)


def level_order(levels: Sequence[int | None]) -> list[int]:
    """Task indices stable-sorted by level (file order within a level)."""
    return sorted(range(len(levels)), key=lambda i: level_of(levels[i]))


def level_weights(levels: Sequence[int], progress: float, sharpness: float) -> list[float]:
    """The mixed schedule's probability of each of ``levels`` (sorted) at ``progress`` in [0, 1]."""
    if len(levels) == 1:
        return [1.0]
    target = progress * (len(levels) - 1)
    raw = [math.exp(-sharpness * abs(i - target)) for i in range(len(levels))]
    total = sum(raw)
    return [w / total for w in raw]


class Schedule:
    """``plan(step)``: the tasks of a step; ``plans()``: all of them."""

    def __init__(
        self,
        levels: Sequence[int | None],
        *,
        kind: str,
        tasks_per_step: int,
        steps: int,
        seed: int = 0,
        sharpness: float = 2.0,
    ) -> None:
        if not levels:
            raise ValueError("no tasks to schedule")
        if kind not in ("sequential", "mixed"):
            raise ValueError(f"unknown schedule {kind!r}: use sequential or mixed")
        self.levels = [level_of(x) for x in levels]
        self.kind = kind
        self.tasks_per_step = tasks_per_step
        self.steps = steps
        self.order = level_order(levels)
        self.reordered = self.order != list(range(len(levels)))  # the files were not sorted by level
        self._plans = self._sequential() if kind == "sequential" else self._mixed(seed, sharpness)

    def _sequential(self) -> list[StepPlan]:
        n, t = len(self.order), self.tasks_per_step
        return [
            StepPlan(s + 1, tuple(self.order[(s * t + k) % n] for k in range(t))) for s in range(self.steps)
        ]

    def _mixed(self, seed: int, sharpness: float) -> list[StepPlan]:
        by_level: dict[int, list[int]] = {}
        for i in self.order:
            by_level.setdefault(self.levels[i], []).append(i)
        names = sorted(by_level)
        cursor = dict.fromkeys(names, 0)
        rng = random.Random(f"dice-rl-schedule:{seed}")
        plans = []
        for s in range(self.steps):
            weights = level_weights(names, s / max(1, self.steps - 1), sharpness)
            picked = []
            for level in rng.choices(names, weights=weights, k=self.tasks_per_step):
                pool = by_level[level]
                picked.append(pool[cursor[level] % len(pool)])
                cursor[level] += 1
            plans.append(StepPlan(s + 1, tuple(picked)))
        return plans

    def plan(self, step: int) -> StepPlan:
        """The plan of 1-based ``step``."""
        if not 1 <= step <= self.steps:
            raise IndexError(f"step {step} outside 1..{self.steps}")
        return self._plans[step - 1]

    def plans(self) -> list[StepPlan]:
        return list(self._plans)

    def level_mix(self, plan: StepPlan) -> str:
        """``"1:40 2:20 3:4"``: how many tasks of each level the step takes (a metrics column)."""
        counts = Counter(self.levels[i] for i in plan.indices)
        return " ".join(f"{level}:{counts[level]}" for level in sorted(counts))

    def mean_level(self, plan: StepPlan) -> float:
        return sum(self.levels[i] for i in plan.indices) / len(plan.indices)

    def write(self, path: Path, ids: Sequence[str]) -> None:
        """``schedule.jsonl``: one line per step with its task ids and level mix."""
        with open(path, "w") as fh:
            for p in self._plans:
                row = {
                    "step": p.step,
                    "levels": self.level_mix(p),
                    "mean_level": round(self.mean_level(p), 4),
                    "tasks": [ids[i] for i in p.indices],
                }
                fh.write(json.dumps(row) + "\n")
