"""BiC-RL's data schedule: sequential = file order by level (DICE), mixed = a curriculum that moves toward
the harder levels, both a function of the step alone (resume) and logged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.rl.schedule import Schedule, level_order, level_weights

# CuKe's files are sorted by level: single op (1) -> fused (2) -> whole model (3).
CUKE_LEVELS = [1, 1, 1, 1, 2, 2, 2, 3, 3, 3]


def test_sequential_takes_the_file_order_and_wraps_round() -> None:
    sched = Schedule(CUKE_LEVELS, kind="sequential", tasks_per_step=4, steps=4)
    assert not sched.reordered
    assert [p.indices for p in sched.plans()] == [
        (0, 1, 2, 3),
        (4, 5, 6, 7),
        (8, 9, 0, 1),  # after the last task the order starts again
        (2, 3, 4, 5),
    ]
    assert sched.level_mix(sched.plan(2)) == "2:3 3:1"
    assert sched.plan(1).share(0, 2) == (0, 2) and sched.plan(1).share(1, 2) == (1, 3)


def test_sequential_runs_easy_before_hard_when_files_are_not_sorted() -> None:
    """Two files (e2e levels 3, 1; then 2) or an unsorted file: stable-sorted by level, file order kept
    within a level; a task without a level (a .cu hole) counts as a single op."""
    levels = [3, 1, 2, 1, None, 3]
    assert level_order(levels) == [1, 3, 4, 2, 0, 5]
    sched = Schedule(levels, kind="sequential", tasks_per_step=6, steps=1)
    assert sched.reordered and sched.plan(1).indices == (1, 3, 4, 2, 0, 5)
    assert [sched.levels[i] for i in sched.plan(1).indices] == [1, 1, 1, 2, 3, 3]


def test_mixed_curriculum_moves_toward_harder_levels() -> None:
    levels = [1] * 40 + [2] * 40 + [3] * 40
    sched = Schedule(levels, kind="mixed", tasks_per_step=16, steps=20, seed=3)
    means = [sched.mean_level(p) for p in sched.plans()]
    early, late = sum(means[:5]) / 5, sum(means[-5:]) / 5
    assert early < 1.6 and late > 2.4, (early, late)
    # it mixes: the first steps already see some harder tasks, the last some easier ones
    assert any(sched.levels[i] > 1 for p in sched.plans()[:5] for i in p.indices)
    assert any(sched.levels[i] < 3 for p in sched.plans()[-5:] for i in p.indices)
    # each level's tasks are taken in file order
    taken_level_2 = [i for p in sched.plans() for i in p.indices if sched.levels[i] == 2]
    assert taken_level_2[:40] == sorted(taken_level_2[:40])
    # the same seed gives the same plan (a resumed run recomputes it); another seed another
    again = Schedule(levels, kind="mixed", tasks_per_step=16, steps=20, seed=3)
    assert again.plans() == sched.plans()
    assert Schedule(levels, kind="mixed", tasks_per_step=16, steps=20, seed=4).plans() != sched.plans()


def test_level_weights_peak_at_the_moving_target() -> None:
    start, end = level_weights([1, 2, 3], 0.0, 2.0), level_weights([1, 2, 3], 1.0, 2.0)
    assert start[0] > start[1] > start[2] and end[2] > end[1] > end[0]
    assert sum(start) == pytest.approx(1.0)
    assert level_weights([1, 2, 3], 0.3, 0.0) == pytest.approx([1 / 3] * 3)  # sharpness 0: uniform
    assert level_weights([2], 0.5, 2.0) == [1.0]


def test_the_plan_is_logged(tmp_path: Path) -> None:
    sched = Schedule(CUKE_LEVELS, kind="sequential", tasks_per_step=3, steps=2)
    sched.write(tmp_path / "schedule.jsonl", [f"task{i}" for i in range(10)])
    rows = [json.loads(line) for line in (tmp_path / "schedule.jsonl").read_text().splitlines()]
    assert rows[1] == {
        "step": 2,
        "levels": "1:1 2:2",
        "mean_level": 1.6667,
        "tasks": ["task3", "task4", "task5"],
    }


def test_bad_schedules_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown schedule"):
        Schedule([1], kind="random", tasks_per_step=1, steps=1)
    with pytest.raises(ValueError, match="no tasks"):
        Schedule([], kind="sequential", tasks_per_step=1, steps=1)
    with pytest.raises(IndexError):
        Schedule([1], kind="sequential", tasks_per_step=1, steps=2).plan(3)
