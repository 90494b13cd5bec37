"""What a BiC-RL run keeps across steps and restarts: the rollout seeds, the resumable state, where the last
checkpoint is, and which task files are KernelBench's own (never a held-out set)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path


def step_seed(seed: int, step: int, rank: int) -> int:
    """The rollout seed of one process at one step (the same after a resume)."""
    return (seed * 1_000_003 + step * 7_919 + rank * 104_729) % (2**62)


def is_kernelbench_problems_file(path: str | Path) -> bool:
    """True for KernelBench's problems file (``{level, problem_id, name, code}`` records, as
    ``dice eval kernelbench --problems-file`` and CuKe's ``heldout_problems.jsonl`` hold)."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                try:
                    record = json.loads(line)
                except ValueError:
                    return False
                return isinstance(record, dict) and {"problem_id", "code"} <= set(record)
    return False


@dataclass
class TrainerState:
    """What ``trainer_state.json`` restores besides accelerate's state: the step (the schedule position
    follows from it) and the metrics so far."""

    step: int = 0
    skipped: int = 0
    history: list[dict] = field(default_factory=list)
    eval_history: list[dict] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def read(cls, path: Path) -> TrainerState:
        return cls(**json.loads(path.read_text()))
