"""Save and load SDAR/DICE checkpoints: config.json + safetensors (single file or shards with an index).

Loading builds the model on the meta device and assigns tensors that are views of a memory map of each
file, converted one tensor at a time, so a checkpoint never sits in RAM twice (on CPU in its stored dtype
it is not copied at all). Headers are validated first, so truncated files fail before any weight is read.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.config_checks import FLOAT_DTYPE_NAMES
from engine.errors import CheckpointError
from engine.model import DiceModel, ModelConfig

log = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.json",
    "merges.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "generation_config.json",
    "chat_template.jinja",
    "dice.json",  # engine.model_settings: how the model's infilling prompts are cut
)
# Buffers some exporters write that this model recomputes.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

# what config.json's torch_dtype may say (engine.config_checks), as torch dtypes ("half" is float16 ...)
_DTYPES = {name: getattr(torch, name) for name in FLOAT_DTYPE_NAMES}


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    name = dtype.removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r} (use one of {sorted(_DTYPES)})")
    return _DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _not_a_file(path: Path) -> CheckpointError | None:
    """The error for a checkpoint file that exists but is a folder (or another non-file), else None."""
    if path.exists() and not path.is_file():
        return CheckpointError(f"{path}: is a folder, not a file")
    return None


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder, checked to exist, in index order."""
    index = path / INDEX_FILE
    for name in (INDEX_FILE, SINGLE_FILE):
        problem = _not_a_file(path / name)
        if problem is not None:
            raise problem
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = list(dict.fromkeys(weight_map.values()))
        except (
            OSError,
            json.JSONDecodeError,
            UnicodeDecodeError,
            KeyError,
            TypeError,
            AttributeError,
        ) as exc:
            raise CheckpointError(f"{index}: not a valid safetensors index ({exc})") from exc
        if not all(isinstance(n, str) and n and Path(n).name == n for n in names):
            raise CheckpointError(f"{index}: weight_map values must be file names in the folder")
        for name in names:
            problem = _not_a_file(path / name)
            if problem is not None:
                raise CheckpointError(f"{problem} (listed in {INDEX_FILE})")
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise CheckpointError(
                f"{path}: shard {missing[0]} listed in {INDEX_FILE} is missing"
                + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            )
        return [path / n for n in names]
    if (path / SINGLE_FILE).is_file():
        return [path / SINGLE_FILE]
    found = sorted(path.glob("*.safetensors"))
    for candidate in found:
        problem = _not_a_file(candidate)
        if problem is not None:
            raise problem
    if len(found) == 1:
        return found
    if found:
        raise CheckpointError(f"{path}: {len(found)} safetensors files but no {INDEX_FILE} to join them")
    if any(path.glob("*.bin")) or any(path.glob("*.pt")):
        raise CheckpointError(f"{path}: only pickle weights (*.bin/*.pt) found; convert them to safetensors")
    raise CheckpointError(f"{path}: no model weights ({SINGLE_FILE} or {INDEX_FILE}) found")


_ST_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_MAX_HEADER = 100 * 1024 * 1024


# The weight dtypes the engine loads (floating point, as it computes); other dtypes are read from headers
# only to say what they are.
LOADABLE_DTYPES = frozenset(_DTYPES.values())


class SafetensorsFile:
    """Header-validated, memory-mapped view of one safetensors file.

    The constructor reads the header only. Tensors are views into a private (copy-on-write) mapping of the
    file: nothing is read until used and nothing is copied unless a tensor's offset is misaligned for its
    dtype. A dtype this module does not know (``F8_E4M3`` ...) is kept by name (:meth:`dtype_name`): the
    loader says which tensor has it instead of calling the file corrupt.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            size = path.stat().st_size
            with path.open("rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise ValueError(f"{size} bytes, shorter than the 8-byte header length")
                n = int.from_bytes(head, "little")
                if n > min(size - 8, _MAX_HEADER):
                    raise ValueError(f"header length {n} exceeds the file ({size} bytes)")
                header = json.loads(f.read(n))
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot read ({exc.strerror or exc})") from exc
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointError(
                f"{path}: not a readable safetensors file: truncated or corrupt ({exc})"
            ) from exc
        self._data_start = 8 + n
        try:
            self._parse(header, size)
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(
                f"{path}: not a readable safetensors file: truncated or corrupt ({exc})"
            ) from exc
        self._size = size
        self._storage: torch.UntypedStorage | None = None

    def _parse(self, header: object, size: int) -> None:
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
        header.pop("__metadata__", None)
        self._entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        for key, info in header.items():
            if not isinstance(info, dict):
                raise ValueError(f"{key}: entry is not a JSON object")
            name = info.get("dtype")
            if not isinstance(name, str):
                raise ValueError(f"{key}: dtype {name!r} is not a name")
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(o) for o in info["data_offsets"])
            if begin < 0 or end < begin or any(d < 0 for d in shape):
                raise ValueError(f"{key}: data_offsets {begin}..{end} or shape {shape} are negative")
            dtype = _ST_DTYPES.get(name)
            numel = 1
            for d in shape:
                numel *= d
            if dtype is not None and end - begin != numel * dtype.itemsize:
                raise ValueError(f"{key}: data_offsets {begin}..{end} do not fit shape {shape} {dtype}")
            if self._data_start + end > size:
                raise ValueError(f"{key} ends at byte {self._data_start + end}, file has {size}")
            self._entries[key] = (name, shape, begin, end)

    def names(self) -> list[str]:
        return list(self._entries)

    def shape(self, key: str) -> tuple[int, ...]:
        return self._entries[key][1]

    def dtype_name(self, key: str) -> str:
        """The dtype as the header spells it (``BF16``, ``F32``, ``I8``, ``F8_E4M3`` ...)."""
        return self._entries[key][0]

    def dtype(self, key: str) -> torch.dtype | None:
        """The torch dtype of ``key``, None for a dtype this module does not read."""
        return _ST_DTYPES.get(self._entries[key][0])

    def tensor(self, key: str) -> torch.Tensor:
        name, shape, begin, end = self._entries[key]
        dtype = _ST_DTYPES.get(name)
        if dtype is None:
            raise CheckpointError(f"{self.path}: {key} has dtype {name}, which this engine cannot read")
        if self._storage is None:
            self._storage = torch.UntypedStorage.from_file(str(self.path), shared=False, nbytes=self._size)
        offset = self._data_start + begin
        raw = torch.empty(0, dtype=torch.uint8).set_(self._storage, offset, (end - begin,))
        if offset % dtype.itemsize:
            raw = raw.clone()  # misaligned for this dtype: the only case that copies
        return raw.view(dtype).view(shape)


def implied_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The parameter shapes ``config`` implies, by checkpoint key, in ``DiceModel.state_dict`` order, worked
    out without building the model (``lm_head.weight`` is listed even when tied)."""
    d, hd = config.hidden_size, config.head_dim
    q, kv, inter = config.num_attention_heads * hd, config.num_key_value_heads * hd, config.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, d)}
    for i in range(config.num_hidden_layers):
        layer = f"model.layers.{i}."
        for name, shape in (("q_proj", (q, d)), ("k_proj", (kv, d)), ("v_proj", (kv, d)), ("o_proj", (d, q))):
            shapes[f"{layer}self_attn.{name}.weight"] = shape
            if config.attention_bias:
                shapes[f"{layer}self_attn.{name}.bias"] = (shape[0],)
        shapes[f"{layer}self_attn.q_norm.weight"] = (hd,)
        shapes[f"{layer}self_attn.k_norm.weight"] = (hd,)
        shapes[f"{layer}mlp.gate_proj.weight"] = (inter, d)
        shapes[f"{layer}mlp.up_proj.weight"] = (inter, d)
        shapes[f"{layer}mlp.down_proj.weight"] = (d, inter)
        shapes[f"{layer}input_layernorm.weight"] = (d,)
        shapes[f"{layer}post_attention_layernorm.weight"] = (d,)
    shapes["model.norm.weight"] = (d,)
    shapes["lm_head.weight"] = (config.vocab_size, d)
    return shapes


def match_headers(
    path: Path, config: ModelConfig, files: list[SafetensorsFile]
) -> tuple[dict[str, SafetensorsFile], bool]:
    """Which file holds each tensor the config implies, from the headers alone (no weight is read): every
    key, shape and dtype is checked against the config. Returns the sources and whether the head is tied
    (a checkpoint without ``lm_head.weight`` is tied, with a warning)."""
    expected = implied_shapes(config)
    tied = config.tie_word_embeddings
    sources: dict[str, SafetensorsFile] = {}
    unexpected: list[str] = []
    for st in files:
        for key in st.names():
            if key.endswith(IGNORED_SUFFIXES) or (tied and key == "lm_head.weight"):
                continue
            if key not in expected:
                unexpected.append(key)
                continue
            if key in sources:
                raise CheckpointError(f"{st.path}: {key} is also in {sources[key].path.name}")
            if st.shape(key) != expected[key]:
                raise CheckpointError(
                    f"{st.path}: {key} has shape {st.shape(key)}, but config.json implies {expected[key]}"
                )
            if st.dtype(key) not in LOADABLE_DTYPES:
                raise CheckpointError(
                    f"{st.path}: {key} is stored as {st.dtype_name(key)}; this engine loads floating-point "
                    "weights only (F32, BF16, F16): dequantize or convert the checkpoint first"
                )
            sources[key] = st
    if unexpected:
        raise CheckpointError(
            f"{path}: {len(unexpected)} unexpected tensor(s) for this config, e.g. {unexpected[:3]} "
            "(is config.json from a different model?)"
        )
    missing = [k for k in expected if k not in sources and not (tied and k == "lm_head.weight")]
    if missing == ["lm_head.weight"]:
        log.warning("%s: no lm_head.weight in the checkpoint; tying it to the input embeddings", path)
        tied = True
        missing = []
    if missing:
        raise CheckpointError(f"{path}: {len(missing)} tensor(s) missing from the checkpoint: {missing[:3]}")
    return sources, tied


def check_finite(state: dict[str, torch.Tensor], sources: dict[str, SafetensorsFile]) -> None:
    """CheckpointError naming the file and tensor when a loaded weight holds NaN or Inf.

    Fast on purpose (it runs on every load): one float32 sum per tensor, all compared at once (one device
    sync on CUDA). A sum is finite when every element is, and NaN/Inf when any is; finite values whose sum
    overflows float32 (beyond 3e38) also give Inf, so a tensor is only condemned by the exact
    ``torch.isfinite`` count that follows. Checked after the dtype conversion: float32 weights beyond
    float16's range become Inf in a float16 model, and that is said too.
    """
    keys = list(state)
    if not keys:
        return
    sums = torch.stack([state[k].sum(dtype=torch.float32) for k in keys])
    for key, ok in zip(keys, torch.isfinite(sums).tolist(), strict=True):
        if ok:
            continue
        tensor = state[key]
        bad = tensor.numel() - int(torch.isfinite(tensor).sum())
        if bad == 0:
            continue  # finite values whose float32 sum overflowed
        st = sources[key]
        stored = st.tensor(key)
        if stored.dtype != tensor.dtype and bool(torch.isfinite(stored).all()):
            raise CheckpointError(
                f"{st.path}: {key}: {bad} value(s) beyond the range of {dtype_name(tensor.dtype)} become Inf "
                f"when converted from {dtype_name(stored.dtype)}; load it in bfloat16 or float32"
            )
        raise CheckpointError(
            f"{st.path}: {key} has {bad} NaN or Inf value(s) of {tensor.numel()} "
            "(a diverged or corrupt checkpoint)"
        )


def load_model(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = None,
) -> DiceModel:
    """Load a checkpoint folder. ``dtype`` None keeps the dtype the embedding is stored in.

    Order: config.json (every field's type and bounds), the safetensors headers against the shapes and
    dtypes the config implies, then the model (on the meta device) and the weights, checked finite."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: checkpoint folder not found")
    config = ModelConfig.from_json(path / "config.json")
    target_dtype = parse_dtype(dtype)
    files = [SafetensorsFile(f) for f in weight_files(path)]
    sources, tied = match_headers(path, config, files)
    with torch.device("meta"):
        model = DiceModel(config)
    built = {k: tuple(v.shape) for k, v in model.state_dict(keep_vars=True).items()}
    if built != implied_shapes(config):  # implied_shapes must follow DiceModel: an engine bug otherwise
        raise RuntimeError("engine.checkpoint.implied_shapes disagrees with DiceModel's parameters")
    if target_dtype is None:
        target_dtype = sources["model.embed_tokens.weight"].dtype("model.embed_tokens.weight")
    # One tensor at a time: the mmap-backed CPU tensor is only copied when dtype or device differ.
    state = {key: st.tensor(key).to(device=device, dtype=target_dtype) for key, st in sources.items()}
    check_finite(state, sources)
    if tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    if tied:
        model.tie_weights()
    return model.eval()


def save_model(
    model: DiceModel,
    out_dir: str | Path,
    *,
    tokenizer_dir: str | Path | None = None,
    dtype: str | torch.dtype | None = None,
    max_shard_bytes: int | None = None,
) -> Path:
    """Write config.json and safetensors weights (sharded with an index above ``max_shard_bytes``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = parse_dtype(dtype)
    config = model.config
    state: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if config.tie_word_embeddings and key == "lm_head.weight":
            continue
        tensor = value.detach().to(device="cpu", dtype=target or value.dtype).contiguous()
        if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
            tensor = (
                tensor.clone()
            )  # a view into a larger buffer (fused projections): safetensors needs its own
        state[key] = tensor
    stored_dtype = target or model.model.embed_tokens.weight.dtype

    for stale in [*out.glob("model*.safetensors"), out / INDEX_FILE]:
        stale.unlink(missing_ok=True)
    sizes = {k: t.numel() * t.element_size() for k, t in state.items()}
    total = sum(sizes.values())
    if max_shard_bytes is None or total <= max_shard_bytes:
        save_file(state, str(out / SINGLE_FILE), metadata={"format": "pt"})
    else:
        shards: list[list[str]] = [[]]
        used = 0
        for key in state:
            if shards[-1] and used + sizes[key] > max_shard_bytes:
                shards.append([])
                used = 0
            shards[-1].append(key)
            used += sizes[key]
        weight_map = {}
        for i, keys in enumerate(shards, start=1):
            name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file({k: state[k] for k in keys}, str(out / name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(keys, name))
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")

    data = config.to_dict()
    data["torch_dtype"] = dtype_name(stored_dtype)
    (out / "config.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if tokenizer_dir is not None:
        src = Path(tokenizer_dir)
        for name in TOKENIZER_FILES:
            if (src / name).is_file() and (src / name).resolve() != (out / name).resolve():
                shutil.copyfile(src / name, out / name)
    return out
