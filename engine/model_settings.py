"""Per-model prompting settings: ``dice.json`` beside a model's weights (optional).

``{"infill_holes": "byte" | "line"}`` says how a hole's prompt is cut for the model, so every caller prompts
it the same way: the assistant's fills (``dice.assistant.prompting``), ``dice serve`` and BiC-RL's ``.cu``
rollouts (``training.rl.tasks``). "byte" (the default): the prompt's prefix and suffix meet at the mask
comment. "line": a mask alone on its line(s) is prompted as whole lines (prefix to the line start, suffix
from the next line). ``dice train corpus`` writes the cut its examples were made with; a shipped model may
say the cut it was measured to fill better with (the embedded dice-tiny: trained on whole-line statement
holes, shipped with "byte", ``benchmarks/results/dice_tiny_v3_hole_cut.md``).

``{"identifier_scope": "off" | "prompt"}`` (default "off"): "prompt" masks, while the model fills a hole,
every token that spells a word the prompt does not show (``engine.scope``): the engine's infills and BiC-RL's
``.cu`` rollouts both follow it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

MODEL_SETTINGS_FILE = "dice.json"
HoleCut = Literal["byte", "line"]
HOLE_CUTS: tuple[HoleCut, ...] = ("byte", "line")
IdentifierScopeMode = Literal["off", "prompt"]
IDENTIFIER_SCOPES: tuple[IdentifierScopeMode, ...] = ("off", "prompt")


def _read_settings(model_dir: str | Path | None) -> tuple[Path | None, dict]:
    """The settings object of ``<model_dir>/dice.json`` ({} when there is no folder or no file)."""
    if model_dir is None:
        return None, {}
    path = Path(model_dir) / MODEL_SETTINGS_FILE
    if not path.is_file():
        return path, {}
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON file ({exc})") from exc
    if not isinstance(settings, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(settings).__name__}")
    return path, settings


def read_hole_cut(model_dir: str | Path | None) -> HoleCut:
    """The model's hole cut from ``<model_dir>/dice.json`` (``{"infill_holes": "byte" | "line"}``);
    "byte" when there is no folder, no file or no such key. ValueError for a file that says something else.
    """
    path, settings = _read_settings(model_dir)
    cut = settings.get("infill_holes", "byte")
    if cut not in HOLE_CUTS:
        raise ValueError(f"{path}: infill_holes must be one of {', '.join(HOLE_CUTS)}, got {cut!r}")
    return cut


def read_identifier_scope(model_dir: str | Path | None) -> IdentifierScopeMode:
    """The model's identifier scope for fills (``{"identifier_scope": "off" | "prompt"}``); "off" when
    there is no folder, no file or no such key. ValueError for a file that says something else."""
    path, settings = _read_settings(model_dir)
    mode = settings.get("identifier_scope", "off")
    if mode not in IDENTIFIER_SCOPES:
        raise ValueError(
            f"{path}: identifier_scope must be one of {', '.join(IDENTIFIER_SCOPES)}, got {mode!r}"
        )
    return mode
