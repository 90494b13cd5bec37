"""``dice complete`` and ``dice generate`` through the real dispatcher (in process, tiny model on CPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dice.cli import main
from dice.cuda_source import parse_document

from .conftest import BAD_SCALE, GOOD_SCALE, GOOD_SQUARE, TWO_MASKS, ScriptedEngine

CANDIDATE_KEYS = {"rank", "text", "confidence", "tokens", "verdict"}
VERDICT_KEYS = {
    "status",
    "compiled",
    "correct",
    "speedup",
    "ref_ms",
    "new_ms",
    "max_abs_err",
    "message",
    "log",
}

KB_REF = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


def get_inputs():
    return [torch.randn(1024).cuda(), torch.randn(1024).cuda()]


def get_init_inputs():
    return []
"""


@pytest.fixture
def cu_file(tmp_path: Path) -> Path:
    path = tmp_path / "two_masks.cu"
    path.write_bytes(TWO_MASKS.encode())
    return path


def _scripted(monkeypatch: pytest.MonkeyPatch, fills: Any) -> ScriptedEngine:
    import engine

    scripted = ScriptedEngine(fills)
    monkeypatch.setattr(engine, "load_engine", lambda *a, **k: scripted)
    return scripted


def test_complete_prints_a_unified_diff(tiny_checkpoint, shared_pool, cu_file, capsys) -> None:
    code = main(
        [
            "complete",
            str(cu_file),
            "--model",
            str(tiny_checkpoint),
            "--candidates",
            "1",
            "--max-new-tokens",
            "6",
            "--validation",
            "compile",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 1  # the tiny random model's fills never compile: nothing usable came out
    assert out.startswith(f"--- {cu_file}\n+++ {cu_file}\n@@ ")  # tmp_path is absolute
    assert "-    /* <MASK> */" in out and "-    // <MASK:16>" in out
    assert "Model: " in err and "on cpu" in err and "parameters" in err
    assert "No CUDA GPU" not in err  # compile-only validation was asked for: nothing to apologise for
    assert cu_file.read_bytes() == TWO_MASKS.encode()  # a diff never touches the file


def test_complete_json_lists_every_candidate_with_its_verdict(
    tiny_checkpoint, shared_pool, cu_file, capsys
) -> None:
    code = main(
        [
            "complete",
            str(cu_file),
            "--model",
            str(tiny_checkpoint),
            "--candidates",
            "2",
            "--max-new-tokens",
            "6",
            "--validation",
            "compile",
            "--json",
            "--quiet",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 1 and err == ""  # nothing usable (random model)
    payload = json.loads(out)
    assert set(payload) >= {"file", "model", "masks", "best_verdict", "partial", "from_cache", "timings"}
    assert payload["timings"]["total_s"] > 0 and payload["timings"]["steps"] > 0
    assert payload["model"]["device"] == "cpu" and payload["model"]["parameters"] > 0
    expected = [m.to_json() for m in parse_document(TWO_MASKS).masks]
    assert len(payload["masks"]) == 2
    for got, want in zip(payload["masks"], expected, strict=True):
        assert {k: got[k] for k in ("range", "budget", "function", "kind")} == want
        assert 1 <= len(got["candidates"]) <= 2
        for rank, cand in enumerate(got["candidates"]):
            assert set(cand) == CANDIDATE_KEYS and cand["rank"] == rank
            assert isinstance(cand["text"], str) and isinstance(cand["confidence"], float)
            assert set(cand["verdict"]) >= VERDICT_KEYS
            assert cand["verdict"]["status"] in ("compiled", "compile_error")


def test_write_refuses_when_nothing_compiled(monkeypatch, shared_pool, cu_file, capsys) -> None:
    _scripted(monkeypatch, lambda p, s, n, t: [(BAD_SCALE, 0.9)] * n)
    code = main(["complete", str(cu_file), "--candidates", "2", "--validation", "compile", "--write"])
    _, err = capsys.readouterr()
    assert code == 1
    assert "not writing" in err and "--force" in err
    assert cu_file.read_bytes() == TWO_MASKS.encode()  # nothing lost

    code = main(
        [
            "complete",
            str(cu_file),
            "--candidates",
            "1",
            "--validation",
            "compile",
            "--write",
            "--force",
            "--quiet",
        ]
    )
    assert code == 1  # written as asked, and still nothing usable: the exit status says so
    assert BAD_SCALE in cu_file.read_text() and "<MASK" not in cu_file.read_text()


def test_compile_errors_name_the_users_file(monkeypatch, shared_pool, tmp_path, capsys) -> None:
    path = tmp_path / "tiled_matmul.cu"
    path.write_bytes(TWO_MASKS.encode())
    _scripted(monkeypatch, lambda p, s, n, t: [(BAD_SCALE if "square" in s else GOOD_SQUARE, 0.9)] * n)
    code = main(["complete", str(path), "--candidates", "1", "--validation", "compile"])
    _, err = capsys.readouterr()
    assert code == 1  # the scale fill breaks the file: no mask's fill is usable
    assert "tiled_matmul.cu(6): error" in err  # the first error, on the user's file and line
    assert "kernel.cu" not in err

    code = main(["complete", str(path), "--candidates", "1", "--validation", "compile", "--json", "--quiet"])
    out, _ = capsys.readouterr()
    assert code == 1
    log = json.loads(out)["best_verdict"]["log"]
    assert "tiled_matmul.cu(6): error" in log and "kernel.cu" not in log


def test_write_applies_the_best_compiling_fills(monkeypatch, shared_pool, cu_file, capsys) -> None:
    def fills(prefix: str, suffix: str, n: int, t: float) -> list[tuple[str, float]]:
        if "square" in suffix:
            return [(BAD_SCALE, 0.9)] if t == 0.0 else [(GOOD_SCALE, 0.1)] * n
        return [(GOOD_SQUARE, 0.9)] * n

    _scripted(monkeypatch, fills)
    crlf = cu_file.read_bytes().replace(b"\n", b"\r\n")
    cu_file.write_bytes(crlf)
    code = main(["complete", str(cu_file), "--candidates", "2", "--validation", "compile", "--write"])
    _, err = capsys.readouterr()
    assert code == 0, err
    written = cu_file.read_bytes()
    doc = parse_document(crlf.decode())
    m0, m1 = doc.masks
    assert written == (
        crlf[: m0.start_byte]
        + GOOD_SCALE.encode()
        + crlf[m0.end_byte : m1.start_byte]
        + GOOD_SQUARE.encode()
        + crlf[m1.end_byte :]
    )
    assert "Wrote" in err


def test_no_masks_says_so_and_exits_zero(tmp_path, capsys) -> None:
    path = tmp_path / "plain.cu"
    path.write_text("__global__ void k(float* x) { x[0] = 1.0f; }\n")
    code = main(["complete", str(path)])
    out, err = capsys.readouterr()
    assert code == 0 and out == ""
    assert "No masks in" in err


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: d / "missing.cu", "no such file"),
        (lambda d: d, "is a folder"),
        (lambda d: (d / "bin.cu").write_bytes(b"\xff\xfe\x00junk") and d / "bin.cu", "not UTF-8"),
    ],
)
def test_unreadable_input_is_a_clear_error(tmp_path, capsys, setup, message) -> None:
    code = main(["complete", str(setup(tmp_path))])
    _, err = capsys.readouterr()
    assert code != 0 and message in err and "Traceback" not in err


def test_bad_model_path_and_settings_are_clear_errors(tmp_path, cu_file, capsys, monkeypatch) -> None:
    assert main(["complete", str(cu_file), "--model", str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err
    monkeypatch.setenv("DICE_MODEL", str(tmp_path))
    assert main(["complete", str(cu_file)]) == 2
    assert "$DICE_MODEL" in capsys.readouterr().err
    monkeypatch.delenv("DICE_MODEL")
    assert main(["complete", str(cu_file), "--candidates", "0"]) == 2
    assert "candidates must be an integer in [1, 64], got 0" in capsys.readouterr().err


def test_generate_writes_the_best_program_with_its_verdict(tiny_checkpoint, tmp_path, capsys) -> None:
    ref = tmp_path / "add.py"
    ref.write_text(KB_REF)
    out_file = tmp_path / "add_new.py"
    code = main(
        [
            "generate",
            str(ref),
            "--model",
            str(tiny_checkpoint),
            "--samples",
            "2",
            "--max-new-tokens",
            "6",
            "--validation",
            "none",
            "--out",
            str(out_file),
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    payload = json.loads(out)
    assert len(payload["samples"]) in (1, 2)  # identical samples collapse
    best = payload["samples"][0]
    written = out_file.read_text()
    assert written.startswith("# Generated by DICE from add.py with dice-tiny0 (")
    assert "# Verdict: not validated\n" in written
    assert written.endswith(best["source"])
    # refuses to overwrite without --force; refuses a reference that is not KernelBench format
    assert main(["generate", str(ref), "--model", str(tiny_checkpoint), "--out", str(out_file)]) == 2
    assert "exists" in capsys.readouterr().err
    bad = tmp_path / "bad.py"
    bad.write_text("def forward(x):\n    return x\n")
    assert main(["generate", str(bad)]) == 2
    assert "not a KernelBench-format reference" in capsys.readouterr().err
    bad.write_text("class Model(:\n")
    assert main(["generate", str(bad)]) == 2
    assert "syntax error at line 1" in capsys.readouterr().err


def test_without_a_gpu_compile_only_is_said_once(monkeypatch, shared_pool, cu_file, capsys) -> None:
    monkeypatch.setenv("DICE_VALIDATOR_GPU", "0")
    _scripted(monkeypatch, lambda p, s, n, t: [(GOOD_SQUARE if "square" not in s else GOOD_SCALE, 0.5)])
    code = main(["complete", str(cu_file), "--candidates", "1", "--json"])  # default validation: run
    out, err = capsys.readouterr()
    assert code == 0
    assert err.count("No CUDA GPU") == 1
    statuses = [c["verdict"]["status"] for m in json.loads(out)["masks"] for c in m["candidates"]]
    assert statuses == ["compiled", "compiled"]


def test_write_refuses_when_the_file_changed_meanwhile(monkeypatch, shared_pool, cu_file, capsys) -> None:
    def fills(prefix: str, suffix: str, n: int, t: float) -> list[tuple[str, float]]:
        cu_file.write_text(TWO_MASKS + "// the user typed this meanwhile\n")
        return [(GOOD_SQUARE if "square" not in suffix else GOOD_SCALE, 0.5)] * n

    _scripted(monkeypatch, fills)
    code = main(["complete", str(cu_file), "--candidates", "1", "--validation", "compile", "--write"])
    assert code == 1 and "changed on disk" in capsys.readouterr().err
    assert cu_file.read_text().endswith("// the user typed this meanwhile\n")  # their edit survives


def test_write_refuses_when_every_fill_is_blank(monkeypatch, shared_pool, cu_file, capsys) -> None:
    _scripted(monkeypatch, lambda p, s, n, t: [("\n", 0.9)] * n)
    code = main(
        ["complete", str(cu_file), "--candidates", "2", "--validation", "compile", "--write", "--force"]
    )
    err = capsys.readouterr().err
    assert code == 1 and "no usable fill" in err and "every fill was blank or only a comment" in err
    assert cu_file.read_bytes() == TWO_MASKS.encode()


def test_write_keeps_a_crlf_file_crlf(monkeypatch, shared_pool, cu_file, capsys) -> None:
    """A fill of several lines (the model writes ``\\n``) goes into a CRLF file with CRLF line breaks."""
    two_lines = "if (i < n)\n        y[i] = a * x[i];"  # one statement (the hole's shape) on two lines
    _scripted(monkeypatch, lambda p, s, n, t: [(GOOD_SQUARE if "square" not in s else two_lines, 0.9)] * n)
    crlf = cu_file.read_bytes().replace(b"\n", b"\r\n")
    cu_file.write_bytes(crlf)
    code = main(["complete", str(cu_file), "--candidates", "1", "--validation", "compile", "--write"])
    _, err = capsys.readouterr()
    assert code == 0, err
    written = cu_file.read_bytes()
    assert b"if (i < n)\r\n        y[i] = a * x[i];" in written
    assert written.count(b"\n") == written.count(b"\r\n")  # not one bare LF


def test_complete_says_how_many_candidates_were_duplicates(monkeypatch, shared_pool, cu_file, capsys) -> None:
    _scripted(monkeypatch, lambda p, s, n, t: [(GOOD_SQUARE if "square" not in s else GOOD_SCALE, 0.9)] * n)
    code = main(["complete", str(cu_file), "--candidates", "3", "--validation", "compile", "--json"])
    out, err = capsys.readouterr()
    assert code == 0
    # per mask: the greedy fill and two samples, all the same text: two duplicates each
    assert json.loads(out)["timings"]["duplicates"] == 4
    assert "; 4 duplicate candidates dropped)" in err
