"""Tokenizer of a checkpoint folder (Qwen2 byte-level BPE) over the `tokenizers` library.

Reads ``tokenizer.json`` when present, otherwise builds the Qwen2 tokenizer from ``vocab.json`` +
``merges.txt`` and the added tokens of ``tokenizer_config.json`` (or ``added_tokens.json``), reproducing the
ids transformers gives for the SDAR release. Special ids come from the files, never from the folder name.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as _Backend

from engine.errors import CheckpointError

# The Qwen2 pre-tokenizer split (from its tokenizer.json); byte-level mapping is applied after it.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
MASK_NAMES = ("<|MASK|>", "<MASK>", "<|mask|>")
TOKENIZER_FILE_NAMES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)


class Tokenizer:
    """encode/decode plus the ids the engine and prompts need (eos, pad, mask, ChatML)."""

    def __init__(
        self,
        backend: _Backend,
        *,
        eos_id: int,
        pad_id: int,
        mask_id: int,
        im_start_id: int | None,
        im_end_id: int | None,
    ) -> None:
        self.backend = backend
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.mask_id = mask_id
        self.im_start_id = im_start_id
        self.im_end_id = im_end_id

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``; special-token strings in it (``<|im_start|>``...) map to their ids."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def stop_ids(self) -> list[int]:
        """Ids that end a chat answer: ``<|im_end|>`` and eos."""
        return [i for i in dict.fromkeys([self.im_end_id, self.eos_id]) if i is not None]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read tokenizer file ({exc})") from exc


def _token_name(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _added_tokens(folder: Path, tok_config: dict) -> list[tuple[int, str, bool]]:
    """(id, content, special) in id order; tokenizer_config.json wins over added_tokens.json."""
    decoder = tok_config.get("added_tokens_decoder")
    if decoder:
        return sorted((int(i), v["content"], bool(v.get("special", True))) for i, v in decoder.items())
    if (folder / "added_tokens.json").is_file():
        return sorted((int(i), t, True) for t, i in _read_json(folder / "added_tokens.json").items())
    return []


def qwen2_byte_level(bpe: models.BPE) -> _Backend:
    """A tokenizer around ``bpe`` with Qwen2's pipeline: NFC, the Qwen2 split, byte-level mapping."""
    backend = _Backend(bpe)
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return backend


def train_byte_level_bpe(
    texts: Iterable[str], learned_vocab_size: int, special_tokens: Sequence[str]
) -> _Backend:
    """Train a Qwen2-style byte-level BPE of ``learned_vocab_size`` tokens on ``texts``; the special tokens
    come after the learned vocabulary, as in Qwen2 (the engine loads the saved tokenizer.json unchanged)."""
    backend = qwen2_byte_level(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    trainer = trainers.BpeTrainer(
        vocab_size=learned_vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    backend.train_from_iterator(texts, trainer=trainer)
    backend.add_special_tokens(list(special_tokens))
    return backend


def _build_from_vocab(folder: Path, tok_config: dict) -> _Backend:
    vocab = _read_json(folder / "vocab.json")
    merges = []
    for line in (folder / "merges.txt").read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise CheckpointError(f"{folder / 'merges.txt'}: bad merge line {line!r}")
        merges.append((parts[0], parts[1]))
    backend = qwen2_byte_level(
        models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False)
    )
    for token_id, content, special in _added_tokens(folder, tok_config):
        token = AddedToken(content, special=special, normalized=False)
        got = backend.add_special_tokens([token]) if special else backend.add_tokens([token])
        actual = backend.token_to_id(content)
        if actual != token_id:
            raise CheckpointError(
                f"{folder}: added token {content!r} got id {actual}, files say {token_id} (added={got})"
            )
    return backend


def load_tokenizer(path: str | Path, *, mask_id: int | None = None) -> Tokenizer:
    """Load the tokenizer of a checkpoint folder; ``mask_id`` (from config.json) overrides the files."""
    folder = Path(path)
    if folder.is_file():
        folder = folder.parent
    for name in TOKENIZER_FILE_NAMES:
        if (folder / name).exists() and not (folder / name).is_file():
            raise CheckpointError(f"{folder / name}: is a folder, not a file")
    tok_config_path = folder / "tokenizer_config.json"
    tok_config = _read_json(tok_config_path) if tok_config_path.is_file() else {}
    if not isinstance(tok_config, dict):
        raise CheckpointError(f"{tok_config_path}: expected a JSON object, got {type(tok_config).__name__}")
    if (folder / "tokenizer.json").is_file():
        try:
            backend = _Backend.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises a plain Exception for malformed files
            raise CheckpointError(f"{folder / 'tokenizer.json'}: cannot load ({exc})") from exc
    elif (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        backend = _build_from_vocab(folder, tok_config)
    else:
        raise CheckpointError(f"{folder}: no tokenizer (tokenizer.json, or vocab.json + merges.txt)")

    def lookup(*names: str | None) -> int | None:
        for name in names:
            if name is not None and backend.token_to_id(name) is not None:
                return backend.token_to_id(name)
        return None

    eos = lookup(_token_name(tok_config.get("eos_token")), "<|endoftext|>")
    pad = lookup(_token_name(tok_config.get("pad_token"))) if tok_config.get("pad_token") else eos
    if mask_id is None:
        mask_id = lookup(_token_name(tok_config.get("mask_token")), *MASK_NAMES)
    if eos is None:
        raise CheckpointError(f"{folder}: tokenizer has no eos token (<|endoftext|> or eos_token)")
    if mask_id is None:
        raise CheckpointError(f"{folder}: no mask token id (config.json mask_token_id, or a <|MASK|> token)")
    return Tokenizer(
        backend,
        eos_id=eos,
        pad_id=pad if pad is not None else eos,
        mask_id=mask_id,
        im_start_id=lookup("<|im_start|>"),
        im_end_id=lookup("<|im_end|>"),
    )
