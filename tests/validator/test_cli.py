"""``dice validate`` and ``dice eval kernelbench`` exit codes and messages (compile-only: no GPU here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dice.cli import main

from .conftest import RELU_REF, candidate


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DICE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cli-cache"))
    monkeypatch.setenv("DICE_VALIDATOR_GPU", "0")


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_validate_cu_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cu = write(tmp_path, "ok.cu", "__global__ void k(float* x) { x[threadIdx.x] = 1.f; }\n")
    assert main(["validate", str(cu), "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["status"] == "compiled" and verdict["compiled"] is True


def test_validate_cu_compile_error_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cu = write(tmp_path, "bad.cu", "\n\n__global__ void k(float* x) { x[0] = nope; }\n")
    assert main(["validate", str(cu)]) == 1
    out = capsys.readouterr().out
    assert "compile_error" in out and "bad.cu(3): error" in out


def test_validate_kernelbench_compile_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref = write(tmp_path, "ref.py", RELU_REF)
    cand = write(tmp_path, "cand.py", candidate("level1_19_relu.py"))
    assert main(["validate", str(ref), str(cand), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "compiled"


def test_candidate_syntax_error_is_a_failed_candidate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref = write(tmp_path, "ref.py", RELU_REF)
    cand = write(tmp_path, "cand.py", "class ModelNew(:\n")
    assert main(["validate", str(ref), str(cand), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["status"] == "compile_error"


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (["missing.cu"], "missing.cu: no such file"),
        (["ref.py"], "expected a .cu/.cuh file"),
        (["ref.py", "missing.py"], "missing.py: no such file"),
        (["noModel.py", "cand.py"], "does not define Model"),
        (["syntax.py", "cand.py"], "syntax error at line 1"),
        (["a.cu", "b.cu", "c.cu"], "expected FILE.cu, or REF.py CANDIDATE.py"),
    ],
)
def test_bad_input_exit_2(
    files: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "ref.py", RELU_REF)
    write(tmp_path, "cand.py", candidate("level1_19_relu.py"))
    write(
        tmp_path, "noModel.py", "def get_inputs():\n    return []\n\ndef get_init_inputs():\n    return []\n"
    )
    write(tmp_path, "syntax.py", "class Model(:\n")
    assert main(["validate", *[str(tmp_path / f) for f in files]]) == 2
    assert message in capsys.readouterr().err


def test_eval_reports_missing_problems_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "eval",
            "kernelbench",
            "--problems-file",
            str(tmp_path / "none.jsonl"),
            "--generations",
            str(tmp_path),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 2 and "no such problems file" in capsys.readouterr().err
