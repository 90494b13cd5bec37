"""`dice masks FILE [--json]`: the JSON contract of docs/CONTRACTS.md, the table, and user errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dice.cli import main

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def run_masks(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["masks", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_for_softmax_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_masks(capsys, str(EXAMPLES / "softmax_rows.cu"), "--json")
    assert code == 0, err
    assert json.loads(out) == [
        {
            "range": {"start": {"line": 56, "character": 4}, "end": {"line": 56, "character": 19}},
            "budget": 96,
            "function": "softmax_rows",
            "kind": "global",
        },
        {
            "range": {"start": {"line": 76, "character": 4}, "end": {"line": 76, "character": 19}},
            "budget": 64,
            "function": "softmax_rows",
            "kind": "global",
        },
    ]
    lines = (EXAMPLES / "softmax_rows.cu").read_text().splitlines()
    assert lines[56][4:19] == "/* <MASK:96> */" and lines[76][4:19] == "/* <MASK:64> */"


def test_json_utf16_columns_and_masks_outside_functions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "k.cu"
    path.write_bytes(
        "/* 😀 */ // <MASK:5>\r\n__device__ float f() {\r\n\t/* é */ /* <MASK> */\r\n}\r\n".encode()
    )
    code, out, _ = run_masks(capsys, str(path), "--json")
    assert code == 0
    assert json.loads(out) == [
        {
            "range": {"start": {"line": 0, "character": 9}, "end": {"line": 0, "character": 20}},
            "budget": 5,
            "function": None,
            "kind": None,
        },
        {
            "range": {"start": {"line": 2, "character": 9}, "end": {"line": 2, "character": 21}},
            "budget": None,
            "function": "f",
            "kind": "device",
        },
    ]


def test_no_masks_is_an_empty_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plain.cu"
    path.write_text('__global__ void k() { const char* s = "/* <MASK> */"; }\n')
    assert run_masks(capsys, str(path), "--json") == (0, "[]\n", "")
    code, out, _ = run_masks(capsys, str(path))
    assert code == 0 and "no masks" in out


def test_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_masks(capsys, str(EXAMPLES / "tiled_matmul.cu"))
    assert code == 0
    assert "1 mask" in out and "tiled_matmul" in out and "40:13" in out and "128" in out
    assert "dice-spec: none" in out


@pytest.mark.parametrize("problem", ["missing", "folder", "binary"])
def test_user_errors(problem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k.cu"
    if problem == "folder":
        path.mkdir()
    elif problem == "binary":
        path.write_bytes(b"__global__ void k() {}\n\xff\xfe\x00junk")
    code, out, err = run_masks(capsys, str(path), "--json")
    assert code == 2
    assert out == ""
    expected = {"missing": "no such file", "folder": "is a folder", "binary": "not UTF-8 text (byte 23"}[
        problem
    ]
    assert f"dice: error: {path}: {expected}" in err
    assert "Traceback" not in err


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k.cu"
    path.write_text("/* <MASK> */")
    path.chmod(0)
    code, _, err = run_masks(capsys, str(path))
    assert code == 2 and "cannot read it" in err


def test_console_entry_point_in_a_subprocess() -> None:
    command = [sys.executable, "-m", "dice", "masks", str(EXAMPLES / "vector_add.cu"), "--json"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    (mask,) = json.loads(result.stdout)
    assert mask["function"] == "vector_add" and mask["kind"] == "global" and mask["budget"] is None


def test_non_cuda_files_are_refused(tmp_path, capsys) -> None:
    """A Markdown file's ``/* <MASK> */`` is prose, not a hole."""
    from dice.cli import main

    notes = tmp_path / "notes.md"
    notes.write_text("Write `/* <MASK> */` where the model should fill in.\n")
    assert main(["masks", str(notes)]) == 2
    assert "not a CUDA or C++ source file" in capsys.readouterr().err
    assert main(["complete", str(notes)]) == 2
    header = tmp_path / "k.cuh"
    header.write_text("__device__ float f(float x) { /* <MASK> */ }\n")
    assert main(["masks", str(header), "--json"]) == 0


def test_malformed_masks_are_warned_about(tmp_path, capsys) -> None:
    from dice.cli import main

    path = tmp_path / "k.cu"
    path.write_text("__global__ void k(float* y) {\n    /* <MASK:0> */\n    // <MASK:abc>\n}\n")
    assert main(["masks", str(path)]) == 0
    out = capsys.readouterr().out
    assert "no masks" in out and out.count("is not a mask") == 2 and f"{path}:2:5" in out
