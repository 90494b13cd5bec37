"""Broken checkpoint folders fail on load with a message naming the file and the field or tensor, before
anything is sized by the config: non-finite or non-float weights, token ids outside the vocabulary, configs
out of bounds, wrong field types, folders where files belong."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import engine.checkpoint as checkpoint
from engine.checkpoint import implied_shapes, load_model, save_model
from engine.engine import load_engine
from engine.errors import CheckpointError, ConfigError
from engine.model import DiceModel, ModelConfig
from engine.testing import tiny_config

UP = "model.layers.0.mlp.up_proj.weight"


@pytest.fixture()
def ckpt(tiny_ckpt: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny checkpoint (float32 weights) that a test may damage."""
    return Path(shutil.copytree(tiny_ckpt, tmp_path / "ckpt"))


def edit_config(folder: Path, **changes: object) -> None:
    data = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(data | changes))


def edit_tensor(folder: Path, key: str, change) -> None:
    weights = folder / "model.safetensors"
    state = load_file(weights)
    state[key] = change(state[key])
    save_file(state, str(weights), metadata={"format": "pt"})


def no_model_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make building the model fail: a check that must come before it then proves it does."""

    def refuse(config: ModelConfig) -> DiceModel:
        raise AssertionError("the model was built before the checkpoint was checked")

    monkeypatch.setattr(checkpoint, "DiceModel", refuse)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights_are_refused_naming_the_file_and_tensor(ckpt: Path, bad: float) -> None:
    edit_tensor(ckpt, UP, lambda t: t.index_put_((torch.tensor([3]), torch.tensor([5])), torch.tensor(bad)))
    with pytest.raises(CheckpointError, match=rf"model\.safetensors: {UP} has 1 NaN or Inf value"):
        load_model(ckpt)
    with pytest.raises(CheckpointError, match="NaN or Inf"):
        load_engine(ckpt, device="cpu")


def test_weights_beyond_float16_range_are_refused_when_loaded_as_float16(ckpt: Path) -> None:
    edit_tensor(ckpt, UP, lambda t: t.index_put_((torch.tensor([0]), torch.tensor([0])), torch.tensor(1e6)))
    assert load_model(ckpt, dtype="float32").model.layers[0].mlp.up_proj.weight[0, 0] == 1e6
    with pytest.raises(CheckpointError, match=rf"{UP}: 1 value\(s\) beyond the range of float16"):
        load_model(ckpt, dtype="float16")


def test_large_finite_weights_whose_sum_overflows_float32_still_load(ckpt: Path) -> None:
    edit_tensor(ckpt, UP, lambda t: torch.full_like(t, 3e38))  # every value finite, the float32 sum is Inf
    assert torch.isfinite(load_model(ckpt).model.layers[0].mlp.up_proj.weight).all()


@pytest.mark.parametrize(
    ("dtype", "name"),
    [(torch.int8, "I8"), (torch.int32, "I32"), (torch.float64, "F64"), (torch.float8_e4m3fn, "F8_E4M3")],
)
def test_non_float_or_unsupported_weight_dtypes_are_refused(
    ckpt: Path, dtype: torch.dtype, name: str
) -> None:
    edit_tensor(ckpt, UP, lambda t: t.to(dtype))
    with pytest.raises(CheckpointError, match=rf"{UP} is stored as {name}; .*floating-point") as info:
        load_model(ckpt)
    assert "truncated or corrupt" not in str(info.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("eos_token_id", 10**6),
        ("eos_token_id", "vocab_size"),  # the first id past the vocabulary
        ("eos_token_id", -3),
        ("eos_token_id", [5, 10**6]),
        ("eos_token_id", True),
        ("mask_token_id", 99_999),
        ("pad_token_id", -1),
        ("bos_token_id", "1"),
    ],
)
def test_token_ids_outside_the_vocabulary_are_refused(ckpt: Path, field: str, value: object) -> None:
    vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
    edit_config(ckpt, **{field: vocab if value == "vocab_size" else value})
    expected = rf"config\.json: {field}(\[1\])? must be a token id in \[0, {vocab}\) \(vocab_size {vocab}\)"
    with pytest.raises(ConfigError, match=expected):
        load_engine(ckpt, device="cpu")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_hidden_layers", 1_000_000),
        ("hidden_size", 1 << 20),
        ("num_attention_heads", 100_000),
        ("num_key_value_heads", 0),
        ("vocab_size", 10**9),
        ("intermediate_size", 1 << 30),
        ("max_position_embeddings", 1 << 40),
        ("head_dim", 1 << 16),
        ("block_size", 1 << 20),
        ("num_hidden_layers", 2.0),
    ],
)
def test_config_sizes_out_of_bounds_fail_at_once(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch, field: str, value: object
) -> None:
    edit_config(ckpt, **{field: value})
    no_model_built(monkeypatch)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=rf"config\.json: {field} must be a positive integer \(at most"):
        load_model(ckpt)
    assert time.perf_counter() - start < 2.0


def test_a_config_that_disagrees_with_the_headers_fails_before_the_model_is_built(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_model_built(monkeypatch)
    edit_config(ckpt, num_hidden_layers=1000)  # within bounds, but the file has 2 layers
    with pytest.raises(CheckpointError, match=r"tensor\(s\) missing from the checkpoint.*model\.layers\.2\."):
        load_model(ckpt)
    edit_config(ckpt, num_hidden_layers=2, intermediate_size=4096)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: .*mlp\..*_proj\.weight has shape"):
        load_model(ckpt)


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("rope_scaling", "linear", "rope_scaling must be an object or null, got 'linear'"),
        ("tie_word_embeddings", "false", "tie_word_embeddings must be true or false"),
        ("attention_bias", 1, "attention_bias must be true or false"),
        ("rms_norm_eps", "abc", r"rms_norm_eps must be a finite number in \(0, 1\)"),
        ("rms_norm_eps", float("nan"), "rms_norm_eps must be a finite number"),
        ("rope_theta", -1.0, "rope_theta must be a finite number"),
        ("architectures", "SDARForCausalLM", "architectures must be a list of names"),
        ("torch_dtype", "int8", "torch_dtype must be one of float32"),
    ],
)
def test_field_types_are_checked_with_the_field_named(
    ckpt: Path, field: str, value: object, expected: str
) -> None:
    edit_config(ckpt, **{field: value})
    with pytest.raises(ConfigError, match=rf"config\.json: {expected}"):
        load_engine(ckpt, device="cpu")


def test_a_head_size_of_zero_is_refused(ckpt: Path) -> None:
    edit_config(ckpt, head_dim=None, hidden_size=3)
    with pytest.raises(
        ConfigError, match=r"hidden_size // num_attention_heads = 0 is not a usable head size"
    ):
        load_model(ckpt)


@pytest.mark.parametrize(
    "name",
    ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", checkpoint.INDEX_FILE],
)
def test_a_folder_where_a_file_belongs_is_named(ckpt: Path, name: str) -> None:
    target = ckpt / name
    if target.exists():
        target.unlink()
    target.mkdir()
    with pytest.raises(CheckpointError, match=rf"{name}: is a folder, not a file"):
        load_engine(ckpt, device="cpu")


def test_a_weight_file_found_by_its_suffix_that_is_a_folder_is_named(ckpt: Path) -> None:
    (ckpt / "model.safetensors").unlink()
    (ckpt / "weights.safetensors").mkdir()
    with pytest.raises(CheckpointError, match=r"weights\.safetensors: is a folder, not a file"):
        load_model(ckpt)


def test_a_header_entry_that_is_not_an_object_is_a_corrupt_file(ckpt: Path) -> None:
    header = json.dumps({"model.norm.weight": "F32"}).encode()
    (ckpt / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors file"):
        load_model(ckpt)


def test_a_tokenizer_larger_than_the_embedding_is_refused(tiny_ckpt: Path, tmp_path: Path) -> None:
    small = DiceModel(tiny_config(320))  # the tiny tokenizer has about 570 tokens
    small.init_weights(seed=0)
    folder = save_model(small, tmp_path / "small", tokenizer_dir=tiny_ckpt)
    with pytest.raises(CheckpointError, match=r"tokenizer has \d+ tokens but config\.json vocab_size is 320"):
        load_engine(folder, device="cpu")


@pytest.mark.parametrize(
    "overrides",
    [{}, {"attention_bias": True}, {"tie_word_embeddings": True}, {"num_key_value_heads": 1, "head_dim": 8}],
)
def test_implied_shapes_are_the_models_parameters(overrides: dict[str, object]) -> None:
    config = tiny_config(128, **overrides)
    with torch.device("meta"):
        model = DiceModel(config)
    built = {k: tuple(v.shape) for k, v in model.state_dict(keep_vars=True).items()}
    assert list(implied_shapes(config).items()) == list(built.items())


def test_the_embedded_model_loads_and_its_weights_are_finite() -> None:
    from engine.locate import EMBEDDED_MODEL

    if not (EMBEDDED_MODEL / "config.json").is_file():
        pytest.skip("the embedded model is not installed")
    model = load_model(EMBEDDED_MODEL)
    assert all(torch.isfinite(p).all() for p in model.parameters())
