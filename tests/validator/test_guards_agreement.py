"""The static guards against the agreement benchmark: none of the 716 kernels the GPU run judged correct is
rejected, and every other recorded verdict keeps its first static guard (what the verdict reports)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

from dice.validator.guards import STATIC_GUARDS, analyze_candidate, static_guards

_GUARD = re.compile(r"rejected by guard (\w+):")


def _tasks(root: Path, data: Path) -> list[dict[str, Any]]:
    spec = importlib.util.spec_from_file_location(
        "validator_agreement", root / "benchmarks/validator_agreement.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tasks, _ = module.load_tasks(argparse.Namespace(tasks=None, data=str(data)))
    return tasks


def _first_guard(src: str) -> str | None:
    try:
        hits = static_guards(src, analyze_candidate(src))
    except SyntaxError:
        return "syntax"
    return hits[0].guard if hits else None


def test_no_kernel_judged_correct_is_rejected(repo_root: Path, shared_data: Path) -> None:
    results = repo_root / "benchmarks/results/validator_agreement.jsonl"
    recorded = {(r["source"], r["id"]): r["verdict"] for r in map(json.loads, results.open(encoding="utf-8"))}
    tasks = _tasks(repo_root, shared_data)
    assert len(tasks) == len(recorded)

    correct = [t for t in tasks if recorded[(t["source"], t["id"])]["status"] == "correct"]
    rejected = [(t["id"], g) for t in correct if (g := _first_guard(t["cand_src"]))]
    assert len(correct) == 716
    assert rejected == []

    changed = []
    for task in tasks:
        verdict = recorded[(task["source"], task["id"])]
        if verdict["status"] == "correct":
            continue
        match = _GUARD.search(verdict.get("message") or "")
        before = match.group(1) if match else None
        now = _first_guard(task["cand_src"])
        static = before in STATIC_GUARDS and not verdict.get("compiled")  # not a dynamic guard's (built)
        static_before = before if static else None
        if now not in (static_before, "syntax"):
            changed.append((task["source"], task["id"], verdict["status"], before, now))
    assert changed == []
