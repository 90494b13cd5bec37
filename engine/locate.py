"""Which model folder to load: the one rule every front end follows.

An explicit path (``--model``, the editor's ``dice.modelPath``) wins; else ``$DICE_MODEL``; else the embedded
dice-tiny that ships inside the package. :func:`choose_model` says which, and where the choice came from, so
that messages name what the user actually set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from engine.errors import CheckpointError

EMBEDDED_MODEL = Path(__file__).resolve().parent / "models" / "dice-tiny"
MODEL_ENV = "DICE_MODEL"
Origin = Literal["argument", "environment", "embedded"]


@dataclass(frozen=True)
class ModelChoice:
    """The folder to load and how it was chosen."""

    path: Path
    origin: Origin

    @property
    def embedded(self) -> bool:
        return self.origin == "embedded"

    @property
    def user_path(self) -> str | None:
        """The folder the user named (argument or environment), None for the embedded model."""
        return None if self.embedded else str(self.path)

    def describe(self, argument: str = "--model") -> str:
        """Where the model comes from, for messages: ``--model /m``, ``$DICE_MODEL /m``, ``the embedded
        model``; ``argument`` names the explicit setting (``dice.modelPath`` in an editor)."""
        if self.origin == "argument":
            return f"{argument} {self.path}"
        if self.origin == "environment":
            return f"${MODEL_ENV} {self.path}"
        return "the embedded model"

    def problem(self, argument: str = "--model") -> str | None:
        """What is wrong with the folder, said before anything is loaded; None when it looks usable."""
        where = self.describe(argument)
        if self.embedded:
            if not (self.path / "config.json").is_file():
                return (
                    f"the embedded model folder {self.path} is missing or empty; pass a checkpoint path "
                    f"or set {MODEL_ENV} to a DICE/SDAR checkpoint folder"
                )
            return None
        if not self.path.exists():
            return f"{where}: no such folder"
        if not self.path.is_dir():
            return f"{where}: not a folder (a checkpoint is a folder with config.json)"
        if not (self.path / "config.json").is_file():
            return f"{where}: no config.json in it (not a checkpoint folder)"
        return None


def choose_model(path: str | os.PathLike[str] | None = None) -> ModelChoice:
    """``path`` (not empty), else ``$DICE_MODEL`` (not empty), else the embedded model; ``~`` is expanded."""
    if path is not None and str(path) != "":
        return ModelChoice(Path(path).expanduser(), "argument")
    env = os.environ.get(MODEL_ENV)
    if env:
        return ModelChoice(Path(env).expanduser(), "environment")
    return ModelChoice(EMBEDDED_MODEL, "embedded")


def resolve_model_path(path: str | os.PathLike[str] | None) -> Path:
    """The folder :func:`choose_model` picks; ``CheckpointError`` when the embedded model is missing."""
    choice = choose_model(path)
    if choice.embedded:
        problem = choice.problem()
        if problem:
            raise CheckpointError(problem)
    return choice.path
