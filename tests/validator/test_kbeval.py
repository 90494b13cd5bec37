"""KernelBench evaluation: metrics, program extraction, and a resumable run over saved generations."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dice.cli import main
from dice.validator.kbeval import parse_int_set, pass_at_k, read_records, summarize
from engine.answers import extract_program

from .conftest import RELU_REF, candidate


@pytest.mark.parametrize(
    ("n", "c", "k"), [(1, 0, 1), (1, 1, 1), (10, 3, 1), (10, 3, 5), (5, 2, 5), (20, 0, 10)]
)
def test_pass_at_k_matches_the_closed_form(n: int, c: int, k: int) -> None:
    expected = 1.0 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_rejects_k_above_n() -> None:
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def record(pid: int, sample: int, status: str, speedup: float | None = None) -> dict:
    v = {"status": status, "compiled": status != "compile_error", "speedup": speedup}
    return {"level": 1, "problem_id": pid, "sample": sample, "verdict": v}


def test_summary_metrics_are_per_problem_averages() -> None:
    recs = [
        record(1, 0, "correct", 3.0),
        record(1, 1, "incorrect"),
        record(2, 0, "correct", 0.5),
        record(2, 1, "correct", 1.5),
        record(3, 0, "compile_error"),
        record(3, 1, "compile_error"),
    ]
    s = summarize(recs, ks=(1, 2))["level1"]
    assert s["problems"] == 3 and s["samples"] == 6
    assert s["compiled"] == pytest.approx(100 * (1 + 1 + 0) / 3)
    assert s["exec"] == pytest.approx(100 * (0.5 + 1.0 + 0) / 3)
    assert s["fast_1"] == pytest.approx(100 * (0.5 + 0.5 + 0) / 3)
    assert s["fast_2"] == pytest.approx(100 * (0.5 + 0 + 0) / 3)
    assert s["pass@2"] == pytest.approx(100 * (1 + 1 + 0) / 3)
    assert s["geomean_speedup"] == pytest.approx((3.0 * 0.5 * 1.5) ** (1 / 3))


def test_extract_program_prefers_the_block_with_model_new() -> None:
    text = "intro\n```python\nprint(1)\n```\nthen\n```python\nclass ModelNew: pass\n```\n```bash\nls\n```"
    assert extract_program(text) == "class ModelNew: pass\n"
    assert extract_program("class ModelNew: pass") == "class ModelNew: pass\n"  # the whole text, one newline


def test_parse_int_set() -> None:
    assert parse_int_set("1-3", "--level") == [1, 2, 3]
    assert parse_int_set("5,1-2", "--problems") == [1, 2, 5]
    with pytest.raises(ValueError, match="--level"):
        parse_int_set("one", "--level")


def test_eval_over_saved_generations_is_resumable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DICE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DICE_VALIDATOR_GPU", "0")
    problems = tmp_path / "problems.jsonl"
    rows = [{"level": 1, "problem_id": i, "name": f"{i}_relu.py", "code": RELU_REF} for i in (1, 2, 3)]
    problems.write_text("".join(json.dumps(r) + "\n" for r in rows))
    gens = tmp_path / "gens"
    for pid, k, text in [
        (1, 0, candidate("level1_19_relu.py")),
        (1, 1, candidate("adv_pure_torch.py")),
        (2, 0, "class ModelNew(:\n"),
    ]:
        path = gens / "level1" / str(pid) / f"sample_{k}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    out = tmp_path / "out"
    args = [
        "eval",
        "kernelbench",
        "--level",
        "1",
        "--problems",
        "1-3",
        "--samples",
        "2",
        "--generations",
        str(gens),
        "--problems-file",
        str(problems),
        "--out",
        str(out),
        "--json",
    ]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    recs = read_records(out / "verdicts.jsonl")
    by_key = {(r["problem_id"], r["sample"]): r["verdict"]["status"] for r in recs}
    assert by_key == {
        (1, 0): "compiled",
        (1, 1): "rejected",
        (2, 0): "compile_error",
        (2, 1): "compile_error",
        (3, 0): "compile_error",
        (3, 1): "compile_error",
    }
    assert summary["all"]["compiled"] == pytest.approx(100 * 0.5 / 3)
    assert summary["all"]["pass@2"] == 0.0 and summary["all"]["exec"] == 0.0
    assert (out / "speedups.png").stat().st_size > 1000 and (out / "summary.json").is_file()

    # a second run validates nothing new; an interrupted last line is ignored
    with (out / "verdicts.jsonl").open("a") as f:
        f.write('{"level": 1, "problem_id"')
    assert main(args) == 0
    assert len(read_records(out / "verdicts.jsonl")) == 6
    assert "0 to validate" in capsys.readouterr().err


def test_eval_with_a_model_saves_its_generations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.testing import make_tiny_checkpoint

    monkeypatch.setenv("DICE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DICE_VALIDATOR_GPU", "0")
    model = make_tiny_checkpoint(tmp_path / "tiny")
    problems = tmp_path / "problems.jsonl"
    problems.write_text(
        json.dumps({"level": 2, "problem_id": 7, "name": "7_relu.py", "code": RELU_REF}) + "\n"
    )
    out = tmp_path / "out"
    args = [
        "eval",
        "kernelbench",
        "--level",
        "2",
        "--samples",
        "2",
        "--temperature",
        "1.0",
        "--max-new-tokens",
        "8",
        "--model",
        str(model),
        "--device",
        "cpu",
        "--problems-file",
        str(problems),
        "--out",
        str(out),
    ]
    assert main(args) == 0
    for k in (0, 1):
        assert (out / "generations" / "level2" / "7" / f"sample_{k}.py").is_file()
        assert (out / "generations" / "level2" / "7" / f"sample_{k}.txt").is_file()
    recs = read_records(out / "verdicts.jsonl")
    assert sorted(r["sample"] for r in recs) == [0, 1]
    # a random tiny model writes no ModelNew: an honest failure, never "correct"
    assert all(r["verdict"]["status"] in ("compile_error", "rejected") for r in recs)
    capsys.readouterr()
    assert (
        main(
            [
                *args[:-6],
                "--model",
                str(tmp_path / "nope"),
                "--device",
                "cpu",
                "--problems-file",
                str(problems),
                "--out",
                str(tmp_path / "out2"),
            ]
        )
        == 2
    )
    assert "cannot load the model" in capsys.readouterr().err


def test_problems_file_found_through_shared_data_and_ancestors(tmp_path, monkeypatch) -> None:
    from dice.validator.kbeval import PROBLEMS_ENV, find_problems_file

    monkeypatch.delenv(PROBLEMS_ENV, raising=False)
    data = tmp_path / "elsewhere" / "kernelbench"
    data.mkdir(parents=True)
    (data / "problems.jsonl").write_text("{}\n")
    monkeypatch.setenv("DICE_SHARED_DATA", str(tmp_path / "elsewhere"))
    assert find_problems_file() == data / "problems.jsonl"

    monkeypatch.delenv("DICE_SHARED_DATA")
    project = tmp_path / "proj"
    nested = project / "a" / "b"
    nested.mkdir(parents=True)
    shared = project / "shared" / "data" / "kernelbench"
    shared.mkdir(parents=True)
    (shared / "problems.jsonl").write_text("{}\n")
    monkeypatch.chdir(nested)
    found = find_problems_file()
    # the checkout's own ../shared wins when it exists (it is looked at first); else the ancestor's
    assert found.is_file() and found.name == "problems.jsonl"
    if not (Path(__file__).resolve().parents[2].parent / "shared" / "data" / "kernelbench").is_dir():
        assert found == shared / "problems.jsonl"
