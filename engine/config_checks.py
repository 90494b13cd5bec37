"""What a config.json may hold: every field's type and bounds, checked before anything is sized by it.

:func:`config_fields` turns a parsed config.json into the keyword arguments of
:class:`engine.model.ModelConfig`, or raises :class:`~engine.errors.ConfigError` naming the file and the
field. The bounds are far above any released decoder (the largest have ~128 layers, hidden 16384, 256k
vocabularies, 1M positions) and low enough that nothing built from a config (the meta-device model, one
module per layer; rotary tables) can grow for minutes before the weights' headers are compared with it
(:func:`engine.checkpoint.load_model`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from engine.errors import ConfigError, UnsupportedArchitectureError

KNOWN_MODEL_TYPES = frozenset({"sdar", "qwen3"})
KNOWN_ARCHITECTURES = frozenset({"SDARForCausalLM", "SDARModel", "Qwen3ForCausalLM"})
REQUIRED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)
# Upper bounds of the size fields (inclusive).
MAX_SIZES: dict[str, int] = {
    "vocab_size": 1 << 21,
    "hidden_size": 1 << 16,
    "intermediate_size": 1 << 20,
    "num_hidden_layers": 1024,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "head_dim": 1024,
    "max_position_embeddings": 1 << 22,
    "block_size": 4096,
}
# The weight dtypes the engine runs (config.json's torch_dtype, the --dtype option).
FLOAT_DTYPE_NAMES = ("float32", "float", "bfloat16", "float16", "half")
TOKEN_ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "mask_token_id")


def _bad(source: str, name: str, expected: str, value: Any) -> ConfigError:
    return ConfigError(f"{source}: {name} must be {expected}, got {value!r}")


def _size(data: Mapping[str, Any], source: str, name: str, default: int | None = None) -> int:
    value = data.get(name, default)
    if value is None:
        value = default
    limit = MAX_SIZES[name]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= limit:
        raise _bad(source, name, f"a positive integer (at most {limit:,})", value)
    return value


def _number(data: Mapping[str, Any], source: str, name: str, default: float, high: float) -> float:
    value = data.get(name, default)
    if value is None:
        value = default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 < value < high
    ):
        raise _bad(source, name, f"a finite number in (0, {high:g})", value)
    return float(value)


def _flag(data: Mapping[str, Any], source: str, name: str) -> bool:
    value = data.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(source, name, "true or false", value)
    return value


def _token_id(value: Any, source: str, name: str, vocab: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab:
        raise _bad(source, name, f"a token id in [0, {vocab}) (vocab_size {vocab})", value)
    return value


def _token_ids(data: Mapping[str, Any], source: str, vocab: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in TOKEN_ID_FIELDS:
        value = data.get(name)
        if name == "eos_token_id" and isinstance(value, list):
            if not value:
                raise _bad(source, name, "a token id or a non-empty list of them", value)
            out[name] = tuple(_token_id(v, source, f"{name}[{i}]", vocab) for i, v in enumerate(value))
        else:
            out[name] = _token_id(value, source, name, vocab)
    return out


def _architecture(data: Mapping[str, Any], source: str) -> tuple[str | None, tuple[str, ...]]:
    model_type = data.get("model_type")
    if model_type is not None and model_type not in KNOWN_MODEL_TYPES:
        raise UnsupportedArchitectureError(
            f"{source}: model_type {model_type!r} is not supported (this engine runs "
            f"{sorted(KNOWN_MODEL_TYPES)}: SDAR/DICE block-diffusion Qwen3 decoders)"
        )
    architectures = data.get("architectures") or ["SDARForCausalLM"]
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise _bad(source, "architectures", "a list of names", architectures)
    unknown = [a for a in architectures if a not in KNOWN_ARCHITECTURES]
    if unknown:
        raise UnsupportedArchitectureError(
            f"{source}: architecture {unknown[0]!r} is not supported (known: {sorted(KNOWN_ARCHITECTURES)})"
        )
    return model_type, tuple(architectures)


def _unsupported_features(data: Mapping[str, Any], source: str) -> None:
    if data.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{source}: hidden_act {data['hidden_act']!r} is not supported (SwiGLU uses silu)")
    rope_scaling = data.get("rope_scaling")
    if rope_scaling is not None and not isinstance(rope_scaling, Mapping):
        raise _bad(source, "rope_scaling", "an object or null", rope_scaling)
    if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) not in (None, "default"):
        raise ConfigError(f"{source}: rope_scaling {dict(rope_scaling)!r} is not supported (only plain RoPE)")
    if data.get("use_sliding_window"):
        raise ConfigError(f"{source}: use_sliding_window=true is not supported")


def _dtype(data: Mapping[str, Any], source: str) -> str | None:
    name = "torch_dtype" if "torch_dtype" in data else "dtype"
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or value.removeprefix("torch.") not in FLOAT_DTYPE_NAMES:
        raise _bad(
            source, name, "one of " + ", ".join(FLOAT_DTYPE_NAMES) + " (the dtypes the engine runs)", value
        )
    return value


def config_fields(data: Any, source: str, known: frozenset[str]) -> dict[str, Any]:
    """The checked keyword arguments of ``ModelConfig`` for a parsed config.json (``known``: its field
    names; the other keys go to ``extra``). ``source`` names the file in every message."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a JSON object, got {type(data).__name__}")
    model_type, architectures = _architecture(data, source)
    missing = [name for name in REQUIRED_FIELDS if data.get(name) is None]
    if missing:
        raise ConfigError(f"{source}: required field(s) missing: {', '.join(missing)}")
    vocab = _size(data, source, "vocab_size")
    hidden = _size(data, source, "hidden_size")
    heads = _size(data, source, "num_attention_heads")
    kv_heads = _size(data, source, "num_key_value_heads", heads)
    if heads % kv_heads:
        raise ConfigError(
            f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        )
    if data.get("head_dim") is not None:
        head_dim = _size(data, source, "head_dim")
    elif hidden // heads > MAX_SIZES["head_dim"] or hidden < heads:
        raise ConfigError(
            f"{source}: head_dim is not given and hidden_size // num_attention_heads = {hidden // heads} "
            f"is not a usable head size (1 to {MAX_SIZES['head_dim']})"
        )
    else:
        head_dim = hidden // heads
    if head_dim % 2:
        raise ConfigError(f"{source}: head_dim must be even for rotary embeddings, got {head_dim}")
    _unsupported_features(data, source)
    positions = _size(data, source, "max_position_embeddings", 32768)
    block = _size(data, source, "block_size", 4)
    if block > positions:
        raise ConfigError(f"{source}: block_size {block} exceeds max_position_embeddings {positions}")
    return {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": _size(data, source, "intermediate_size"),
        "num_hidden_layers": _size(data, source, "num_hidden_layers"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": _number(data, source, "rms_norm_eps", 1e-6, 1.0),
        "rope_theta": _number(data, source, "rope_theta", 1_000_000.0, math.inf),
        "max_position_embeddings": positions,
        "tie_word_embeddings": _flag(data, source, "tie_word_embeddings"),
        "attention_bias": _flag(data, source, "attention_bias"),
        "block_size": block,
        **_token_ids(data, source, vocab),
        "model_type": model_type or "sdar",
        "architectures": architectures,
        "torch_dtype": _dtype(data, source),
        "extra": {k: v for k, v in data.items() if k not in known and k != "dtype"},
    }
