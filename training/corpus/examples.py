"""The corpus record: one chat example, and the ``.jsonl(.gz)`` files that hold them."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

TASKS = ("kernelbench", "dice_infill", "cu_infill")


@dataclass(frozen=True)
class Example:
    """One chat example. ``prompt`` is the rendered ChatML prompt up to and including the assistant header
    (and the template's response prefix); ``response`` is the text the model must produce."""

    id: str
    group: str  # problem key "L{level}P{id}": the unit of the held-out split
    task: str  # one of TASKS
    source: str  # data folder (and kind for generated examples)
    prompt: str
    response: str
    meta: dict | None = None  # for evaluation: prefix/middle/suffix of infill examples

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Example:
        return cls(**json.loads(line))


def open_text(path: Path, mode: str = "rt"):
    """A text file, gzip-compressed when the name ends in ``.gz``."""
    if str(path).endswith(".gz"):
        import gzip

        return gzip.open(path, mode, encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def read_examples(path: Path) -> list[Example]:
    """Examples from a .jsonl (or .jsonl.gz) file."""
    with open_text(Path(path)) as fh:
        return [Example.from_json(line) for line in fh if line.strip()]
