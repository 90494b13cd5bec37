"""The user's files through every ``dice`` sub-command: FIFOs, devices and huge files are refused at once
with a message (never read), ``--write`` keeps symlinks, hard links, mode and owner and refuses read-only
files and folders before the model runs, and ``--json`` is strict JSON (``dice.safeio``)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from dice.cli import main

from .conftest import GOOD_SCALE, GOOD_SQUARE, TWO_MASKS, ScriptedEngine

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(os.name != "posix", reason="FIFOs, devices, modes and owners are POSIX")

KB_REF = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(8), torch.randn(8)]


def get_init_inputs():
    return []
"""


def _strict_loads(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def _main_within(seconds: float, argv: list[str], fifo: Path) -> int:
    """``main(argv)``, which must return within ``seconds``; a run still blocked on ``fifo`` then is
    released (a writer opens and closes the FIFO) and the test fails."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["code"] = main(argv)
        except BaseException as exc:  # reported below: main() itself should never raise
            result["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(30)
        pytest.fail(f"dice {' '.join(argv)} was still blocked on the FIFO after {seconds} s")
    assert "error" not in result, result
    return int(result["code"])


FIFO_COMMANDS = {
    "masks": lambda d, fifo: ["masks", str(fifo)],
    "complete": lambda d, fifo: ["complete", str(fifo)],
    "validate .cu": lambda d, fifo: ["validate", str(fifo)],
    "validate candidate": lambda d, fifo: ["validate", str(d / "ref.py"), str(fifo)],
    "validate reference": lambda d, fifo: ["validate", str(fifo), str(d / "ref.py")],
    "validate --compile-commands": lambda d, fifo: [
        "validate",
        str(d / "good.cu"),
        "--compile-commands",
        str(fifo),
    ],
    "generate": lambda d, fifo: ["generate", str(fifo)],
    "eval --problems-file": lambda d, fifo: [
        "eval",
        "kernelbench",
        "--problems-file",
        str(fifo),
        "--generations",
        str(d),
        "--out",
        str(d / "out"),
    ],
    "train pack --examples": lambda d, fifo: [
        "train",
        "pack",
        "--examples",
        str(fifo),
        "--tokenizer",
        str(d),
        "--out",
        str(d / "rows.npz"),
    ],
}


@pytest.mark.parametrize("command", sorted(FIFO_COMMANDS))
def test_a_fifo_argument_is_refused_at_once(command: str, tmp_path: Path, capsys) -> None:
    (tmp_path / "ref.py").write_text(KB_REF)
    (tmp_path / "good.cu").write_text("__global__ void k() {}\n")
    suffix = {"generate": ".py", "validate candidate": ".py", "validate reference": ".py"}.get(command, ".cu")
    fifo = tmp_path / f"pipe{suffix}"
    os.mkfifo(fifo)  # nobody writes to it: a plain open() for reading would block forever
    code = _main_within(20, FIFO_COMMANDS[command](tmp_path, fifo), fifo)
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{fifo}: is a named pipe (FIFO), not a regular file (DICE reads regular files only)" in err
    assert "Traceback" not in err


def _limited_memory() -> None:  # in the child: a regression that reads an endless device dies, not the host
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 * 1024**3, 4 * 1024**3))


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
@pytest.mark.parametrize("command", ["masks", "validate", "generate", "huge masks"])
def test_dev_zero_and_huge_files_are_refused_quickly(command: str, tmp_path: Path) -> None:
    if command == "huge masks":
        path = tmp_path / "huge.cu"
        with path.open("wb") as f:
            f.truncate(3 * 1024**3)  # sparse: no disk used; reading it would take 3 GiB of memory
        expected = f"{path}: the CUDA source is too large: 3 GiB (3221225472 bytes), over the 32 MiB limit"
        command = "masks"
    else:
        path = tmp_path / ("zero.py" if command == "generate" else "zero.cu")
        path.symlink_to("/dev/zero")
        expected = f"{path}: is a character device, not a regular file (DICE reads regular files only)"
    result = subprocess.run(
        [sys.executable, "-m", "dice", command, str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        preexec_fn=_limited_memory,
    )
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr


# ------------------------------------------------------------------------------------------- --write


def _scripted(monkeypatch: pytest.MonkeyPatch, confidence: float = 0.9) -> ScriptedEngine:
    import engine

    scripted = ScriptedEngine(
        lambda p, s, n, t: [(GOOD_SQUARE if "square" not in s else GOOD_SCALE, confidence)]
    )
    monkeypatch.setattr(engine, "load_engine", lambda *a, **k: scripted)
    return scripted


def _complete_write(path: Path, *extra: str) -> int:
    return main(["complete", str(path), "--candidates", "1", "--validation", "none", "--write", *extra])


def _filled(path: Path) -> bool:
    text = path.read_text()
    return GOOD_SCALE in text and GOOD_SQUARE in text and "<MASK" not in text


def test_write_goes_through_a_symlink_and_keeps_it(monkeypatch, tmp_path, capsys) -> None:
    _scripted(monkeypatch)
    real = tmp_path / "project" / "kernel.cu"
    real.parent.mkdir()
    real.write_text(TWO_MASKS)
    real.chmod(0o640)
    link = tmp_path / "kernel.cu"
    link.symlink_to(real)
    assert _complete_write(link) == 0, capsys.readouterr().err
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert _filled(real) and stat.S_IMODE(real.stat().st_mode) == 0o640


def test_write_keeps_hard_links(monkeypatch, tmp_path, capsys) -> None:
    _scripted(monkeypatch)
    path = tmp_path / "kernel.cu"
    path.write_text(TWO_MASKS)
    twin = tmp_path / "twin.cu"
    os.link(path, twin)
    assert _complete_write(path) == 0, capsys.readouterr().err
    assert path.stat().st_nlink == 2 and path.stat().st_ino == twin.stat().st_ino
    assert _filled(twin)


def test_write_keeps_the_mode(monkeypatch, tmp_path, capsys) -> None:
    _scripted(monkeypatch)
    path = tmp_path / "kernel.cu"
    path.write_text(TWO_MASKS)
    path.chmod(0o604)
    assert _complete_write(path) == 0, capsys.readouterr().err
    assert _filled(path) and stat.S_IMODE(path.stat().st_mode) == 0o604
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernel.cu"]  # no temporary file left


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file away")
def test_write_keeps_the_owner(monkeypatch, tmp_path, capsys) -> None:
    _scripted(monkeypatch)
    path = tmp_path / "kernel.cu"
    path.write_text(TWO_MASKS)
    os.chown(path, 12345, 23456)
    assert _complete_write(path) == 0, capsys.readouterr().err
    assert _filled(path) and (path.stat().st_uid, path.stat().st_gid) == (12345, 23456)


def test_write_refuses_a_read_only_file_before_the_model_runs(monkeypatch, tmp_path, capsys) -> None:
    scripted = _scripted(monkeypatch)
    path = tmp_path / "kernel.cu"
    path.write_text(TWO_MASKS)
    path.chmod(0o444)
    code = _complete_write(path)
    err = capsys.readouterr().err
    assert code == 2
    assert f"{path}: is read-only (mode 0444); not writing it (make it writable first)" in err
    assert "Traceback" not in err and scripted.requests == []  # said before any model work
    assert path.read_text() == TWO_MASKS and stat.S_IMODE(path.stat().st_mode) == 0o444


def test_write_refuses_a_folder_it_cannot_write_in(monkeypatch, tmp_path, capsys) -> None:
    scripted = _scripted(monkeypatch)
    folder = tmp_path / "locked"
    folder.mkdir()
    path = folder / "kernel.cu"
    path.write_text(TWO_MASKS)
    folder.chmod(0o555)
    try:
        code = _complete_write(path)
        err = capsys.readouterr().err
        assert code == 2
        assert f"{path}: cannot write in its folder {folder}: the folder is read-only (mode 0555)" in err
        assert "Traceback" not in err and scripted.requests == []
        assert path.read_text() == TWO_MASKS and [p.name for p in folder.iterdir()] == ["kernel.cu"]
    finally:
        folder.chmod(0o755)


def test_generate_refuses_an_out_folder_it_cannot_write_in(monkeypatch, tmp_path, capsys) -> None:
    scripted = _scripted(monkeypatch)
    ref = tmp_path / "ref.py"
    ref.write_text(KB_REF)
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        code = main(["generate", str(ref), "--validation", "none", "--out", str(folder / "new.py")])
        err = capsys.readouterr().err
    finally:
        folder.chmod(0o755)
    assert code == 2 and "cannot write in its folder" in err and "Traceback" not in err
    assert scripted.requests == [] and list(folder.iterdir()) == []


# -------------------------------------------------------------------------------------------- --json


def test_complete_json_is_strict_when_the_model_gives_nan(monkeypatch, tmp_path, capsys) -> None:
    """NaN weights give NaN confidences: ``--json`` must still be JSON that JSON.parse accepts."""
    _scripted(monkeypatch, confidence=math.nan)
    path = tmp_path / "kernel.cu"
    path.write_text(TWO_MASKS)
    code = main(["complete", str(path), "--candidates", "1", "--validation", "none", "--json", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    payload = _strict_loads(out)
    candidates = [c for m in payload["masks"] for c in m["candidates"]]
    assert candidates and all(c["confidence"] is None for c in candidates)
    assert all(c["non_finite"] == {"confidence": "NaN"} for c in candidates)
