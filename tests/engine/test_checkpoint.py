"""Checkpoint saving/loading: formats, dtypes, memory mapping and every corrupt-checkpoint error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from engine.checkpoint import INDEX_FILE, load_model, save_model
from engine.errors import CheckpointError, ConfigError, UnsupportedArchitectureError
from engine.model import DiceModel
from engine.testing import make_tiny_checkpoint, tiny_config

IDS = torch.tensor([[5, 17, 42, 8, 99, 3, 250, 11, 7]])


def logits(model: DiceModel) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).float()


@pytest.fixture()
def ckpt(tiny_ckpt: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny checkpoint that a test may damage."""
    return Path(shutil.copytree(tiny_ckpt, tmp_path / "ckpt"))


def test_tiny_checkpoint_is_deterministic_and_in_the_release_format(tiny_ckpt, tmp_path):
    again = make_tiny_checkpoint(tmp_path / "again")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (again / name).read_bytes() == (tiny_ckpt / name).read_bytes(), name
    config = json.loads((tiny_ckpt / "config.json").read_text())
    assert config["model_type"] == "sdar" and config["architectures"] == ["SDARForCausalLM"]
    assert config["block_size"] == 4 and config["torch_dtype"] == "float32"
    other = make_tiny_checkpoint(tmp_path / "seed1", seed=1)
    assert (other / "model.safetensors").read_bytes() != (tiny_ckpt / "model.safetensors").read_bytes()


def test_sharded_and_single_file_give_identical_logits(tiny_ckpt, tmp_path):
    model = load_model(tiny_ckpt)
    sharded = save_model(model, tmp_path / "sharded", tokenizer_dir=tiny_ckpt, max_shard_bytes=40_000)
    index = json.loads((sharded / INDEX_FILE).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and all((sharded / s).is_file() for s in shards)
    assert not (sharded / "model.safetensors").exists()
    assert (sharded / "tokenizer.json").is_file()
    assert torch.equal(logits(load_model(sharded)), logits(model))


def test_dtypes_and_memory_mapping(tiny_ckpt, tmp_path):
    model = load_model(tiny_ckpt)
    w = model.model.embed_tokens.weight
    # Stored dtype on CPU: parameters are views of the file mapping, not copies.
    assert w.untyped_storage().nbytes() == (tiny_ckpt / "model.safetensors").stat().st_size
    bf16 = load_model(tiny_ckpt, dtype="bfloat16")
    assert bf16.lm_head.weight.dtype == torch.bfloat16
    assert torch.equal(bf16.lm_head.weight, model.lm_head.weight.bfloat16())
    assert (logits(bf16).argmax(-1) == logits(model).argmax(-1)).float().mean() > 0.7
    half_dir = save_model(model, tmp_path / "fp16", dtype=torch.float16)
    assert json.loads((half_dir / "config.json").read_text())["torch_dtype"] == "float16"
    half = load_model(half_dir)
    assert half.lm_head.weight.dtype == torch.float16
    assert load_model(half_dir, dtype=torch.float32).lm_head.weight.dtype == torch.float32


def test_tied_and_missing_head(tmp_path, caplog):
    torch.manual_seed(0)
    tied = DiceModel(tiny_config(300, tie_word_embeddings=True))
    tied.init_weights(seed=0)
    out = save_model(tied, tmp_path / "tied")
    back = load_model(out)
    assert back.lm_head.weight is back.model.embed_tokens.weight
    assert torch.equal(logits(back), logits(tied))
    # An untied config whose checkpoint lacks lm_head.weight: tie, with a warning.
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": False}))
    with caplog.at_level("WARNING"):
        again = load_model(out)
    assert "tying" in caplog.text
    assert torch.equal(logits(again), logits(tied))


def test_missing_shard(tiny_ckpt, tmp_path):
    sharded = save_model(load_model(tiny_ckpt), tmp_path / "s", max_shard_bytes=40_000)
    second = sorted(sharded.glob("model-*.safetensors"))[1]
    second.unlink()
    with pytest.raises(CheckpointError, match=f"shard {second.name} .* is missing"):
        load_model(sharded)


def test_truncated_and_corrupt_files(ckpt):
    weights = ckpt / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_model(ckpt)
    weights.write_bytes(data[:5])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_model(ckpt)
    weights.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}" + data[24:])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_model(ckpt)


def test_shape_mismatch(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps(config | {"intermediate_size": 96}))
    with pytest.raises(CheckpointError, match=r"mlp\..*_proj.weight has shape .* config.json implies"):
        load_model(ckpt)


def test_key_mismatch(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 3}))
    with pytest.raises(CheckpointError, match=r"missing from the checkpoint.*model\.layers\.2\."):
        load_model(ckpt)
    (ckpt / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 1}))
    with pytest.raises(CheckpointError, match=r"unexpected tensor.*model\.layers\.1\."):
        load_model(ckpt)


def test_unknown_architecture_and_missing_config_field(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(
        json.dumps(config | {"model_type": "llada", "architectures": ["LLaDAModel"]})
    )
    with pytest.raises(UnsupportedArchitectureError, match="llada"):
        load_model(ckpt)
    del config["vocab_size"]
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="vocab_size"):
        load_model(ckpt)


def test_missing_pieces(ckpt, tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_model(tmp_path / "nothing-here")
    (ckpt / "model.safetensors").rename(ckpt / "weights.bin")
    with pytest.raises(CheckpointError, match=r"pickle weights"):
        load_model(ckpt)
    (ckpt / "config.json").unlink()
    with pytest.raises(ConfigError, match="config.json not found"):
        load_model(ckpt)
