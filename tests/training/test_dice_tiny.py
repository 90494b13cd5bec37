"""The shipped dice-tiny: the engine's default model, in budget, self-consistent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DICE_TINY = Path(__file__).resolve().parents[2] / "engine" / "models" / "dice-tiny"


@pytest.fixture(autouse=True)
def _no_model_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DICE_MODEL", raising=False)


def test_the_engine_loads_dice_tiny_when_no_model_is_named() -> None:
    from engine import load_engine

    engine = load_engine(device="cpu")
    assert engine.path.resolve() == DICE_TINY.resolve()
    cfg = engine.config
    assert cfg.model_type == "sdar" and cfg.block_size == 4 and cfg.tie_word_embeddings
    tok = engine.tokenizer
    assert tok.mask_id == cfg.mask_token_id == tok.token_to_id("<|MASK|>")
    assert tok.eos_id == cfg.eos_token_id == tok.token_to_id("<|endoftext|>")
    assert tok.im_end_id is not None and tok.im_start_id is not None
    out = engine.infill("__global__ void k(float* y, int n) {\n    ", "\n}\n", max_new_tokens=8)
    assert isinstance(out[0].text, str)


def test_size_budget_and_model_card() -> None:
    """Issue 21's budget (weights <= 64 MB in the package), and a card that describes these weights: their
    sha256 and parameter count, the held-out sections, the sources and the rebuild command."""
    import hashlib
    import math

    from safetensors import safe_open

    total = sum(p.stat().st_size for p in DICE_TINY.iterdir() if p.is_file())
    assert total <= 64_000_000
    weights = DICE_TINY / "model.safetensors"
    assert weights.stat().st_size <= 64_000_000
    card = (DICE_TINY / "MODEL_CARD.md").read_text()
    for needle in ("Held-out numbers", "Limitations", "scripts/build_dice_tiny.sh", "DICE-8B", "MIT"):
        assert needle in card
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    assert f"sha256 `{digest[:8]}…{digest[-6:]}`" in card
    with safe_open(str(weights), "pt") as f:
        names = f.keys()  # a safe_open handle is not iterable
        params = sum(math.prod(f.get_slice(k).get_shape()) for k in names)
    assert f"{params:,} (embedding" in card
    sft = json.loads((DICE_TINY / "sft_config.json").read_text())  # the resolved training configuration
    stages_file = DICE_TINY / "sft_stages.json"
    if stages_file.exists():  # SFT runs that continued each other: the first from random init
        stages = json.loads(stages_file.read_text())
        first, *later = stages
        assert first["sft_config"]["init_config"] and first["sft_config"]["model"] is None
        assert later
        for st in later:  # each continued from a checkpoint
            assert st["sft_config"]["model"] and st["sft_config"]["init_config"] is None
        assert stages[-1]["sft_config"] == sft
        assert stages[-1]["summary"] == json.loads((DICE_TINY / "summary.json").read_text())
        steps = [st["first_step"] for st in stages]
        assert steps == sorted(steps) and steps[0] == 0
        for st in stages:
            assert f"{st['summary']['steps']:,}" in card  # the card names every stage
    else:
        assert sft["init_config"] and sft["model"] is None  # trained from random initialisation
    if (DICE_TINY / "dice.json").exists():  # the hole cut the model was trained on, read by the assistant
        assert json.loads((DICE_TINY / "dice.json").read_text())["infill_holes"] in ("line", "byte")
