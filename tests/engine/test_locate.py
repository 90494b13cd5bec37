"""engine.locate: which model folder is loaded (argument > $DICE_MODEL > embedded), and what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

import engine.locate
from engine.errors import CheckpointError
from engine.locate import EMBEDDED_MODEL, choose_model, resolve_model_path


def test_argument_then_environment_then_embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DICE_MODEL", raising=False)
    assert choose_model(None).path == EMBEDDED_MODEL and choose_model("").embedded
    monkeypatch.setenv("DICE_MODEL", str(tmp_path / "env"))
    assert choose_model(None).origin == "environment" and choose_model(None).path == tmp_path / "env"
    picked = choose_model(tmp_path / "arg")
    assert picked.origin == "argument" and picked.path == tmp_path / "arg"
    assert picked.user_path == str(tmp_path / "arg") and choose_model(None).user_path == str(tmp_path / "env")


def test_problems_name_what_the_user_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DICE_MODEL", raising=False)
    assert choose_model(tmp_path / "nope").problem() == f"--model {tmp_path / 'nope'}: no such folder"
    assert "dice.modelPath" in choose_model(tmp_path / "nope").problem("dice.modelPath")
    (tmp_path / "file").write_text("x")
    assert "not a folder" in choose_model(tmp_path / "file").problem()
    monkeypatch.setenv("DICE_MODEL", str(tmp_path))
    assert (
        choose_model(None).problem()
        == f"$DICE_MODEL {tmp_path}: no config.json in it (not a checkpoint folder)"
    )
    monkeypatch.delenv("DICE_MODEL")
    assert choose_model(None).problem() is None  # the packaged dice-tiny


def test_a_missing_embedded_model_is_a_checkpoint_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DICE_MODEL", raising=False)
    monkeypatch.setattr(engine.locate, "EMBEDDED_MODEL", tmp_path / "gone")
    with pytest.raises(CheckpointError, match="embedded model folder"):
        resolve_model_path(None)
