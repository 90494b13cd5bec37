"""The held-out split: the KernelBench problems no training pair may touch, and the file that evaluates them.

Every pair in the shared data solves a KernelBench problem, so a number reported by ``dice eval kernelbench``
is honest only on problems the model never trained on. The unit is the problem key ``"L{level}P{id}"``
whatever the version: v0 ``L1P19`` and current ``L1P19`` are the same operator at other sizes, so a held-out
key is held out in both. A pair is set aside when its own key is held out or when its reference matches a
held-out problem of either version (``training.cuke.dedup.contamination``: exact text, near duplicate, same
key), and ``heldout_problems.jsonl`` lists the held-out *current* problems in the problems-file format.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from training.cuke.dedup import Match
from training.cuke.records import Pair

_KEY = re.compile(r"(?:[\w.-]+:)?L(\d+)P(\d+)")


def problem_key(problem_id: str) -> str:
    """``"L1P19"`` or a version-qualified ``"v0:L1P19"`` -> ``"L1P19"``; ValueError for anything else."""
    m = _KEY.fullmatch(problem_id.strip())
    if m is None:
        raise ValueError(
            f"not a KernelBench problem key (L<level>P<id>, optionally <version>:): {problem_id!r}"
        )
    return f"L{int(m.group(1))}P{int(m.group(2))}"


def _key_or_none(text: str | None) -> str | None:
    try:
        return None if text is None else problem_key(text)
    except ValueError:
        return None


def _rank(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()


def holdout_problems(problem_ids: Iterable[str], fraction: float, seed: int) -> set[str]:
    """The held-out problem keys: per level, the ``max(1, round(fraction * n))`` keys (none when fraction
    is 0) of lowest ``sha256(f"{seed}:{key}")``.

    Deterministic (no RNG state, input order and repeats do not matter), stratified (every level gets its
    share, a small level at least one), and stable: a key's rank does not depend on the other keys, so
    adding problems to one level changes at most as many of that level's held-out keys as were added, and
    adding another level changes nothing here. Versions are folded: ``v0:L1P19`` and ``L1P19`` are one key.
    """
    if not 0.0 <= fraction <= 1.0 or math.isnan(fraction):
        raise ValueError(f"the held-out fraction must be in [0, 1], got {fraction}")
    by_level: dict[int, set[str]] = {}
    for pid in problem_ids:
        key = problem_key(pid)
        by_level.setdefault(int(key[1 : key.index("P")]), set()).add(key)
    out: set[str] = set()
    if fraction == 0.0:
        return out
    for keys in by_level.values():
        count = min(len(keys), max(1, math.floor(fraction * len(keys) + 0.5)))
        out.update(sorted(keys, key=lambda k: _rank(seed, k))[:count])
    return out


def split_pairs(
    pairs: Sequence[Pair], heldout: set[str], matches: Mapping[str, Sequence[Match]]
) -> tuple[list[Pair], list[Pair], dict[str, list[str]]]:
    """``(train, heldout_pairs, reasons)``: a pair is held out when its own problem key is held out or its
    reference matches (``matches[pair.id]`` from ``dedup.contamination``) any held-out problem of either
    version; ``reasons[pair.id]`` says which, e.g. ``["problem L1P19 is held out", "reference near
    current:L1P20 (0.91)"]``. Order is kept in both lists."""
    held = {problem_key(h) for h in heldout}
    train: list[Pair] = []
    out: list[Pair] = []
    reasons: dict[str, list[str]] = {}
    for pair in pairs:
        why: list[str] = []
        own = _key_or_none(pair.problem)
        if own in held:
            why.append(f"problem {own} is held out")
        for m in matches.get(pair.id, ()):
            matched = _key_or_none(m.eval_ref)
            if matched in held and matched != own:  # the own key is said once, above
                why.append(f"reference {m.kind} {m.eval_ref} ({m.similarity:.2f})")
        if why:
            out.append(pair)
            reasons[pair.id] = why
        else:
            train.append(pair)
    return train, out, reasons


def heldout_records(heldout: set[str], problems: Iterable[Pair]) -> list[dict[str, object]]:
    """The problems-file records (``level``, ``problem_id``, ``name``, ``code``) of the held-out *current*
    KernelBench problems, by (level, id); v0 problems are in no file ``dice eval`` reads, so they are left
    out, as is a problem seen twice."""
    held = {problem_key(h) for h in heldout}
    records: dict[tuple[int, int], dict[str, object]] = {}
    for p in problems:
        key = _key_or_none(p.problem)
        if p.kb_version != "current" or key is None or key not in held:
            continue
        m = _KEY.fullmatch(key)
        assert m is not None
        level, pid = int(m.group(1)), int(m.group(2))
        record = {
            "level": level,
            "problem_id": pid,
            "name": p.name or f"{pid}_{key}.py",
            "code": p.pytorch_code,
        }
        records.setdefault((level, pid), record)
    return [records[k] for k in sorted(records)]


def write_heldout_problems(path: str | os.PathLike[str], heldout: set[str], problems: Iterable[Pair]) -> int:
    """Write ``heldout_problems.jsonl`` (what ``dice eval kernelbench --problems-file`` reads, checked by
    :func:`dice.validator.kbeval.load_problems` in the tests) atomically: a temporary file beside it,
    then a rename, so a killed build never leaves half a problems file. Returns the number of problems."""
    records = heldout_records(heldout, problems)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            for rec in records:
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return len(records)


__all__ = ["heldout_records", "holdout_problems", "problem_key", "split_pairs", "write_heldout_problems"]
