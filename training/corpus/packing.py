"""Tokenising and packing: chat examples -> token ids (ChatML, ``<|im_end|>\\n``, eos padding to the block
size) -> best-fit packing into block-aligned rows of ``seq_len`` tokens."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from training.corpus.examples import Example


@dataclass(frozen=True)
class ChatSpecials:
    """Token ids of the chat protocol: the response ends with ``<|im_end|>\\n`` and is padded with eos."""

    eos_id: int
    im_end_id: int


def chat_sequence(
    prompt_ids: Sequence[int],
    response_ids: Sequence[int],
    specials: ChatSpecials,
    block_size: int,
    newline_ids: Sequence[int],
) -> tuple[list[int], list[bool]]:
    """ids and loss mask of one example: prompt (no loss) + response + ``<|im_end|>\\n`` + eos padding to a
    multiple of the block size (all with loss), as in DICE (LLaMA-Factory, template qwen3, block_length 4)."""
    response = [*response_ids, specials.im_end_id, *newline_ids]
    ids = [*prompt_ids, *response]
    pad = (-len(ids)) % block_size
    ids += [specials.eos_id] * pad
    loss = [False] * len(prompt_ids) + [True] * (len(response) + pad)
    return ids, loss


def encode_example(
    encode, ex: Example, specials: ChatSpecials, block_size: int, newline_ids: Sequence[int]
) -> tuple[list[int], list[bool]]:
    """:func:`chat_sequence` of one example, prompt and response encoded separately (as the engine encodes
    the prompt alone at inference)."""
    return chat_sequence(encode(ex.prompt), encode(ex.response), specials, block_size, newline_ids)


@dataclass
class PackedRows:
    """Packed training rows, all (N, T): ids, per-document positions, document ids, loss mask."""

    input_ids: Tensor
    position_ids: Tensor
    doc_ids: Tensor
    loss_mask: Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def save(self, path: Path) -> None:
        """``.npz``: compressed, int16 where the values fit (the device transfer is size-limited); any other
        suffix: safetensors."""
        path = Path(path)
        if path.suffix == ".npz":
            import numpy as np

            small = int(self.input_ids.max()) < 2**15 and self.input_ids.shape[1] < 2**15
            dtype = np.int16 if small else np.int32
            np.savez_compressed(
                path,
                input_ids=self.input_ids.numpy().astype(dtype),
                position_ids=self.position_ids.numpy().astype(dtype),
                doc_ids=self.doc_ids.numpy().astype(dtype),
                loss_mask=self.loss_mask.numpy(),
            )
            return
        from safetensors.torch import save_file

        save_file(
            {
                "input_ids": self.input_ids.to(torch.int32).contiguous(),
                "position_ids": self.position_ids.to(torch.int32).contiguous(),
                "doc_ids": self.doc_ids.to(torch.int32).contiguous(),
                "loss_mask": self.loss_mask.to(torch.uint8).contiguous(),
            },
            str(path),
        )

    @classmethod
    def load(cls, path: Path) -> PackedRows:
        path = Path(path)
        if path.suffix == ".npz":
            import numpy as np

            with np.load(path) as z:
                t = {k: torch.from_numpy(z[k]) for k in ("input_ids", "position_ids", "doc_ids", "loss_mask")}
        else:
            from safetensors.torch import load_file

            t = load_file(str(path))
        return cls(
            t["input_ids"].long(), t["position_ids"].long(), t["doc_ids"].long(), t["loss_mask"].bool()
        )


def pack(
    sequences: Sequence[tuple[list[int], list[bool]]], seq_len: int, block_size: int, pad_id: int
) -> tuple[PackedRows, int]:
    """Best-fit-decreasing packing of block-aligned sequences into rows of ``seq_len`` tokens.

    Sequences longer than ``seq_len`` are dropped (DICE's ``truncate_mode: drop``); returns the rows and the
    number dropped. Row tails are eos padding in a document of their own, with no loss.
    """
    if seq_len % block_size:
        raise ValueError(f"seq_len {seq_len} is not a multiple of block size {block_size}")
    keep = [(ids, loss) for ids, loss in sequences if len(ids) <= seq_len]
    dropped = len(sequences) - len(keep)
    for ids, _ in keep:
        if len(ids) % block_size:
            raise ValueError("every sequence must be padded to a multiple of the block size before packing")
    # Best-fit decreasing: each sequence goes to the fullest row it still fits in (free space kept sorted).
    order = sorted(range(len(keep)), key=lambda i: -len(keep[i][0]))
    rows: list[list[int]] = []  # indices into keep
    free: list[tuple[int, int]] = []  # sorted (free tokens, row)
    for i in order:
        n = len(keep[i][0])
        j = bisect.bisect_left(free, (n, -1))
        if j < len(free):
            space, r = free.pop(j)
            rows[r].append(i)
            if space - n:
                bisect.insort(free, (space - n, r))
        else:
            rows.append([i])
            if seq_len - n:
                bisect.insort(free, (seq_len - n, len(rows) - 1))
    n_rows = len(rows)
    input_ids = torch.full((n_rows, seq_len), pad_id, dtype=torch.long)
    position_ids = torch.zeros((n_rows, seq_len), dtype=torch.long)
    doc_ids = torch.zeros((n_rows, seq_len), dtype=torch.long)
    loss_mask = torch.zeros((n_rows, seq_len), dtype=torch.bool)
    for r, members in enumerate(rows):
        pos = 0
        for d, i in enumerate(members):
            ids, loss = keep[i]
            n = len(ids)
            input_ids[r, pos : pos + n] = torch.tensor(ids)
            position_ids[r, pos : pos + n] = torch.arange(n)
            doc_ids[r, pos : pos + n] = d
            loss_mask[r, pos : pos + n] = torch.tensor(loss)
            pos += n
        if pos < seq_len:
            position_ids[r, pos:] = torch.arange(seq_len - pos)
            doc_ids[r, pos:] = len(members)
    return PackedRows(input_ids, position_ids, doc_ids, loss_mask), dropped


def code_sequences(
    texts: Sequence[str], tokenizer, *, seq_len: int, block_size: int
) -> tuple[list[tuple[list[int], list[bool]]], dict]:
    """Plain code as block-diffusion language-model sequences: no prompt, loss on every token.

    A model trained from random init on infill examples alone learns code only from their middles (about 3 %
    of the tokens it reads); these sequences are the pre-training half it otherwise lacks. Each text is cut
    at line ends into chunks whose sequence (chunk, ``<|im_end|>\n``, eos padding) fits ``seq_len``; the
    chunks of a text are its lines in order, so together they are the whole text. A chunk that still does
    not fit (one line longer than a row) is left out and counted.
    """
    specials = ChatSpecials(eos_id=tokenizer.eos_id, im_end_id=tokenizer.im_end_id)
    newline = tokenizer.encode("\n")
    budget = seq_len - 1 - len(newline) - (block_size - 1)
    # Token counts per line (a line encoded alone has about as many tokens as inside the text: the
    # pre-tokenizer splits at line ends) group the lines under 90 % of the budget; each chunk is then
    # encoded whole and checked against the budget.
    chunks: list[str] = []
    for text in texts:
        lines = text.splitlines(keepends=True)
        first = len(chunks)
        current: list[str] = []
        size = 0
        for line, ids in zip(lines, tokenizer.encode_batch(lines), strict=True):
            if current and size + len(ids) > 0.9 * budget:
                chunks.append("".join(current))
                current, size = [], 0
            current.append(line)
            size += len(ids)
        rest = "".join(current)
        if rest.strip():
            chunks.append(rest)
        elif len(chunks) > first:
            chunks[-1] += rest  # trailing blank lines stay with the text's last chunk
    seqs, dropped, tokens = [], 0, 0
    for ids in tokenizer.encode_batch(chunks):
        if len(ids) > budget:
            dropped += 1
            continue
        seqs.append(chat_sequence([], ids, specials, block_size, newline))
        tokens += len(ids)
    return seqs, dict(code_texts=len(texts), code_chunks=len(seqs), code_tokens=tokens, code_dropped=dropped)


def tokenize_and_pack(
    examples: Sequence[Example],
    tokenizer,
    *,
    seq_len: int,
    block_size: int,
    code_texts: Sequence[str] = (),
) -> tuple[PackedRows, dict]:
    """Encode with an ``engine.tokenizer.Tokenizer`` and pack, with ``code_texts`` as plain-code sequences
    (:func:`code_sequences`) beside the examples. Returns rows and counts for the log."""
    specials = ChatSpecials(eos_id=tokenizer.eos_id, im_end_id=tokenizer.im_end_id)
    newline = tokenizer.encode("\n")
    prompts = tokenizer.encode_batch([ex.prompt for ex in examples])
    responses = tokenizer.encode_batch([ex.response for ex in examples])
    seqs = [
        chat_sequence(p, r, specials, block_size, newline) for p, r in zip(prompts, responses, strict=True)
    ]
    code_stats: dict = {}
    if code_texts:
        code, code_stats = code_sequences(code_texts, tokenizer, seq_len=seq_len, block_size=block_size)
        seqs += code
    rows, dropped = pack(seqs, seq_len, block_size, tokenizer.eos_id)
    kept_tokens = sum(len(s[0]) for s in seqs if len(s[0]) <= seq_len)
    stats = {
        **code_stats,
        "examples": len(examples),
        "dropped_longer_than_seq_len": dropped,
        "rows": len(rows),
        "tokens": kept_tokens,
        "answer_tokens": int(rows.loss_mask.sum()),
        "fill": kept_tokens / max(1, len(rows) * seq_len),
    }
    return rows, stats
