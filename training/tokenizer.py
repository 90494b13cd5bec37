"""Train the small byte-level BPE tokenizer of dice-tiny with Hugging Face ``tokenizers``.

A 151k Qwen vocabulary would make the embedding alone ~4x the size budget of the embedded model; a BPE of a
few thousand merges trained on CUDA/PyTorch text keeps the model small and its sequences short. The special
tokens follow the SDAR/Qwen names (``<|endoftext|>`` eos and pad, ChatML ``<|im_start|>``/``<|im_end|>``,
``<|MASK|>``); the mask id the model uses is written to config.json as ``mask_token_id``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>")


def train_bpe(texts: Iterable[str], vocab_size: int, out_dir: str | Path) -> dict[str, int]:
    """Train, save ``tokenizer.json`` + ``tokenizer_config.json`` in ``out_dir``; return the special ids.

    ``vocab_size`` counts the special tokens, which come after the learned vocabulary as in Qwen2. The
    pre-tokenizer is the engine's Qwen2 split + byte-level mapping, so the engine loads it unchanged.
    """
    from engine.tokenizer import train_byte_level_bpe

    if vocab_size < 512:
        raise ValueError(f"vocab_size {vocab_size} is too small for a byte-level BPE (256 bytes + merges)")
    tok = train_byte_level_bpe(texts, vocab_size - len(SPECIAL_TOKENS), SPECIAL_TOKENS)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "mask_token": "<|MASK|>",
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return ids


def read_text_chunks(path: str | Path, lines_per_chunk: int = 2000) -> Iterable[str]:
    """Stream a large text file in pieces of whole lines (pieces never split a word)."""
    with open(path, encoding="utf-8") as fh:
        chunk: list[str] = []
        for line in fh:
            chunk.append(line)
            if len(chunk) >= lines_per_chunk:
                yield "".join(chunk)
                chunk = []
        if chunk:
            yield "".join(chunk)


def write_model_config(template: str | Path, tokenizer_dir: str | Path, out: str | Path) -> dict:
    """Fill a config.json template with the tokenizer's vocabulary size (padded to 64) and special ids."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    config = json.loads(Path(template).read_text(encoding="utf-8"))
    vocab = tok.get_vocab_size(with_added_tokens=True)
    config["vocab_size"] = -(-vocab // 64) * 64
    config["mask_token_id"] = tok.token_to_id("<|MASK|>")
    config["eos_token_id"] = tok.token_to_id("<|endoftext|>")
    config["pad_token_id"] = tok.token_to_id("<|endoftext|>")
    Path(out).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return config
