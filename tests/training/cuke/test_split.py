"""CuKe's held-out split: seeded, stratified and stable problem choice; pairs held out by key or by a
reference matching a held-out problem of either version; the held-out problems file that
``dice eval kernelbench --problems-file`` reads."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from dice.validator.kbeval import load_problems
from training.cuke.dedup import Match, contamination, eval_problems_from
from training.cuke.records import Pair
from training.cuke.split import (
    heldout_records,
    holdout_problems,
    problem_key,
    split_pairs,
    write_heldout_problems,
)

KEYS = (
    [f"L1P{i}" for i in range(1, 101)]
    + [f"L2P{i}" for i in range(1, 101)]
    + [f"L3P{i}" for i in range(1, 51)]
)


def _level(key: str) -> int:
    return int(key[1 : key.index("P")])


def test_holdout_is_deterministic_and_seeded() -> None:
    a = holdout_problems(KEYS, 0.1, seed=0)
    assert a == holdout_problems(list(reversed(KEYS)) + KEYS[:10], 0.1, seed=0)  # order and repeats
    assert a != holdout_problems(KEYS, 0.1, seed=1)
    assert holdout_problems(KEYS, 0.0, seed=0) == set()
    assert holdout_problems(KEYS, 1.0, seed=0) == set(KEYS)


def test_holdout_is_stratified_per_level() -> None:
    held = holdout_problems(KEYS, 0.1, seed=3)
    assert Counter(_level(k) for k in held) == {1: 10, 2: 10, 3: 5}
    small = holdout_problems(["L3P1", "L3P2", "L3P3", *KEYS[:100]], 0.1, seed=3)
    assert Counter(_level(k) for k in small) == {1: 10, 3: 1}  # a small level still gets one


def test_holdout_is_stable_when_problems_are_added() -> None:
    base = holdout_problems(KEYS, 0.1, seed=7)
    more_levels = holdout_problems([*KEYS, *(f"L4P{i}" for i in range(1, 21))], 0.1, seed=7)
    assert {k for k in more_levels if _level(k) < 4} == base
    added = [f"L1P{i}" for i in range(101, 106)]
    grown = holdout_problems([*KEYS, *added], 0.1, seed=7)
    level1 = {k for k in base if _level(k) == 1}
    assert len(level1 - grown) <= len(added)  # at most one displaced per added problem
    assert {k for k in grown if _level(k) > 1} == {k for k in base if _level(k) > 1}


def test_versions_are_one_key() -> None:
    assert problem_key("v0:L1P19") == problem_key("current:L1P19") == problem_key("L1P19") == "L1P19"
    assert holdout_problems(["v0:L1P19", "current:L1P19"], 1.0, 0) == {"L1P19"}
    with pytest.raises(ValueError, match="problem key"):
        problem_key("19_ReLU.py")
    with pytest.raises(ValueError, match="fraction"):
        holdout_problems(KEYS, 1.5, 0)


def _pair(
    pid: str, problem: str | None, version: str | None, ref: str = "ref", cuda: str | None = "c"
) -> Pair:
    return Pair(pid, "t", ref, cuda, problem=problem, kb_version=version)


def test_split_by_key_and_by_matching_reference() -> None:
    pairs = [
        _pair("v0-held", "L1P19", "v0"),
        _pair("cur-held", "L1P19", "current"),
        _pair("near-held", "L1P20", "v0"),  # its reference is a near duplicate of current L1P19
        _pair("no-key", None, None),  # an unkeyed reference, exact copy of v0 L1P19
        _pair("train", "L1P21", "v0"),
    ]
    matches = {
        "v0-held": [Match("v0:L1P19", "exact", 1.0)],
        "near-held": [Match("v0:L1P20", "exact", 1.0), Match("current:L1P19", "near", 0.9)],
        "no-key": [Match("v0:L1P19", "exact", 1.0)],
        "train": [Match("v0:L1P21", "exact", 1.0), Match("current:L1P21", "key", 0.5)],
    }
    train, held, reasons = split_pairs(pairs, {"L1P19"}, matches)
    assert [p.id for p in train] == ["train"]
    assert [p.id for p in held] == ["v0-held", "cur-held", "near-held", "no-key"]
    assert reasons["v0-held"] == ["problem L1P19 is held out"]
    assert reasons["near-held"] == ["reference near current:L1P19 (0.90)"]
    assert reasons["no-key"] == ["reference exact v0:L1P19 (1.00)"]


def test_heldout_problems_file_loads_in_kbeval(tmp_path: Path) -> None:
    problems = [
        Pair(f"kb:L{lv}P{i}", "kernelbench", f"# problem {lv}/{i}\n", None, f"L{lv}P{i}", "current", lv,
             f"{i}_Op.py") for lv in (2, 1) for i in (3, 1, 2)
    ]  # fmt: skip
    problems.append(_pair("v0-only", "L1P7", "v0", ref="# v0 7\n", cuda=None))
    problems.append(problems[0])  # a repeat is written once
    count = write_heldout_problems(
        tmp_path / "out" / "heldout_problems.jsonl", {"L1P1", "L2P3", "L1P7"}, problems
    )
    loaded = load_problems(tmp_path / "out" / "heldout_problems.jsonl")
    assert count == 2 and [(p.level, p.problem_id, p.name) for p in loaded] == [
        (1, 1, "1_Op.py"),
        (2, 3, "3_Op.py"),
    ]
    assert loaded[1].code == "# problem 2/3\n"
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["heldout_problems.jsonl"]  # no temporary left
    unnamed = Pair("x", "kernelbench", "code", None, "L3P4", "current", 3)
    assert heldout_records({"L3P4"}, [unnamed])[0]["name"] == "4_L3P4.py"


def test_split_on_the_shared_data(shared_data: Path, tmp_path: Path) -> None:
    """The whole chain on the real sources: no training pair touches a held-out problem of either version,
    and the held-out file holds exactly the held-out current problems of levels 1-3."""
    if not (shared_data / "cuda-l1").is_dir() or not (shared_data / "kernelbench").is_dir():
        pytest.skip("cuda-l1 or kernelbench is absent from the shared data")
    from tests.training.cuke.test_dedup import _shared_pairs

    pairs, problems = _shared_pairs(shared_data)
    evals = eval_problems_from([*problems, *pairs])
    held = holdout_problems([e.problem for e in evals if e.problem], 0.1, seed=0)
    assert len(held) == 25
    matches = contamination(pairs, evals)
    train, out, reasons = split_pairs(pairs, held, matches)
    assert len(train) + len(out) == len(pairs) and set(reasons) == {p.id for p in out}
    assert all(p.problem not in held for p in train)
    assert all(problem_key(m.eval_ref) not in held for p in train for m in matches[p.id])
    assert sum(p.problem in held for p in out) >= 2 * 20  # both GPUs' records of the held-out problems
    path = tmp_path / "heldout_problems.jsonl"
    assert write_heldout_problems(path, held, problems) == 25
    loaded = load_problems(path)
    assert {f"L{p.level}P{p.problem_id}" for p in loaded} == held
    assert all(json.loads(line)["code"] for line in path.read_text().splitlines())
