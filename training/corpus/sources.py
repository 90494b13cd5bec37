"""Reading the sources in ``../shared/data`` (each folder's SOURCE.md gives licence and schema; all MIT).

- ``kernelbench-pr67-dsr1``: KernelBench prompt -> DeepSeek-R1 ``ModelNew`` answers (KernelBench v0, L1/L2).
- ``cuda-l1``: KernelBench v0 reference -> CUDA-L1 optimized ``ModelNew`` (H100 and A100 releases).
- ``kernelbench``: current KernelBench problems (reference code only: tokenizer text, and the whole-program
  prompt of a problem whose v0 twin has a solution).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Solution:
    group: str
    source: str
    ref_src: str  # the PyTorch reference (class Model ...)
    program: str | None  # the ModelNew program (plain python, no fences), None for reference-only records


def problem_key(level: int, problem_id: int | str) -> str:
    return f"L{int(level)}P{int(problem_id)}"


def _extract_reference(question: str) -> str | None:
    """The reference architecture from a KernelBench prompt: the last code fence before 'Optimize ...'."""
    head = question.split("Optimize the architecture named Model", 1)[0]
    blocks = re.findall(r"```(?:python)?\n?(.*?)```", head, flags=re.DOTALL)
    if not blocks:
        return None
    code = blocks[-1]
    lines = code.splitlines()
    # The template indents the fence by four spaces; the code itself starts at column 0 after line 1.
    return "\n".join(line.rstrip() for line in lines).strip() + "\n"


def read_pr67(folder: Path) -> Iterator[Solution]:
    """PR-67's answers; the program is the one :func:`engine.answers.extract_program` takes from an answer
    (the rule ``dice generate`` and the evaluation apply to the model's own answers)."""
    import pyarrow.parquet as pq

    from engine.answers import extract_program

    for name in ("sft_dataset_best_4_train.parquet", "sft_dataset_best_4_eval.parquet"):
        for row in pq.read_table(folder / name).to_pylist():
            ref = _extract_reference(row["question"])
            if ref is None:
                continue
            program = extract_program(row["answer"])
            if "ModelNew" not in program:
                program = None  # a reference-only fallback answer: nothing to learn from
            yield Solution(problem_key(row["level"], row["problem"]), "kernelbench-pr67-dsr1", ref, program)


def read_cuda_l1(folder: Path) -> Iterator[Solution]:
    for name in ("h100.json", "a100.json"):
        with open(folder / name, encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                code = row.get("custom_code")
                program = code.strip() + "\n" if code and code != "None" and "ModelNew" in code else None
                yield Solution(
                    problem_key(row["level_id"], row["task_id"]), f"cuda-l1/{name}", row["ref_code"], program
                )


def read_kernelbench(folder: Path) -> Iterator[Solution]:
    with open(folder / "problems.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            yield Solution(problem_key(row["level"], row["problem_id"]), "kernelbench", row["code"], None)


def read_all(data_dir: Path) -> list[Solution]:
    out: list[Solution] = []
    readers = (
        ("kernelbench-pr67-dsr1", read_pr67),
        ("cuda-l1", read_cuda_l1),
        ("kernelbench", read_kernelbench),
    )
    for folder, reader in readers:
        if (data_dir / folder).is_dir():
            out.extend(reader(data_dir / folder))
    if not out:
        raise FileNotFoundError(f"no known data folder under {data_dir}")
    return out
