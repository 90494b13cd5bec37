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
)
# Buffers some exporters write that this model recomputes.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    name = dtype.removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r} (use one of {sorted(_DTYPES)})")
    return _DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder, checked to exist, in index order."""
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: not a valid safetensors index ({exc})") from exc
        names = list(dict.fromkeys(weight_map.values()))
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


class SafetensorsFile:
    """Header-validated, memory-mapped view of one safetensors file.

    Tensors are views into a private (copy-on-write) mapping of the file: nothing is read until used and
    nothing is copied unless a tensor's offset is misaligned for its dtype.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        size = path.stat().st_size
        try:
            with path.open("rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise ValueError(f"{size} bytes, shorter than the 8-byte header length")
                n = int.from_bytes(head, "little")
                if n > min(size - 8, _MAX_HEADER):
                    raise ValueError(f"header length {n} exceeds the file ({size} bytes)")
                header = json.loads(f.read(n))
            if not isinstance(header, dict):
                raise ValueError("header is not a JSON object")
            header.pop("__metadata__", None)
            self._data_start = 8 + n
            self._entries: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {}
            for key, info in header.items():
                dtype = _ST_DTYPES.get(info.get("dtype"))
                if dtype is None:
                    raise ValueError(f"{key}: unsupported dtype {info.get('dtype')!r}")
                shape = tuple(int(d) for d in info["shape"])
                begin, end = (int(o) for o in info["data_offsets"])
                numel = 1
                for d in shape:
                    numel *= d
                if end - begin != numel * dtype.itemsize or begin < 0:
                    raise ValueError(f"{key}: data_offsets {begin}..{end} do not fit shape {shape} {dtype}")
                if self._data_start + end > size:
                    raise ValueError(f"{key} ends at byte {self._data_start + end}, file has {size}")
                self._entries[key] = (dtype, shape, begin, end)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise CheckpointError(
                f"{path}: not a readable safetensors file: truncated or corrupt ({exc})"
            ) from exc
        self._size = size
        self._storage: torch.UntypedStorage | None = None

    def names(self) -> list[str]:
        return list(self._entries)

    def shape(self, key: str) -> tuple[int, ...]:
        return self._entries[key][1]

    def tensor(self, key: str) -> torch.Tensor:
        dtype, shape, begin, end = self._entries[key]
        if self._storage is None:
            self._storage = torch.UntypedStorage.from_file(str(self.path), shared=False, nbytes=self._size)
        offset = self._data_start + begin
        raw = torch.empty(0, dtype=torch.uint8).set_(self._storage, offset, (end - begin,))
        if offset % dtype.itemsize:
            raw = raw.clone()  # misaligned for this dtype: the only case that copies
        return raw.view(dtype).view(shape)


def load_model(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = None,
) -> DiceModel:
    """Load a checkpoint folder. ``dtype`` None keeps the dtype the embedding is stored in."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: checkpoint folder not found")
    config = ModelConfig.from_json(path / "config.json")
    target_dtype = parse_dtype(dtype)
    files = weight_files(path)
    with torch.device("meta"):
        model = DiceModel(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict(keep_vars=True).items()}
    tied = config.tie_word_embeddings
    state: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    for file in files:
        st = SafetensorsFile(file)
        for key in st.names():
            if key.endswith(IGNORED_SUFFIXES) or (tied and key == "lm_head.weight"):
                continue
            if key not in expected:
                unexpected.append(key)
                continue
            if st.shape(key) != expected[key]:
                raise CheckpointError(
                    f"{file.name}: {key} has shape {st.shape(key)}, but config.json implies {expected[key]}"
                )
            state[key] = st.tensor(key)
    if unexpected:
        raise CheckpointError(
            f"{path}: {len(unexpected)} unexpected tensor(s) for this config, e.g. {unexpected[:3]} "
            "(is config.json from a different model?)"
        )
    missing = [k for k in expected if k not in state and not (tied and k == "lm_head.weight")]
    if missing == ["lm_head.weight"]:
        log.warning("%s: no lm_head.weight in the checkpoint; tying it to the input embeddings", path)
        tied = True
        missing = []
    if missing:
        raise CheckpointError(f"{path}: {len(missing)} tensor(s) missing from the checkpoint: {missing[:3]}")
    if target_dtype is None:
        target_dtype = state["model.embed_tokens.weight"].dtype
    # One tensor at a time: the mmap-backed CPU tensor is only copied when dtype or device differ.
    for key in list(state):
        state[key] = state[key].to(device=device, dtype=target_dtype)
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
